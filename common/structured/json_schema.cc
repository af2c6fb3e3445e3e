#include "common/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/json/json_body.h"
#include "common/structured/grammar_parser.h"
#include "common/structured/regex_grammar.h"
#include "nlohmann/json.hpp"

namespace pdserve::structured {
namespace {

using Json = nlohmann::ordered_json;  // Properties keep the schema's order.

constexpr int kMaxDepth = 128;        // Schemas within schemas.
constexpr int kMaxJsonNesting = 256;  // Arrays and objects within each other in the text.

// The rules every JSON grammar here uses; each @ is where whitespace may go (BaseRules).
const char kBaseRules[] = R"(json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{"@ (json-string@ ":"@ json-value (@ ","@ json-string@ ":"@ json-value)*)?@ "}"
json-array ::= "["@ (json-value (@ ","@ json-value)*)?@ "]"
json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" json-escape)
json-escape ::= [0-9a-cefA-CEF] json-hex{3} | [dD] [0-7] json-hex{2} | [dD] [89abAB] json-hex{2} "\\u" [dD] [c-fC-F] json-hex{2}
json-hex ::= [0-9a-fA-F]
json-key-char ::= [^"\\\x00-\x1F]
json-int ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= json-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
json-date ::= json-year "-" ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | json-year "-" ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | json-year "-02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) | json-leap-year "-02-29"
json-year ::= [1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9]
json-leap-year ::= [0-9]{2} json-leap-2 | json-leap-2 "00"
json-leap-2 ::= "0" [48] | [2468] [048] | [13579] [26]
json-time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
json-uuid ::= [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}
)";

// Kinds of JSON value, as bits (oneOf's exclusivity, enum values against `type`).
constexpr uint8_t kNullKind = 1, kBoolKind = 2, kObjectKind = 4, kArrayKind = 8, kStringKind = 16,
                  kNumberKind = 32, kAnyKind = 63;
constexpr uint8_t kIntegerOnly = 64;  // With kNumberKind: whole numbers only (type integer).

uint8_t KindOfType(const std::string& t) {
  if (t == "null") return kNullKind;
  if (t == "boolean") return kBoolKind;
  if (t == "object") return kObjectKind;
  if (t == "array") return kArrayKind;
  if (t == "string") return kStringKind;
  return kNumberKind;  // number, integer
}

uint8_t KindOfValue(const Json& v) {
  if (v.is_null()) return kNullKind;
  if (v.is_boolean()) return kBoolKind;
  if (v.is_object()) return kObjectKind;
  if (v.is_array()) return kArrayKind;
  if (v.is_string()) return kStringKind;
  return kNumberKind;
}

// The value is of one of `kinds` (as JSON Schema's type sees it: 1.0 is an integer).
bool ValueHasKinds(const Json& v, uint8_t kinds) {
  if ((KindOfValue(v) & kinds) == 0) return false;
  if (!v.is_number() || !(kinds & kIntegerOnly) || v.is_number_integer()) return true;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d);
}

// Keywords that describe and constrain nothing.
const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* set = new absl::flat_hash_set<std::string>{
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
      "readOnly", "writeOnly"};
  return *set;
}

const absl::flat_hash_set<std::string>& Supported() {
  static const auto* set = new absl::flat_hash_set<std::string>{
      "type", "properties", "required", "additionalProperties", "enum", "const", "items",
      "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "$defs",
      "definitions", "minLength", "maxLength", "pattern", "format", "nullable"};
  return *set;
}

// kBaseRules with its @ as ` ws` (whitespace allowed) or nothing (compact), and the ws rule.
absl::StatusOr<std::string> BaseRules(const std::string& whitespace) {
  std::string out;
  for (const char c : std::string_view(kBaseRules)) {
    if (c == '@') {
      if (!whitespace.empty()) out += " ws";
    } else {
      out += c;
    }
  }
  if (!whitespace.empty()) {
    auto ws = RegexToGrammar(whitespace);
    if (!ws.ok()) return absl::InvalidArgumentError(Str("json_whitespace: ", ws.status().message()));
    out += Str("ws ::= ", *ws, "\n");
  }
  return out;
}

std::string JsonText(const Json& v) {
  return v.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::strict);
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonGrammarOptions& options)
      : root_(root), options_(options), w_(options.whitespace.empty() ? "" : " ws ") {
    comma_ = Str(w_, "\",\"", w_);
    colon_ = Str(w_, "\":\"", w_);
  }

  absl::StatusOr<std::string> Compile() {
    PD_ASSIGN_OR_RETURN(std::string expr, Visit(root_, "", 0));
    PD_ASSIGN_OR_RETURN(std::string base, BaseRules(options_.whitespace));
    std::string out = Str("root ::= ", expr, "\n");
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out + base;
  }

 private:
  static absl::Status Bad(std::string_view path, std::string_view what) {
    return absl::InvalidArgumentError(
        Str("json_schema", path.empty() ? "" : Str(" at ", path), ": ", what));
  }

  std::string NewRule(std::string body) {
    std::string name = Str("s", rules_.size());
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  absl::StatusOr<std::string> Visit(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Bad(path, Str("nested deeper than ", kMaxDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return Bad(path, "the schema `false` matches nothing");
    }
    if (!s.is_object()) return Bad(path, "a schema must be an object or a boolean");
    for (const auto& [key, unused] : s.items()) {
      if (!Supported().contains(key) && !Annotations().contains(key)) {
        return Bad(path, Str("keyword '", key, "' is not supported"));
      }
    }
    if (s.contains("$ref")) {
      for (const auto& [key, unused] : s.items()) {
        if (key != "$ref" && key != "$defs" && key != "definitions" && !Annotations().contains(key)) {
          return Bad(path, Str("keyword '", key, "' beside $ref is not supported"));
        }
      }
      return Ref(s["$ref"], path, depth);
    }
    std::vector<std::string> alternatives;
    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("const") && s.contains("enum")) {
        return Bad(path, "enum and const together are not supported");
      }
      // Beside a list of values only `type` (which filters them) and `nullable` are enforced;
      // any other keyword would have to hold for every value, so it is refused, not ignored.
      for (const auto& [key, unused] : s.items()) {
        if (key != "enum" && key != "const" && key != "type" && key != "nullable" && key != "$defs" &&
            key != "definitions" && !Annotations().contains(key)) {
          return Bad(path, Str("keyword '", key, "' beside enum/const is not supported"));
        }
      }
      std::vector<const Json*> values;
      if (s.contains("const")) values.push_back(&s["const"]);
      if (s.contains("enum")) {
        const Json& e = s["enum"];
        if (!e.is_array() || e.empty()) return Bad(path + "/enum", "must be a non-empty array");
        for (const Json& v : e) values.push_back(&v);
      }
      uint8_t kinds = kAnyKind;
      if (s.contains("type")) {
        PD_ASSIGN_OR_RETURN(std::vector<std::string> types, Types(s, path));
        kinds = 0;
        for (const std::string& t : types) kinds |= KindOfType(t);
        if (std::find(types.begin(), types.end(), "number") == types.end() &&
            std::find(types.begin(), types.end(), "integer") != types.end()) {
          kinds |= kIntegerOnly;
        }
      }
      for (const Json* v : values) {
        if (ValueHasKinds(*v, kinds)) alternatives.push_back(GrammarLiteral(JsonText(*v)));
      }
      if (alternatives.empty()) return Bad(path, "no value of enum/const has the schema's type");
    } else if (s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf")) {
      for (const char* key : {"anyOf", "oneOf", "allOf"}) {
        if (!s.contains(key)) continue;
        const Json& list = s[key];
        const std::string p = Str(path, "/", key);
        if (!list.is_array() || list.empty()) return Bad(p, "must be a non-empty array");
        if (std::string_view(key) == "allOf" && list.size() != 1) {
          return Bad(p, "allOf of more than one schema is not supported");
        }
        if (!alternatives.empty()) return Bad(path, "more than one of anyOf, oneOf, allOf");
        if (std::string_view(key) == "oneOf") PD_RETURN_IF_ERROR(OneOfIsExclusive(list, p));
        for (size_t i = 0; i < list.size(); ++i) {
          PD_ASSIGN_OR_RETURN(std::string a, Visit(list[i], Str(p, "/", i), depth + 1));
          alternatives.push_back(std::move(a));
        }
      }
      for (const char* key : {"type", "properties", "required", "additionalProperties", "items",
                              "pattern", "minLength", "maxLength", "minItems", "maxItems", "format",
                              "prefixItems"}) {
        if (s.contains(key)) return Bad(path, Str("keyword '", key, "' beside anyOf/oneOf/allOf is not supported"));
      }
    } else {
      PD_ASSIGN_OR_RETURN(std::vector<std::string> types, Types(s, path));
      for (const std::string& t : types) {
        PD_ASSIGN_OR_RETURN(std::string a, Typed(s, t, path, depth));
        alternatives.push_back(std::move(a));
      }
    }
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) return Bad(path + "/nullable", "must be a boolean");
      if (s["nullable"].get<bool>()) alternatives.push_back("\"null\"");
    }
    if (alternatives.size() == 1) return alternatives[0];
    std::string out = "(";
    for (size_t i = 0; i < alternatives.size(); ++i) out += (i > 0 ? " | " : "") + alternatives[i];
    return out + ")";
  }

  absl::StatusOr<std::vector<std::string>> Types(const Json& s, const std::string& path) const {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Bad(path + "/type", "must be a type name or a list of them");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Bad(path + "/type", "must be a type name or a list of them");
      }
      for (const std::string& name : types) {
        static const absl::flat_hash_set<std::string> kNames = {
            "string", "integer", "number", "boolean", "null", "object", "array"};
        if (!kNames.contains(name)) return Bad(path + "/type", Str("unknown type '", name, "'"));
      }
      return types;
    }
    // No type: what its keywords describe, else any value.
    auto has = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys) {
        if (s.contains(k)) return true;
      }
      return false;
    };
    if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
    if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (types.empty()) types.push_back("any");
    return types;
  }

  absl::StatusOr<std::string> Typed(const Json& s, const std::string& t, const std::string& path,
                                    int depth) {
    if (t == "any") return std::string("json-value");
    if (t == "null") return std::string("\"null\"");
    if (t == "boolean") return std::string("(\"true\" | \"false\")");
    if (t == "integer") return std::string("json-int");
    if (t == "number") return std::string("json-number");
    if (t == "string") return String(s, path);
    if (t == "array") return Array(s, path, depth);
    return Object(s, path, depth);
  }

  absl::StatusOr<int64_t> Count(const Json& s, const char* key, const std::string& path, int64_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 16)) {
      return Bad(Str(path, "/", key), Str("must be an integer in [0, ", 1 << 16, "]"));
    }
    return v.get<int64_t>();
  }

  absl::StatusOr<std::string> String(const Json& s, const std::string& path) {
    PD_ASSIGN_OR_RETURN(int64_t min, Count(s, "minLength", path, 0));
    PD_ASSIGN_OR_RETURN(int64_t max, Count(s, "maxLength", path, -1));
    if (max >= 0 && max < min) return Bad(path, "maxLength is below minLength");
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (lengths || s.contains("format")) {
        return Bad(path, "pattern together with minLength, maxLength or format is not supported");
      }
      if (!s["pattern"].is_string()) return Bad(path + "/pattern", "must be a string");
      RegexOptions options;
      options.json_string = true;
      auto expr = RegexToGrammar(s["pattern"].get<std::string>(), options);
      if (!expr.ok()) return Bad(path + "/pattern", std::string(expr.status().message()));
      return Str("(\"\\\"\" ", *expr, " \"\\\"\")");
    }
    if (s.contains("format")) {
      if (lengths) return Bad(path, "format together with minLength or maxLength is not supported");
      const Json& f = s["format"];
      static const absl::flat_hash_map<std::string, std::string> kFormats = {
          {"date", "json-date"}, {"time", "json-time"}, {"date-time", "json-date \"T\" json-time"},
          {"uuid", "json-uuid"}};
      const auto it = f.is_string() ? kFormats.find(f.get<std::string>()) : kFormats.end();
      if (it == kFormats.end()) {
        return Bad(path + "/format", Str("format ", JsonText(f), " is not supported (date, time, date-time, uuid are)"));
      }
      return Str("(\"\\\"\" ", it->second, " \"\\\"\")");
    }
    if (!lengths) return std::string("json-string");
    return Str("(\"\\\"\" json-char{", min, ",", max >= 0 ? Str(max) : "", "} \"\\\"\")");
  }

  absl::StatusOr<std::string> Array(const Json& s, const std::string& path, int depth) {
    PD_ASSIGN_OR_RETURN(int64_t min, Count(s, "minItems", path, 0));
    PD_ASSIGN_OR_RETURN(int64_t max, Count(s, "maxItems", path, -1));
    if (max >= 0 && max < min) return Bad(path, "maxItems is below minItems");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      const Json& p = s["prefixItems"];
      if (!p.is_array()) return Bad(path + "/prefixItems", "must be an array of schemas");
      for (size_t i = 0; i < p.size(); ++i) {
        PD_ASSIGN_OR_RETURN(std::string e, Visit(p[i], Str(path, "/prefixItems/", i), depth + 1));
        prefix.push_back(std::move(e));
      }
    }
    std::string item = "json-value";  // Past the prefix; empty: none allowed.
    if (s.contains("items")) {
      const Json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        item.clear();
      } else {
        PD_ASSIGN_OR_RETURN(item, Visit(it, path + "/items", depth + 1));
      }
    }
    const int64_t k = static_cast<int64_t>(prefix.size());
    if (max >= 0 && k > max) prefix.resize(static_cast<size_t>(max));
    if (item.empty() && min > k) return Bad(path, "minItems exceeds prefixItems with items false");
    // The items after the prefix, each after a comma.
    std::string tail;
    if (!item.empty() && (max < 0 || max > k)) {
      const int64_t lo = std::max<int64_t>(0, min - k);
      tail = Str("(", comma_, " ", item, "){", lo, ",", max >= 0 ? Str(max - k) : "", "}");
    }
    if (prefix.empty()) {
      if (item.empty() || max == 0) return Str("(\"[\" ", w_, " \"]\")");
      const std::string rest = Str("(", comma_, " ", item, "){", std::max<int64_t>(0, min - 1), ",",
                                   max >= 0 ? Str(max - 1) : "", "}");
      if (min == 0) return Str("(\"[\" ", w_, " (", item, " ", rest, ")? ", w_, " \"]\")");
      return Str("(\"[\" ", w_, " ", item, " ", rest, " ", w_, " \"]\")");
    }
    // p0 ("," p1 ("," p2 ... tail)?)?: element j may end the array when j >= minItems.
    std::string inner = tail.empty() ? "\"\"" : tail;
    for (int64_t j = static_cast<int64_t>(prefix.size()) - 1; j >= 0; --j) {
      std::string seq = Str(j == 0 ? "" : comma_, " ", prefix[static_cast<size_t>(j)], " ", inner);
      inner = j >= min ? Str("(", seq, ")?") : Str("(", seq, ")");
    }
    return Str("(\"[\" ", w_, " ", inner, " ", w_, " \"]\")");
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& path, int depth) {
    struct Property {
      std::string key_literal;
      std::string value;
      bool required = false;
    };
    std::vector<Property> props;
    std::vector<std::string> declared;  // The properties' names.
    absl::flat_hash_set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) return Bad(path + "/required", "must be an array of names");
      for (const Json& name : r) {
        if (!name.is_string()) return Bad(path + "/required", "must be an array of names");
        required.insert(name.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      const Json& p = s["properties"];
      if (!p.is_object()) return Bad(path + "/properties", "must be an object of schemas");
      for (const auto& [key, schema] : p.items()) {
        PD_ASSIGN_OR_RETURN(std::string value,
                            Visit(schema, Str(path, "/properties/", key), depth + 1));
        props.push_back({Str(GrammarLiteral(JsonText(Json(key))), " ", colon_), std::move(value),
                         required.contains(key)});
        declared.push_back(key);
      }
    }
    for (const std::string& name : required) {
      const bool known = s.contains("properties") && s["properties"].contains(name);
      if (!known) return Bad(path + "/required", Str("'", name, "' is not in properties"));
    }
    std::string extra;  // A pair's grammar beyond `properties`; empty: none.
    const bool additional_given = s.contains("additionalProperties");
    if (additional_given) {
      const Json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        PD_ASSIGN_OR_RETURN(std::string value, Visit(a, path + "/additionalProperties", depth + 1));
        extra = Str(KeyExcept(declared), " ", colon_, " ", value);
      }
    } else if (!s.contains("properties")) {
      extra = Str("json-string ", colon_, " json-value");
    }
    // first_i: the pairs from property i on when none came before; rest_i: after one did.
    std::string first = extra.empty() ? "\"\"" : Str("(", extra, " (", comma_, " ", extra, ")*)?");
    std::string rest = extra.empty() ? "\"\"" : Str("(", comma_, " ", extra, ")*");
    for (int64_t i = static_cast<int64_t>(props.size()) - 1; i >= 0; --i) {
      const Property& p = props[static_cast<size_t>(i)];
      const std::string pair = Str(p.key_literal, " ", p.value);
      const std::string next_rest = rest;
      const std::string next_first = first;
      rest = NewRule(p.required ? Str(comma_, " ", pair, " ", next_rest)
                                : Str("(", comma_, " ", pair, ")? ", next_rest));
      first = NewRule(p.required ? Str(pair, " ", next_rest)
                                 : Str(pair, " ", next_rest, " | ", next_first));
    }
    return Str("(\"{\" ", w_, " ", first, " ", w_, " \"}\")");
  }

  absl::StatusOr<std::string> Ref(const Json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return Bad(path + "/$ref", "must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    PD_ASSIGN_OR_RETURN(const Json* target, Resolve(r, path));
    // The rule is named before its body is compiled: a recursive reference finds it.
    const std::string name = Str("ref", refs_.size());
    refs_[r] = name;
    const size_t slot = rules_.size();
    rules_.emplace_back(name, "");
    PD_ASSIGN_OR_RETURN(std::string body, Visit(*target, r.substr(1), depth + 1));
    rules_[slot].second = std::move(body);
    return name;
  }

  // The schema a local reference (#, #/$defs/x, any JSON pointer) points at.
  absl::StatusOr<const Json*> Resolve(const std::string& r, const std::string& path) const {
    if (r.empty() || r[0] != '#') return Bad(path + "/$ref", Str("'", r, "': only local references (#...) are supported"));
    const Json* target = &root_;
    std::string_view pointer = std::string_view(r).substr(1);
    while (!pointer.empty()) {
      if (pointer[0] != '/') return Bad(path + "/$ref", Str("'", r, "' is not a JSON pointer"));
      pointer.remove_prefix(1);
      const size_t end = std::min(pointer.find('/'), pointer.size());
      std::string token(pointer.substr(0, end));
      pointer.remove_prefix(end);
      for (size_t at; (at = token.find("~1")) != std::string::npos;) token.replace(at, 2, "/");
      for (size_t at; (at = token.find("~0")) != std::string::npos;) token.replace(at, 2, "~");
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else if (target->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos &&
                 token.size() < 9 && std::stoul(token) < target->size()) {
        target = &(*target)[std::stoul(token)];
      } else {
        return Bad(path + "/$ref", Str("'", r, "' does not resolve"));
      }
    }
    return target;
  }

  // A JSON string other than each of `names` (additional properties never repeat a declared
  // one, whose schema they would break): the keys are written without escapes, so a key's
  // bytes are its characters, and the rule is a trie of the names with every way out of it.
  std::string KeyExcept(const std::vector<std::string>& names) {
    struct Node {
      std::vector<std::pair<uint32_t, size_t>> kids;  // Code point -> node.
      bool word = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      std::vector<uint32_t> cps;
      bool writable = true;  // Without escapes: no quote, backslash or control character.
      for (size_t i = 0; i < name.size();) {
        const uint32_t cp = DecodeUtf8(name, &i);
        if (cp < 0x20 || cp == '"' || cp == '\\') writable = false;
        cps.push_back(cp);
      }
      if (!writable) continue;
      size_t at = 0;
      for (uint32_t cp : cps) {
        size_t next = 0;
        for (const auto& [c, kid] : trie[at].kids) {
          if (c == cp) next = kid;
        }
        if (next == 0) {
          next = trie.size();
          trie[at].kids.push_back({cp, next});
          trie.emplace_back();
        }
        at = next;
      }
      trie[at].word = true;
    }
    if (trie.size() == 1 && !trie[0].word) return "json-string";
    // Rules named first (children refer to them), bodies after.
    const size_t first = rules_.size();
    std::vector<std::string> rule(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) rule[i] = NewRule("");
    for (size_t i = 0; i < trie.size(); ++i) {
      std::string body, others = "[^\\\"\\\\\\x00-\\x1F";
      std::vector<std::string> alts;
      if (!trie[i].word) alts.push_back("\"\\\"\"");
      for (const auto& [cp, kid] : trie[i].kids) {
        alts.push_back(Str("\"", Hex8(cp), "\" ", rule[kid]));
        others += Hex8(cp);
      }
      alts.push_back(Str(others, "] json-key-char* \"\\\"\""));
      for (size_t a = 0; a < alts.size(); ++a) body += (a > 0 ? " | " : "") + alts[a];
      rules_[first + i].second = std::move(body);
    }
    return Str("(\"\\\"\" ", rule[0], ")");
  }

  static std::string Hex8(uint32_t cp) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(cp));
    return buf;
  }

  // The code point at s[*i] (valid UTF-8: nlohmann checked it), advancing *i.
  static uint32_t DecodeUtf8(const std::string& s, size_t* i) {
    const auto b = static_cast<uint8_t>(s[*i]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len && *i + static_cast<size_t>(k) < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<uint8_t>(s[*i + static_cast<size_t>(k)]) & 0x3F);
    }
    *i += static_cast<size_t>(len);
    return cp;
  }

  // The kinds of JSON value a schema admits (bits), through references, for oneOf's check.
  uint8_t KindsOf(const Json& s, int depth) const {
    if (depth > kMaxDepth) return kAnyKind;
    if (s.is_boolean()) return s.get<bool>() ? kAnyKind : 0;
    if (!s.is_object()) return kAnyKind;
    if (s.contains("$ref") && s["$ref"].is_string()) {
      auto target = Resolve(s["$ref"].get<std::string>(), "");
      return target.ok() ? KindsOf(**target, depth + 1) : kAnyKind;
    }
    uint8_t kinds = 0;
    const bool nullable = s.contains("nullable") && s["nullable"] == true;
    if (s.contains("const") || s.contains("enum")) {
      if (s.contains("const")) kinds |= KindOfValue(s["const"]);
      if (s.contains("enum") && s["enum"].is_array()) {
        for (const Json& v : s["enum"]) kinds |= KindOfValue(v);
      }
      return kinds | (nullable ? kNullKind : 0);
    }
    bool combined = false;
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key) || !s[key].is_array()) continue;
      combined = true;
      for (const Json& b : s[key]) kinds |= KindsOf(b, depth + 1);
    }
    if (combined) return kinds | (nullable ? kNullKind : 0);
    auto types = Types(s, "");
    if (!types.ok()) return kAnyKind;
    for (const std::string& t : *types) kinds |= t == "any" ? kAnyKind : KindOfType(t);
    return kinds | (nullable ? kNullKind : 0);
  }

  // oneOf holds when exactly one branch matches. Enforced where no value can match two: the
  // branches admit disjoint kinds of value, or they are objects told apart by a required
  // property whose const/enum values differ (a discriminator, as Pydantic writes unions).
  // Anything else is refused: the grammar can only say "at least one".
  absl::Status OneOfIsExclusive(const Json& list, const std::string& path) const {
    std::vector<uint8_t> kinds;
    bool disjoint = true;
    for (const Json& b : list) {
      const uint8_t k = KindsOf(b, 0) & ~kIntegerOnly;
      for (uint8_t other : kinds) disjoint = disjoint && (k & other) == 0;
      kinds.push_back(k);
    }
    if (disjoint) return absl::OkStatus();
    std::vector<const Json*> branches;
    for (const Json& b : list) {
      const Json* at = &b;
      for (int hops = 0; at->is_object() && at->contains("$ref") && (*at)["$ref"].is_string() && hops < 16; ++hops) {
        auto target = Resolve((*at)["$ref"].get<std::string>(), path);
        if (!target.ok()) break;
        at = *target;
      }
      if (!at->is_object() || !at->contains("required") || !(*at)["required"].is_array() ||
          !at->contains("properties") || !(*at)["properties"].is_object()) {
        branches.clear();
        break;
      }
      branches.push_back(at);
    }
    if (!branches.empty()) {
      for (const Json& name : (*branches[0])["required"]) {
        if (!name.is_string()) continue;
        std::vector<std::vector<const Json*>> values;
        for (const Json* b : branches) {
          const Json& required = (*b)["required"];
          if (std::find(required.begin(), required.end(), name) == required.end()) break;
          const Json& props = (*b)["properties"];
          if (!props.contains(name.get<std::string>())) break;
          const Json& p = props[name.get<std::string>()];
          if (!p.is_object()) break;
          std::vector<const Json*> vs;
          if (p.contains("const")) vs.push_back(&p["const"]);
          if (p.contains("enum") && p["enum"].is_array()) {
            for (const Json& v : p["enum"]) vs.push_back(&v);
          }
          if (vs.empty()) break;
          values.push_back(std::move(vs));
        }
        if (values.size() != branches.size()) continue;
        bool apart = true;
        for (size_t i = 0; i < values.size() && apart; ++i) {
          for (size_t j = i + 1; j < values.size() && apart; ++j) {
            for (const Json* a : values[i]) {
              for (const Json* b : values[j]) apart = apart && !(*a == *b);
            }
          }
        }
        if (apart) return absl::OkStatus();
      }
    }
    return Bad(path, "oneOf whose branches may match the same value is not supported (it is "
                     "enforced where the branches are of different types or are objects told apart "
                     "by a required const/enum property); use anyOf");
  }

  const Json& root_;
  const JsonGrammarOptions& options_;
  const std::string w_;  // Where whitespace may go: " ws " or nothing.
  std::string comma_, colon_;
  std::vector<std::pair<std::string, std::string>> rules_;
  absl::flat_hash_map<std::string, std::string> refs_;
};

}  // namespace

absl::StatusOr<std::string> JsonObjectGrammar(const JsonGrammarOptions& options) {
  PD_ASSIGN_OR_RETURN(std::string base, BaseRules(options.whitespace));
  return "root ::= json-object\n" + base;
}

absl::StatusOr<std::string> JsonSchemaToGrammar(std::string_view schema_json,
                                                const JsonGrammarOptions& options) {
  // Parsed in linear time with its nesting bounded as it is read: a schema is request input,
  // and the compiler's walks over it (and nlohmann's dump of a const) recurse.
  Json schema;
  JsonBodyError error;
  if (!ParseJsonBody(schema_json, kMaxJsonNesting, {}, &schema, &error)) {
    return absl::InvalidArgumentError(Str("json_schema: ", error.message));
  }
  return SchemaCompiler(schema, options).Compile();
}

}  // namespace pdserve::structured
