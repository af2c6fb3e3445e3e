// TEST INFRASTRUCTURE: the constraint compilers and matcher driven from a test in another
// language, so their outputs can be checked against oracles we did not write (Python's
// jsonschema and re: tests/structured/test_structured_oracle.py).
//
// Reads one JSON request per line on stdin, answers one JSON line each on stdout:
//   {"op": "walk", "kind": "json_schema"|"json_object"|"regex"|"choice"|"grammar", "value": ...,
//    "choices": [...], "whitespace": "", "n": 20, "seed": 1, "max_bytes": 300}
//     -> {"ok": true, "outputs": [...], "dead_ends": k} or {"error": "..."}: n random walks of
//        the byte-level matcher (with the JSON key tracker for JSON kinds, as a request's mask
//        has it), each ended where the constraint can end; past max_bytes a walk takes the
//        shortest way to an end. A dead end (no byte continues, cannot end) is counted.
//   {"op": "match", "kind": ..., "value": ..., "strings": [...]}
//     -> {"ok": true, "results": [true|false, ...]}: whether each string is a whole match.
// Strings travel as JSON strings of their UTF-8 bytes (the walks only make valid UTF-8).
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/structured/constraint.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/json_keys.h"
#include "nlohmann/json.hpp"

namespace pdserve::structured {
namespace {

using Json = nlohmann::json;

bool KindOf(const std::string& name, OutputConstraint::Kind* kind) {
  static const std::pair<const char*, OutputConstraint::Kind> kKinds[] = {
      {"json_schema", OutputConstraint::Kind::kJsonSchema}, {"json_object", OutputConstraint::Kind::kJsonObject},
      {"regex", OutputConstraint::Kind::kRegex}, {"choice", OutputConstraint::Kind::kChoice},
      {"grammar", OutputConstraint::Kind::kGrammar}};
  for (const auto& [n, k] : kKinds) {
    if (name == n) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// The shortest byte string from `state` to a state that can end, by breadth-first search over
// the matcher's states (at most `budget` of them); empty and false if none is found.
bool PathToEnd(const GrammarMatcher& m, int32_t state, std::string* path, int budget = 200000) {
  absl::flat_hash_map<int32_t, std::pair<int32_t, uint8_t>> from;  // state -> (previous, byte)
  std::queue<int32_t> todo;
  todo.push(state);
  from[state] = {-1, 0};
  while (!todo.empty() && budget-- > 0) {
    const int32_t s = todo.front();
    todo.pop();
    if (m.CanEnd(s)) {
      path->clear();
      for (int32_t at = s; at != state;) {
        const auto [prev, byte] = from[at];
        path->insert(path->begin(), static_cast<char>(byte));
        at = prev;
      }
      return true;
    }
    const ByteSet next = m.NextBytes(s);
    for (int b = 0; b < 256; ++b) {
      if (!next[static_cast<size_t>(b)]) continue;
      const int32_t t = m.Next(s, static_cast<uint8_t>(b));
      if (t >= 0 && from.try_emplace(t, std::make_pair(s, static_cast<uint8_t>(b))).second) todo.push(t);
    }
  }
  return false;
}

// One walk; false on a dead end.
bool Walk(GrammarMatcher m, bool json, std::mt19937_64& rng, int64_t max_bytes, std::string* out) {
  static const std::string kStructural = "{}[],:\"0123456789-.eE tfn\\u";
  JsonKeyTracker keys;
  out->clear();
  std::uniform_real_distribution<double> unit(0, 1);
  while (true) {
    std::vector<uint8_t> allowed;
    const ByteSet& next = m.NextBytes();
    for (int b = 0; b < 256; ++b) {
      if (!next[static_cast<size_t>(b)]) continue;
      const std::string one(1, static_cast<char>(b));
      if (json && !JsonKeyTracker::Lookahead(keys).Feed(one)) continue;
      allowed.push_back(static_cast<uint8_t>(b));
    }
    if (allowed.empty()) return m.CanEnd();
    if (m.CanEnd() && (unit(rng) < 0.15 || static_cast<int64_t>(out->size()) >= max_bytes)) return true;
    if (static_cast<int64_t>(out->size()) >= max_bytes) {
      std::string path;
      if (!PathToEnd(m, m.state(), &path)) return false;
      if (json && !JsonKeyTracker::Lookahead(keys).Feed(path)) return false;  // Counted as a dead end.
      for (char c : path) m.Advance(static_cast<uint8_t>(c));
      if (json) keys.Advance(path);
      *out += path;
      return true;
    }
    // A quote a quarter of the time (short strings: keys meet again), structural bytes a third,
    // any allowed byte else (non-ASCII included).
    uint8_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    const double u = unit(rng);
    if (u < 0.25 && next['"']) {
      if (std::find(allowed.begin(), allowed.end(), '"') != allowed.end()) pick = '"';
    } else if (u < 0.6) {
      std::vector<uint8_t> structural;
      for (uint8_t b : allowed) {
        if (kStructural.find(static_cast<char>(b)) != std::string::npos) structural.push_back(b);
      }
      if (!structural.empty()) pick = structural[std::uniform_int_distribution<size_t>(0, structural.size() - 1)(rng)];
    }
    m.Advance(pick);
    if (json) keys.Advance(std::string(1, static_cast<char>(pick)));
    out->push_back(static_cast<char>(pick));
  }
}

Json Answer(const Json& req) {
  OutputConstraint c;
  if (!req.contains("kind") || !KindOf(req["kind"].get<std::string>(), &c.kind)) return {{"error", "bad kind"}};
  c.value = req.value("value", "");
  c.whitespace = req.value("whitespace", "");
  if (req.contains("choices")) c.choices = req["choices"].get<std::vector<std::string>>();
  auto grammar = CompileConstraint(c);
  if (!grammar.ok()) return {{"error", std::string(grammar.status().message())}};
  GrammarMatcher matcher(*grammar);
  const bool json = c.kind == OutputConstraint::Kind::kJsonSchema || c.kind == OutputConstraint::Kind::kJsonObject;
  const std::string op = req.value("op", "");
  if (op == "match") {
    Json results = Json::array();
    for (const std::string& s : req["strings"].get<std::vector<std::string>>()) {
      GrammarMatcher m = matcher;
      JsonKeyTracker keys;
      results.push_back(m.Advance(s) && m.CanEnd() && (!json || keys.Advance(s)));
    }
    return {{"ok", true}, {"results", results}};
  }
  if (op != "walk") return {{"error", "bad op"}};
  std::mt19937_64 rng(req.value("seed", uint64_t{1}));
  const int64_t n = req.value("n", int64_t{20});
  const int64_t max_bytes = req.value("max_bytes", int64_t{300});
  Json outputs = Json::array();
  int64_t dead = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::string out;
    if (Walk(matcher, json, rng, max_bytes, &out)) {
      outputs.push_back(out);
    } else {
      ++dead;
    }
  }
  return {{"ok", true}, {"outputs", outputs}, {"dead_ends", dead}};
}

}  // namespace
}  // namespace pdserve::structured

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto req = nlohmann::json::parse(line, nullptr, false);
    nlohmann::json answer = req.is_object() ? pdserve::structured::Answer(req) : nlohmann::json{{"error", "not JSON"}};
    std::cout << answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
