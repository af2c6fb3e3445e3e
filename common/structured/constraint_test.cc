// The constraint compilers (JSON schema, regex, choice) against hand-checked strings, their
// refusals, and the vocabulary layer's masks against the matcher token by token. The
// independent oracles (python3-jsonschema, Python's re) check real generations in
// tests/e2e/test_structured_outputs.py.
#include <string>
#include <vector>

#include "common/base/strings.h"
#include "common/structured/constraint.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/grammar_parser.h"
#include "common/structured/regex_grammar.h"
#include "common/structured/token_constraint.h"
#include "gtest/gtest.h"

namespace pdserve::structured {
namespace {

using Kind = OutputConstraint::Kind;

bool Matches(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.Advance(s) && m.CanEnd();
}

std::shared_ptr<const Grammar> Compile(Kind kind, std::string value, std::vector<std::string> choices = {}) {
  auto g = CompileConstraint({kind, std::move(value), std::move(choices)});
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

std::string ErrorOf(Kind kind, std::string value) {
  auto g = CompileConstraint({kind, std::move(value), {}});
  return g.ok() ? "" : std::string(g.status().message());
}

struct Case {
  std::string value;
  std::vector<std::string> match, refuse;
};

TEST(RegexGrammarTest, FullMatchesAsPythonDoes) {
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"ab", "abcd", ""}},
      {"^a|b$", {"a", "b"}, {"ab", ""}},
      {"[a-c]+x?", {"a", "cabx", "bbb"}, {"x", "ad", ""}},
      {"\\d{3}-\\d{2,}", {"123-45", "000-123456"}, {"12-34", "123-4", "abc-12"}},
      {"(?:ab){2}|(?P<n>c)*", {"abab", "", "ccc"}, {"ab", "abc"}},
      {"[^a-z\\d]{1,2}", {"A", "_!"}, {"a", "5", "ABC", ""}},
      {"\\w+@\\w+\\.com", {"a_1@b.com"}, {"a@b.org", "@b.com"}},
      {"x.y", {"x-y", "x\xc3\xa9y"}, {"x\ny", "xy"}},
      {"a{,2}b{2}c{1,}", {"bbc", "aabbcc"}, {"aaabbc", "abc"}},
      {"\\.\\*\\u00e9\\x41", {".*\xc3\xa9" "A"}, {"a*\xc3\xa9" "A"}},
      {"a{x}", {"a{x}"}, {"a"}},  // Not a quantifier: literal, as Python reads it.
      {"(a|bc)*?d+?", {"abcad", "d", "dd"}, {"", "ab"}},
      {"[-a\\]]", {"-", "a", "]"}, {"b"}},
  };
  for (const Case& c : cases) {
    const auto g = Compile(Kind::kRegex, c.value);
    ASSERT_NE(g, nullptr) << c.value;
    for (const std::string& s : c.match) EXPECT_TRUE(Matches(g, s)) << c.value << " should match '" << s << "'";
    for (const std::string& s : c.refuse) EXPECT_FALSE(Matches(g, s)) << c.value << " should refuse '" << s << "'";
  }
}

TEST(RegexGrammarTest, RefusesWhatIsNotRegularWithTheConstructNamed) {
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {"(a)\\1", "backreferences are not supported at offset 3"},
      {"a(?=b)", "lookarounds"},
      {"(?i)a", "lookarounds, inline flags"},
      {"\\bword", "word boundaries"},
      {"a^b", "'^' is supported only at the start"},
      {"a$b", "'$' is supported only at the end"},
      {"*a", "nothing to repeat at offset 0"},
      {"a{3,2}", "maximum is below its minimum"},
      {"a++", "possessive"},
      {"(ab", "missing ')'"},
      {"ab)", "unbalanced ')'"},
      {"[ab", "unterminated character class"},
      {"[z-a]", "out of order"},
      {"\\q", "unknown escape \\q"},
      {"a\\", "trailing backslash"},
      {"[^\\x00-\\U0010FFFF]", "matches nothing"},
  };
  for (const auto& [pattern, message] : refusals) {
    const std::string e = ErrorOf(Kind::kRegex, pattern);
    EXPECT_NE(e.find("regex: "), std::string::npos) << pattern << ": " << e;
    EXPECT_NE(e.find(message), std::string::npos) << pattern << ": " << e;
  }
}

TEST(RegexGrammarTest, InsideAJsonStringQuotesAndBackslashesAreEscaped) {
  RegexOptions json;
  json.json_string = true;
  auto expr = RegexToGrammar("a\"b\\\\c[^x]", json);
  ASSERT_TRUE(expr.ok()) << expr.status();
  auto g = ParseGrammar("root ::= " + *expr);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Matches(*g, "a\\\"b\\\\cy"));  // The JSON text of a"b\cy.
  EXPECT_FALSE(Matches(*g, "a\"b\\\\cy"));   // A bare quote would end the string.
  EXPECT_FALSE(Matches(*g, "a\\\"b\\\\c\""));  // [^x] leaves out what JSON escapes.
  EXPECT_FALSE(Matches(*g, "a\\\"b\\\\c\n"));
}

TEST(JsonSchemaTest, CompactJsonThatValidates) {
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})",
       {R"({"name":"Ann","age":31})", R"({"name":"","age":-4})"},
       {R"({"age":31,"name":"Ann"})", R"({"name":"Ann"})", R"({"name":"Ann","age":3.5})",
        R"({ "name":"Ann","age":31})", R"({"name":"Ann","age":31,"x":1})"}},
      // Optional properties in order, any subset.
      {R"({"properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"number"}},"required":["b"]})",
       {R"({"b":null})", R"({"a":true,"b":null})", R"({"b":null,"c":-1.5e3})", R"({"a":false,"b":null,"c":0})"},
       {"{}", R"({"a":true})", R"({"b":null,"a":true})", R"({"b":null,})"}},
      {R"({"properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})",
       {R"({})", R"({"a":1,"z":"q"})", R"({"z":"q","y":""})"},
       {R"({"z":1})"}},
      {R"({"type":"object"})", {R"({})", R"({"k":[1,{"x":null}],"j":"s"})"}, {R"([])"}},
      {R"({"enum":["red",1,null,{"a":[true]}]})", {R"("red")", "1", "null", R"({"a":[true]})"}, {R"("blue")", "2"}},
      {R"({"const":"x\"y"})", {R"("x\"y")"}, {R"("xy")"}},
      {R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
       {"[1]", "[1,2,3]"}, {"[]", "[1,2,3,4]", "[1,]"}},
      {R"({"type":"array","items":{"type":"string"}})", {"[]", R"(["a","b"])"}, {"[1]"}},
      {R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false})",
       {"[]", "[1]", R"([1,"a"])"}, {R"([1,"a",2])", R"(["a"])"}},
      {R"({"type":"array","prefixItems":[{"type":"integer"}],"items":{"type":"boolean"},"minItems":2})",
       {"[1,true]", "[1,true,false]"}, {"[1]", "[]"}},
      {R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})", {"5", R"("ab")"}, {R"("abc")", "true"}},
      {R"({"type":["string","null"],"minLength":2})", {R"("ab")", "null"}, {R"("a")"}},
      {R"({"type":"string","nullable":true})", {R"("a")", "null"}, {"1"}},
      {R"({"type":"string","pattern":"^[A-Z]{2}-\\d+$"})", {R"("AB-12")"}, {R"("ab-12")", R"("AB-")"}},
      {R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"}},
      {R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123")"}},
      {R"({"type":"string"})", {R"("a\nb\u00e9\"")", "\"\xc3\xa9\""}, {"\"a\nb\"", R"("\x")"}},
      {R"({"type":"number"})", {"0", "-0.5", "1e9", "12.25E-3"}, {"01", ".5", "1.", "+1"}},
      // Recursive through $defs.
      {R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}}})",
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3}]})"}, {R"({"v":1,"kids":[{}]})"}},
      {R"({"definitions":{"x":{"type":"boolean"}},"type":"object","properties":{"f":{"$ref":"#/definitions/x"}},"required":["f"]})",
       {R"({"f":true})"}, {R"({"f":1})"}},
      {R"({"properties":{"a":{"allOf":[{"type":"integer"}]}}})", {R"({"a":7})", "{}"}, {R"({"a":"7"})"}},
      {R"({"title":"t","description":"d","type":"boolean","default":true})", {"true", "false"}, {"1"}},
      {"true", {"1", R"({"a":[]})"}, {"x"}},
  };
  for (const Case& c : cases) {
    const auto g = Compile(Kind::kJsonSchema, c.value);
    ASSERT_NE(g, nullptr) << c.value;
    for (const std::string& s : c.match) EXPECT_TRUE(Matches(g, s)) << c.value << " should match " << s;
    for (const std::string& s : c.refuse) EXPECT_FALSE(Matches(g, s)) << c.value << " should refuse " << s;
  }
}

TEST(JsonSchemaTest, RefusesWhatItCannotEnforceNamingTheKeywordAndWhere) {
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {R"({"type":"integer","minimum":0})", "json_schema: keyword 'minimum' is not supported"},
      {R"({"properties":{"a":{"type":"string","maxLength":"x"}}})", "json_schema at /properties/a/maxLength: must be an integer"},
      {R"({"type":"strin"})", "json_schema at /type: unknown type 'strin'"},
      {R"({"$ref":"#/$defs/missing"})", "'#/$defs/missing' does not resolve"},
      {R"({"$ref":"http://x/y.json"})", "only local references"},
      {R"({"properties":{"a":{}},"required":["b"]})", "'b' is not in properties"},
      {R"({"type":"string","format":"email"})", "format \"email\" is not supported"},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "allOf of more than one schema"},
      {R"({"type":"string","pattern":"(a)\\1"})", "/pattern: regex: backreferences"},
      {R"({"type":"array","minItems":3,"maxItems":2})", "maxItems is below minItems"},
      {R"({"not":{"type":"string"}})", "keyword 'not' is not supported"},
      {"false", "matches nothing"},
      {"[1,2]", "a schema must be an object or a boolean"},
      {"{", "not valid JSON"},
      {R"({"$ref":"#","type":"string"})", "keyword 'type' beside $ref"},
      {R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}})", "json_schema"},  // Matches nothing.
  };
  for (const auto& [schema, message] : refusals) {
    const std::string e = ErrorOf(Kind::kJsonSchema, schema);
    EXPECT_NE(e.find(message), std::string::npos) << schema << ": '" << e << "'";
  }
}

// Whitespace asked for (vLLM's guided_whitespace_pattern): where JSON allows it and nowhere else.
TEST(JsonSchemaTest, WhitespaceWhereAskedForBetweenTokensOnly) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"type":"string"}},"required":["a"]})";
  OutputConstraint c{Kind::kJsonSchema, schema, {}};
  c.whitespace = "[ \\n]{0,2}";
  auto g = CompileConstraint(c);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* s : {R"({"a":[1,2]})", "{ \"a\" : [ 1 , 2 ] }", "{\n \"a\": [],\n \"b\": \"x y\"\n}"}) {
    EXPECT_TRUE(Matches(*g, s)) << s;
  }
  for (const char* s : {"{   \"a\":[]}", "{\"a\":[1 2]}", " {\"a\":[]}", "{\"a\":[1\t]}", "{\"a\":[- 1]}"}) {
    EXPECT_FALSE(Matches(*g, s)) << s;  // Three spaces, none between tokens, a tab, inside a number.
  }
  OutputConstraint obj{Kind::kJsonObject, "", {}};
  obj.whitespace = " ?";
  auto o = CompileConstraint(obj);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(Matches(*o, R"({ "k": [ 1, { } ] })"));
  EXPECT_NE(c.Key(), OutputConstraint({Kind::kJsonSchema, schema, {}}).Key());
  // Refused: a bad regex, whitespace for a constraint that is not JSON.
  OutputConstraint bad = c;
  bad.whitespace = "(";
  EXPECT_NE(std::string(CompileConstraint(bad).status().message()).find("json_whitespace: regex"), std::string::npos);
  OutputConstraint regex{Kind::kRegex, "a", {}};
  regex.whitespace = " ";
  EXPECT_NE(std::string(CompileConstraint(regex).status().message()).find("json_whitespace: applies to"),
            std::string::npos);
}

TEST(ConstraintTest, ChoiceAndJsonObject) {
  const auto g = Compile(Kind::kChoice, "", {"yes", "no", "n/a \"x\""});
  ASSERT_NE(g, nullptr);
  for (const char* s : {"yes", "no", "n/a \"x\""}) EXPECT_TRUE(Matches(g, s)) << s;
  for (const char* s : {"ye", "yesno", "", "No"}) EXPECT_FALSE(Matches(g, s)) << s;
  EXPECT_NE(ErrorOf(Kind::kChoice, "").find("choice: must list"), std::string::npos);
  const auto obj = Compile(Kind::kJsonObject, "");
  ASSERT_NE(obj, nullptr);
  EXPECT_TRUE(Matches(obj, R"({"a":{"b":[1,"2",null]}})"));
  EXPECT_FALSE(Matches(obj, "[1]"));
  EXPECT_NE(ErrorOf(Kind::kGrammar, "root ::= x").find("grammar: "), std::string::npos);
}

// A toy vocabulary: the mask from the cache equals trying each token against a matcher, at
// every step of a walk; EOS is allowed exactly where the constraint can end; cached masks are
// reused across requests of one constraint.
TEST(TokenConstraintTest, MasksEqualTokenByTokenChecks) {
  const std::vector<std::string> vocab = {"", "{", "}", "\"", "a", "ab", "\":", "1", "12", ",", "\"a\":", "x", ""};
  const int32_t eos = 12;  // Special: no bytes.
  ConstraintCache cache(vocab, /*vocab_size=*/16, {eos});
  const OutputConstraint c{Kind::kJsonSchema,
                           R"({"properties":{"a":{"type":"integer"}},"required":["a"]})", {}};
  auto tc = cache.Start(c);
  ASSERT_TRUE(tc.ok()) << tc.status();
  const auto grammar = CompileConstraint(c);
  ASSERT_TRUE(grammar.ok());
  GrammarMatcher reference(*grammar);
  const std::vector<int32_t> walk = {1, 10, 8, 7, 2};  // {"a":121}
  for (size_t step = 0; step <= walk.size(); ++step) {
    const TokenMask& mask = (*tc)->Mask();
    int64_t allowed = 0;
    for (int32_t t = 0; t < 16; ++t) {
      bool expect = false;
      if (t == eos) {
        expect = reference.CanEnd();
      } else if (t < static_cast<int32_t>(vocab.size()) && !vocab[t].empty()) {
        GrammarMatcher m = reference;
        expect = m.Advance(vocab[t]);
      }
      EXPECT_EQ(mask.Test(t), expect) << "step " << step << " token " << t;
      allowed += expect;
    }
    EXPECT_EQ(mask.allowed, allowed);
    if (step == walk.size()) break;
    ASSERT_TRUE((*tc)->Accept(walk[step]));
    ASSERT_TRUE(reference.Advance(vocab[walk[step]]));
  }
  EXPECT_TRUE((*tc)->CanEnd());
  EXPECT_FALSE((*tc)->Accept(eos));  // EOS is the caller's.
  // A second request of the same constraint reuses the compiled grammar and its masks.
  const int64_t computed = cache.masks_computed();
  auto again = cache.Start(c);
  ASSERT_TRUE(again.ok());
  for (int32_t t : walk) {
    (*again)->Mask();
    ASSERT_TRUE((*again)->Accept(t));
  }
  EXPECT_EQ(cache.compiled(), 1);
  EXPECT_EQ(cache.masks_computed(), computed);
  EXPECT_EQ((*again)->AllowedPrefix({1, 10, 11}), 0u);  // Already complete: nothing more.
  auto fresh = cache.Start(c);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->AllowedPrefix({1, 10, 7, 11, 2}), 3u);
  // Under a memory bound of two masks the caches restart as they fill: the masks are the same,
  // computed again.
  ConstraintCache small(vocab, 16, {eos}, /*max_grammars=*/4, /*max_mask_bytes=*/16);
  std::vector<std::vector<uint64_t>> first_walk;
  for (int pass = 0; pass < 2; ++pass) {
    auto t = small.Start(c);
    ASSERT_TRUE(t.ok());
    for (size_t step = 0; step <= walk.size(); ++step) {
      const TokenMask& mask = (*t)->Mask();
      if (pass == 0) {
        first_walk.push_back(mask.words);
      } else {
        EXPECT_EQ(mask.words, first_walk[step]) << "step " << step;
      }
      if (step < walk.size()) ASSERT_TRUE((*t)->Accept(walk[step]));
    }
  }
  EXPECT_EQ(small.masks_computed(), 2 * static_cast<int64_t>(walk.size() + 1));  // Nothing kept.
  EXPECT_EQ(first_walk, [&] {
    std::vector<std::vector<uint64_t>> again;
    auto t = *cache.Start(c);
    for (size_t step = 0; step <= walk.size(); ++step) {
      again.push_back(t->Mask().words);
      if (step < walk.size()) t->Accept(walk[step]);
    }
    return again;
  }());  // As the unbounded cache's.
  // A bad constraint is an error naming its field, and nothing is cached.
  auto bad = cache.Start({Kind::kRegex, "(", {}});
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(cache.compiled(), 1);
}

// Two constraints that differ only in their choices, or in one keyword of a schema, compile to
// grammars of their own on one worker (the cache key holds every part of the constraint).
TEST(TokenConstraintTest, DifferentConstraintsNeverShareAGrammar) {
  const std::vector<std::string> vocab = {"a", "b", "\"", "{", "}", ":", "1", "x", ""};
  ConstraintCache cache(vocab, 9, {8});
  auto first = cache.Start({Kind::kChoice, "", {"a"}});
  auto second = cache.Start({Kind::kChoice, "", {"b"}});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(cache.compiled(), 2);
  EXPECT_TRUE((*first)->Mask().Test(0));
  EXPECT_FALSE((*first)->Mask().Test(1));
  EXPECT_TRUE((*second)->Mask().Test(1));
  EXPECT_FALSE((*second)->Mask().Test(0));
  auto s1 = cache.Start({Kind::kJsonSchema, R"({"type":"string","maxLength":1})", {}});
  auto s2 = cache.Start({Kind::kJsonSchema, R"({"type":"string","maxLength":2})", {}});
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(cache.compiled(), 4);
  for (int32_t t : {2, 7}) {
    ASSERT_TRUE((*s1)->Accept(t));
    ASSERT_TRUE((*s2)->Accept(t));
  }
  EXPECT_FALSE((*s1)->Mask().Test(7));  // "x then x: over maxLength 1.
  EXPECT_TRUE((*s2)->Mask().Test(7));
}

// No object of a JSON output repeats a key, however the key is written: the mask drops the
// tokens that would close one, and Accept refuses them (a resumed stream's replay, drafts).
TEST(TokenConstraintTest, NoObjectRepeatsAKey) {
  const std::vector<std::string> vocab = {
      "{", "}", "\"a\"", ":", "1", ",", "\"b\"", "\"\\u0061\"", "\"a", "\"", ",\"a\":", "{\"k\":1,\"k\"", "["};
  const int32_t eos = static_cast<int32_t>(vocab.size());
  ConstraintCache cache(vocab, eos + 1, {eos});
  auto t = cache.Start({Kind::kJsonObject, "", {}});
  ASSERT_TRUE(t.ok());
  for (int32_t tok : {0, 2, 3, 4, 5}) ASSERT_TRUE((*t)->Accept(tok)) << vocab[tok];  // {"a":1,
  const TokenMask& mask = (*t)->Mask();
  EXPECT_FALSE(mask.Test(2));   // "a"
  EXPECT_FALSE(mask.Test(7));   // "\u0061": the same key.
  EXPECT_TRUE(mask.Test(6));    // "b"
  EXPECT_TRUE(mask.Test(8));    // "a (not closed: may go on as "ab")
  EXPECT_FALSE((*t)->Accept(2));
  EXPECT_FALSE((*t)->Accept(7));
  EXPECT_EQ((*t)->AllowedPrefix({6, 3, 4, 10}), 3u);  // "b":1 then ,"a": repeats "a".
  ASSERT_TRUE((*t)->Accept(8));   // "a
  EXPECT_FALSE((*t)->Mask().Test(9));  // " would close "a".
  // A nested object has keys of its own; one token can open an object and repeat a key in it.
  auto n = cache.Start({Kind::kJsonObject, "", {}});
  ASSERT_TRUE(n.ok());
  for (int32_t tok : {0, 2, 3}) ASSERT_TRUE((*n)->Accept(tok));  // {"a":
  EXPECT_TRUE((*n)->Mask().Test(0));
  EXPECT_FALSE((*n)->Mask().Test(11));  // {"k":1,"k"
  ASSERT_TRUE((*n)->Accept(0));
  EXPECT_TRUE((*n)->Mask().Test(2));   // "a" again, in the inner object: allowed.
  ASSERT_TRUE((*n)->Accept(2));
  for (int32_t tok : {3, 4, 1, 5}) ASSERT_TRUE((*n)->Accept(tok)) << vocab[tok];  // :1},
  EXPECT_FALSE((*n)->Mask().Test(2));  // The outer object has "a".
  // Not JSON constraints: no tracking.
  auto r = cache.Start({Kind::kRegex, R"(\{"a":1,"a":1\})", {}});
  ASSERT_TRUE(r.ok());
  for (int32_t tok : {0, 2, 3, 4, 5, 2}) ASSERT_TRUE((*r)->Accept(tok)) << vocab[tok];
}

TEST(JsonSchemaTest, AdditionalKeysAreNeverDeclaredOnes) {
  const auto g = Compile(Kind::kJsonSchema,
                         R"({"properties":{"a":{"type":"integer"},"é":{"type":"null"}},"additionalProperties":{"type":"string"}})");
  ASSERT_NE(g, nullptr);
  for (const char* s : {R"({})", R"({"a":1,"ab":"x"})", R"({"b":"x","":"y"})", "{\"\xc3\xa9x\":\"\"}"}) {
    EXPECT_TRUE(Matches(g, s)) << s;
  }
  for (const char* s : {R"({"a":"x"})", R"({"a":1,"a":"x"})", R"({"\u0061":"x"})", "{\"\xc3\xa9\":\"\"}"}) {
    EXPECT_FALSE(Matches(g, s)) << s;
  }
}

TEST(JsonSchemaTest, LengthsCountCodePointsAndSurrogatesComeInPairs) {
  const auto one = Compile(Kind::kJsonSchema, R"({"type":"string","maxLength":1})");
  const auto two = Compile(Kind::kJsonSchema, R"({"type":"string","minLength":2})");
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  for (const char* s : {R"("\ud83d\ude00")", "\"\xf0\x9f\x98\x80\"", R"("\u00e9")", R"("\n")"}) {
    EXPECT_TRUE(Matches(one, s)) << s;
    EXPECT_FALSE(Matches(two, s)) << s;
  }
  const auto any = Compile(Kind::kJsonSchema, R"({"type":"string"})");
  for (const char* s : {R"("\ud83d")", R"("\ude00")", R"("\ud83d\u0041")"}) EXPECT_FALSE(Matches(any, s)) << s;
}

TEST(JsonSchemaTest, DatesAreRealCalendarDates) {
  const auto g = Compile(Kind::kJsonSchema, R"({"type":"string","format":"date"})");
  ASSERT_NE(g, nullptr);
  for (const char* d : {"2024-02-29", "2000-02-29", "0004-02-29", "2023-01-31", "2023-04-30", "0001-01-01"}) {
    EXPECT_TRUE(Matches(g, Str("\"", d, "\""))) << d;
  }
  for (const char* d : {"2023-02-29", "1900-02-29", "2023-04-31", "0000-01-01", "2023-06-31", "2023-00-10"}) {
    EXPECT_FALSE(Matches(g, Str("\"", d, "\""))) << d;
  }
}

TEST(JsonSchemaTest, OneOfOnlyWhereBranchesExcludeEachOther) {
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"oneOf":[{"type":"integer"},{"type":"number"}]})").find("oneOf whose branches"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"oneOf":[{"type":"object"},{"properties":{"a":{}}}]})").find("oneOf"),
            std::string::npos);
  EXPECT_NE(Compile(Kind::kJsonSchema, R"({"oneOf":[{"type":"integer"},{"type":"string"},{"enum":[null,true]}]})"), nullptr);
  EXPECT_NE(Compile(Kind::kJsonSchema,
                    R"({"oneOf":[{"$ref":"#/$defs/cat"},{"type":"object","properties":{"kind":{"enum":["dog","wolf"]}},"required":["kind"]}],
                        "$defs":{"cat":{"type":"object","properties":{"kind":{"const":"cat"},"n":{"type":"integer"}},"required":["kind"]}}})"),
            nullptr);
}

TEST(JsonSchemaTest, EnumKeepsOnlyValuesOfItsTypeAndRefusesOtherSiblings) {
  const auto g = Compile(Kind::kJsonSchema, R"({"type":"string","enum":["a",1,null]})");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, R"("a")"));
  EXPECT_FALSE(Matches(g, "1"));
  EXPECT_FALSE(Matches(g, "null"));
  const auto n = Compile(Kind::kJsonSchema, R"({"type":"integer","enum":[1,1.0,1.5,"x"],"nullable":true})");
  ASSERT_NE(n, nullptr);
  EXPECT_TRUE(Matches(n, "1"));
  EXPECT_TRUE(Matches(n, "1.0"));
  EXPECT_FALSE(Matches(n, "1.5"));
  EXPECT_TRUE(Matches(n, "null"));
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"enum":["abc","a"],"minLength":2})").find("'minLength' beside enum/const"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"type":"string","enum":[1]})").find("no value of enum/const"), std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"anyOf":[{"type":"object"}],"required":["a"]})").find("'required' beside anyOf"),
            std::string::npos);
}

// Request input nested or repeated past any sane bound is an error, not a stack overflow: one
// request must never end the process (each of these crashed it before).
TEST(ConstraintTest, DeepOrStackedInputIsRefusedNotRecursedInto) {
  const std::string deep = "{\"const\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, deep).find("json_schema: nests deeper than 256"), std::string::npos);
  std::string deep_enum = "{\"enum\": [";
  for (int i = 0; i < 60000; ++i) deep_enum += "{\"a\":";
  deep_enum += "1" + std::string(60000, '}') + "]}";
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, deep_enum).find("deeper than"), std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kRegex, "a" + std::string(65000, '*')).find("multiple repeat at offset 2"), std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kRegex, "a" + std::string(60000, '?')).find("multiple repeat"), std::string::npos);
  std::string braces = "a";
  for (int i = 0; i < 21000; ++i) braces += "{1}";
  EXPECT_NE(ErrorOf(Kind::kRegex, braces).find("multiple repeat at offset 4"), std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"type":"string","pattern":"a)" + std::string(65000, '*') + "\"}")
                .find("/pattern: regex: multiple repeat"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kRegex, std::string(300, '(') + "a" + std::string(300, ')')).find("nested deeper"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kGrammar, "root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'))
                .find("nested deeper"),
            std::string::npos);
  // Long text is refused before it is compiled: a 762 KB pattern took 1 s (17 s under ASan).
  std::string a1;
  for (int i = 0; i < 40000; ++i) a1 += "a1";
  EXPECT_NE(ErrorOf(Kind::kRegex, a1).find("regex: 80000 bytes, over the limit of 65536"), std::string::npos);
  EXPECT_NE(ErrorOf(Kind::kJsonSchema, R"({"type":"string","pattern":")" + a1 + "\"}")
                .find("/pattern: regex: 80000 bytes, over the limit"),
            std::string::npos);
  EXPECT_TRUE(ErrorOf(Kind::kRegex, a1.substr(0, 65536)).empty());
  const std::string big = "root ::= \"" + std::string(5 << 20, 'a') + "\"\n";
  EXPECT_NE(ErrorOf(Kind::kGrammar, big).find("over the limit of 4194304"), std::string::npos);
}

TEST(RegexGrammarTest, QuantifiersAsPythonAllowsThem) {
  for (const char* bad : {"a**", "a*?*", "a{1}{1}", "a???", "a{1}*", "a{1}??"}) {
    EXPECT_NE(ErrorOf(Kind::kRegex, bad).find("multiple repeat"), std::string::npos) << bad;
  }
  for (const char* ok : {"a??", "a{1}?", "(a*)*", "a{,2}", "a{x}*", "a*{", "a*{1"}) {
    EXPECT_NE(Compile(Kind::kRegex, ok), nullptr) << ok;
  }
}

// Python's re reads \d \w \s as Unicode classes in a str pattern; their complements and negated
// classes leave out exactly those characters.
TEST(RegexGrammarTest, ClassesArePythonsUnicodeClasses) {
  const std::string arabic_three = "\xd9\xa3", e_acute = "\xc3\xa9", nbsp = "\xc2\xa0";
  const auto digit = Compile(Kind::kRegex, "\\d"), non_digit = Compile(Kind::kRegex, "\\D");
  const auto word = Compile(Kind::kRegex, "\\w"), non_word = Compile(Kind::kRegex, "[^\\w]");
  const auto space = Compile(Kind::kRegex, "\\s"), non_space = Compile(Kind::kRegex, "\\S");
  EXPECT_TRUE(Matches(digit, arabic_three));
  EXPECT_FALSE(Matches(non_digit, arabic_three));
  EXPECT_TRUE(Matches(word, e_acute));
  EXPECT_FALSE(Matches(non_word, e_acute));
  EXPECT_TRUE(Matches(space, nbsp));
  EXPECT_FALSE(Matches(non_space, nbsp));
  EXPECT_TRUE(Matches(non_word, "!"));
  EXPECT_FALSE(Matches(digit, "x"));
}

}  // namespace
}  // namespace pdserve::structured
