#include "common/structured/grammar.h"

#include <algorithm>

#include "common/base/strings.h"

namespace pdserve::structured {

int32_t Grammar::AddRule(std::string name) {
  rules_.push_back(GrammarRule{std::move(name), {}});
  return static_cast<int32_t>(rules_.size() - 1);
}

int32_t Grammar::ByteSetIndex(const ByteSet& set) {
  auto [it, inserted] = byte_set_index_.try_emplace(set, static_cast<int32_t>(byte_sets_.size()));
  if (inserted) byte_sets_.push_back(set);
  return it->second;
}

int64_t Grammar::num_elements() const {
  int64_t n = 0;
  for (const GrammarRule& r : rules_) {
    for (const GrammarSequence& a : r.alternatives) n += static_cast<int64_t>(a.size());
  }
  return n;
}

absl::Status Grammar::Finalize() {
  const size_t n = rules_.size();
  if (root_ < 0 || static_cast<size_t>(root_) >= n) return absl::InvalidArgumentError("grammar: no root rule");
  if (static_cast<int64_t>(n) > kMaxRules) {
    return absl::InvalidArgumentError(Str("grammar: ", n, " rules, more than ", kMaxRules, " (too large)"));
  }
  if (num_elements() > kMaxElements) {
    return absl::InvalidArgumentError(
        Str("grammar: ", num_elements(), " elements, more than ", kMaxElements, " (too large)"));
  }
  // Nullable (derives the empty string) and productive (derives some string): fixpoints.
  nullable_.assign(n, false);
  std::vector<bool> productive(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      for (const GrammarSequence& alt : rules_[r].alternatives) {
        bool all_nullable = true, all_productive = true;
        for (const GrammarElement& e : alt) {
          const bool is_rule = e.kind == GrammarElement::Kind::kRule;
          all_nullable = all_nullable && is_rule && nullable_[static_cast<size_t>(e.index)];
          all_productive = all_productive && (!is_rule || productive[static_cast<size_t>(e.index)]);
          if (!is_rule && byte_sets_[static_cast<size_t>(e.index)].none()) all_productive = false;
        }
        if (all_nullable && !nullable_[r]) nullable_[r] = changed = true;
        if (all_productive && !productive[r]) productive[r] = changed = true;
      }
    }
  }
  if (!productive[static_cast<size_t>(root_)]) {
    return absl::InvalidArgumentError(
        Str("grammar: rule '", rules_[static_cast<size_t>(root_)].name, "' matches no string"));
  }
  // Every rule the root reaches must finish too: a matcher that entered one that cannot
  // (x ::= "c" x) would run to the length limit however the output goes on.
  std::vector<bool> reached(n, false);
  std::vector<int32_t> todo = {root_};
  reached[static_cast<size_t>(root_)] = true;
  while (!todo.empty()) {
    const size_t r = static_cast<size_t>(todo.back());
    todo.pop_back();
    if (!productive[r]) {
      return absl::InvalidArgumentError(
          Str("grammar: rule '", rules_[r].name, "' never finishes (it matches no string) "
              "though the root reaches it"));
    }
    for (const GrammarSequence& alt : rules_[r].alternatives) {
      for (const GrammarElement& e : alt) {
        if (e.kind != GrammarElement::Kind::kRule || reached[static_cast<size_t>(e.index)]) continue;
        reached[static_cast<size_t>(e.index)] = true;
        todo.push_back(e.index);
      }
    }
  }
  // Left recursion: a rule reached again before a byte is consumed. Edges r -> s where s
  // follows only nullable elements in an alternative of r; `tail` where s ends the alternative
  // (its caller's frame is gone by then: the stack does not grow). A cycle of tail edges only
  // (x* of a nullable x) comes back to the same stack, which the matcher's expansion skips; a
  // cycle with another edge grows the stack forever and is refused. Cycles are the strongly
  // connected components (Tarjan's, iterative).
  struct Edge {
    int32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (const GrammarSequence& alt : rules_[r].alternatives) {
      for (size_t i = 0; i < alt.size(); ++i) {
        const GrammarElement& e = alt[i];
        if (e.kind != GrammarElement::Kind::kRule) break;
        left[r].push_back({e.index, i + 1 == alt.size()});
        if (!nullable_[static_cast<size_t>(e.index)]) break;
      }
    }
  }
  std::vector<int32_t> index(n, -1), low(n, 0), component(n, -1), stack;
  std::vector<bool> on_stack(n, false);
  int32_t counter = 0, components = 0;
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t start = 0; start < n; ++start) {
    if (index[start] >= 0) continue;
    path.push_back({static_cast<int32_t>(start), 0});
    while (!path.empty()) {
      auto& [v, next] = path.back();
      const size_t vi = static_cast<size_t>(v);
      if (next == 0 && index[vi] < 0) {
        index[vi] = low[vi] = counter++;
        stack.push_back(v);
        on_stack[vi] = true;
      }
      if (next < left[vi].size()) {
        const int32_t w = left[vi][next++].to;
        const size_t wi = static_cast<size_t>(w);
        if (index[wi] < 0) {
          path.push_back({w, 0});
        } else if (on_stack[wi]) {
          low[vi] = std::min(low[vi], index[wi]);
        }
        continue;
      }
      if (low[vi] == index[vi]) {
        while (true) {
          const int32_t w = stack.back();
          stack.pop_back();
          on_stack[static_cast<size_t>(w)] = false;
          component[static_cast<size_t>(w)] = components;
          if (w == v) break;
        }
        ++components;
      }
      const int32_t done = v;
      path.pop_back();
      if (!path.empty()) {
        const size_t parent = static_cast<size_t>(path.back().first);
        low[parent] = std::min(low[parent], low[static_cast<size_t>(done)]);
      }
    }
  }
  epsilon_cycles_ = false;
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : left[r]) {
      if (component[static_cast<size_t>(e.to)] != component[r]) continue;
      if (!e.tail) {
        return absl::InvalidArgumentError(Str("grammar: rule '", rules_[static_cast<size_t>(e.to)].name,
                                              "' is left-recursive (it can reach itself before "
                                              "matching a byte); rewrite it right-recursively"));
      }
      epsilon_cycles_ = true;
    }
  }
  return absl::OkStatus();
}

namespace {

std::string HexByte(int b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return {'\\', 'x', kDigits[b >> 4], kDigits[b & 15]};
}

std::string ByteSetText(const ByteSet& set) {
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!set[static_cast<size_t>(b)]) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set[static_cast<size_t>(e + 1)]) ++e;
    out += HexByte(b);
    if (e > b) out += "-" + HexByte(e);
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (const GrammarRule& r : rules_) {
    out += r.name + " ::=";
    for (size_t a = 0; a < r.alternatives.size(); ++a) {
      out += a == 0 ? " " : " | ";
      if (r.alternatives[a].empty()) out += "\"\"";
      for (size_t i = 0; i < r.alternatives[a].size(); ++i) {
        const GrammarElement& e = r.alternatives[a][i];
        if (i > 0) out += " ";
        out += e.kind == GrammarElement::Kind::kRule ? rules_[static_cast<size_t>(e.index)].name
                                                     : ByteSetText(byte_sets_[static_cast<size_t>(e.index)]);
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace pdserve::structured
