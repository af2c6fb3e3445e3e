#include "common/structured/grammar_parser.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/structured/utf8_ranges.h"

namespace pdserve::structured {
namespace {

constexpr int64_t kMaxRepeat = 1 << 16;
constexpr int kMaxNesting = 256;  // Groups within groups.
// The text itself: parsing costs ~100 ns a byte, so this bounds one request's compile to ~0.4 s.
constexpr size_t kMaxGrammarBytes = size_t{4} << 20;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}


class Parser {
 public:
  Parser(std::string_view text, Grammar* g) : text_(text), g_(g) {}

  absl::Status Parse(std::string_view root) {
    SkipSpace();
    if (AtEnd()) return Error("the grammar has no rules");
    while (!AtEnd()) {
      const std::string name = ParseName();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (!Consume("::=")) return Error(Str("expected '::=' after '", name, "'"));
      const int32_t id = RuleId(name);
      if (defined_[static_cast<size_t>(id)]) return Error(Str("rule '", name, "' is defined twice"));
      defined_[static_cast<size_t>(id)] = true;
      current_ = name;
      std::vector<GrammarSequence> alternatives;
      PD_RETURN_IF_ERROR(ParseAlternatives(&alternatives, 0));
      g_->rule(id).alternatives = std::move(alternatives);
      SkipSpace();
    }
    for (int32_t id = 0; id < g_->num_rules(); ++id) {
      if (!defined_[static_cast<size_t>(id)] && !helper_[static_cast<size_t>(id)]) {
        return absl::InvalidArgumentError(
            Str("grammar: rule '", g_->rule(id).name, "' is used but not defined"));
      }
    }
    const auto it = ids_.find(std::string(root));
    if (it == ids_.end()) return absl::InvalidArgumentError(Str("grammar: no rule '", root, "' (the root)"));
    g_->set_root(it->second);
    return g_->Finalize();
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  bool Consume(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }

  absl::Status Error(std::string_view what) const {
    int64_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(Str("grammar: line ", line, " column ", column, ": ", what));
  }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        return;
      }
    }
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // True if a rule definition (`name ::=`) starts here: the current rule ends.
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\n' || text_[p] == '\r')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  int32_t RuleId(const std::string& name) {
    auto [it, inserted] = ids_.try_emplace(name, g_->num_rules());
    if (inserted) {
      g_->AddRule(name);
      defined_.push_back(false);
      helper_.push_back(false);
      quantifier_.push_back('\0');
    }
    return it->second;
  }

  // Bounds what a grammar may grow to while it is parsed (repetitions multiply it), so that a
  // hostile one fails fast instead of after allocating it.
  absl::Status Grow(int64_t elements, int64_t rules = 0) {
    elements_ += elements;
    if (elements_ > Grammar::kMaxElements || g_->num_rules() + rules > Grammar::kMaxRules) {
      return Error(Str("the grammar is too large (over ", Grammar::kMaxElements, " elements or ",
                       Grammar::kMaxRules, " rules)"));
    }
    return absl::OkStatus();
  }

  int32_t Helper(std::string_view what, char quantifier = '\0') {
    const int32_t id = g_->AddRule(Str(current_, "::", what, g_->num_rules()));
    defined_.push_back(true);
    helper_.push_back(true);
    quantifier_.push_back(quantifier);
    return id;
  }

  GrammarElement RuleElement(int32_t id) { return {GrammarElement::Kind::kRule, id}; }
  GrammarElement ByteElement(const ByteSet& set) { return {GrammarElement::Kind::kBytes, g_->ByteSetIndex(set)}; }

  absl::Status ParseAlternatives(std::vector<GrammarSequence>* out, int depth) {
    if (depth > kMaxNesting) return Error(Str("groups nested deeper than ", kMaxNesting));
    out->emplace_back();
    while (true) {
      SkipSpace();
      if (Peek() == ')' && depth == 0) return Error("unexpected ')'");
      if (AtEnd() || Peek() == ')' || AtRuleStart()) return absl::OkStatus();
      if (Peek() == '|') {
        ++pos_;
        out->emplace_back();
        continue;
      }
      GrammarSequence item;
      PD_RETURN_IF_ERROR(ParseItem(&item, depth));
      PD_RETURN_IF_ERROR(Grow(static_cast<int64_t>(item.size())));
      GrammarSequence& seq = out->back();
      seq.insert(seq.end(), item.begin(), item.end());
    }
  }

  absl::Status ParseItem(GrammarSequence* out, int depth) {
    PD_RETURN_IF_ERROR(ParsePrimary(out, depth));
    while (true) {  // Postfix operators (x** is x* repeated: allowed, as GBNF does).
      const char c = Peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        PD_RETURN_IF_ERROR(Grow(2 * static_cast<int64_t>(out->size()) + 2, 1));
        *out = c == '?' ? Optional(*out) : c == '*' ? Star(*out) : Plus(*out);
      } else if (c == '{') {
        ++pos_;
        int64_t m = 0, n = 0;
        bool bounded = true;
        PD_RETURN_IF_ERROR(ParseCount(&m));
        n = m;
        if (Peek() == ',') {
          ++pos_;
          SkipSpace();
          if (Peek() == '}') {
            bounded = false;
          } else {
            PD_RETURN_IF_ERROR(ParseCount(&n));
          }
        }
        SkipSpace();
        if (!Consume("}")) return Error("expected '}' closing a repetition");
        if (bounded && n < m) return Error(Str("repetition {", m, ",", n, "}: the maximum is below the minimum"));
        PD_RETURN_IF_ERROR(Repeat(out, m, bounded ? n : -1));
      } else {
        return absl::OkStatus();
      }
    }
  }

  absl::Status ParseCount(int64_t* v) {
    SkipSpace();
    if (!(Peek() >= '0' && Peek() <= '9')) return Error("expected a repetition count");
    *v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      *v = *v * 10 + (Peek() - '0');
      ++pos_;
      if (*v > kMaxRepeat) return Error(Str("repetition count over ", kMaxRepeat));
    }
    SkipSpace();
    return absl::OkStatus();
  }

  // The quantifiers build helper rules; one applied to an already quantified sequence (x+*,
  // (x*)+, (x?)*: directly or through a group) is folded into one, so the grammar matches the
  // same strings without the nested nullable repetitions whose parse stacks grow exponentially.
  GrammarSequence Optional(const GrammarSequence& x) {
    if (IsQuantified(x, '*')) return x;                             // (y*)? = y*
    if (int32_t star = PlusStar(x); star >= 0) return {RuleElement(star)};  // (y+)? = y*
    if (IsQuantified(x, '?')) return x;                             // (y?)? = y?
    const int32_t h = Helper("opt", '?');
    g_->rule(h).alternatives = {x, {}};
    return {RuleElement(h)};
  }
  GrammarSequence Star(const GrammarSequence& x) {
    if (IsQuantified(x, '*')) return x;                             // (y*)* = y*
    if (int32_t star = PlusStar(x); star >= 0) return {RuleElement(star)};  // (y+)* = y*
    if (IsQuantified(x, '?')) return Star(g_->rule(x[0].index).alternatives[0]);  // (y?)* = y*
    const int32_t h = Helper("star", '*');
    GrammarSequence again = x;
    again.push_back(RuleElement(h));
    g_->rule(h).alternatives = {std::move(again), {}};
    return {RuleElement(h)};
  }
  GrammarSequence Plus(const GrammarSequence& x) {
    if (IsQuantified(x, '*') || PlusStar(x) >= 0) return x;  // (y*)+ = y*, (y+)+ = y+
    if (IsQuantified(x, '?')) return Star(x);                // (y?)+ = y*
    GrammarSequence out = x;
    const GrammarSequence star = Star(x);
    out.insert(out.end(), star.begin(), star.end());
    return out;
  }
  // x is one reference to a helper Star or Optional made ('*' or '?').
  bool IsQuantified(const GrammarSequence& x, char q) const {
    return x.size() == 1 && x[0].kind == GrammarElement::Kind::kRule &&
           quantifier_[static_cast<size_t>(x[0].index)] == q;
  }
  // If x is what Plus made (y then y*), the y* helper; else -1.
  int32_t PlusStar(const GrammarSequence& x) const {
    if (x.size() < 2 || !IsQuantified({x.back()}, '*')) return -1;
    const GrammarSequence& again = g_->rule(x.back().index).alternatives[0];  // y, then the helper
    return again == x ? x.back().index : -1;
  }
  // x{m,n} (n < 0: unbounded): m copies, then n - m nested optional ones.
  absl::Status Repeat(GrammarSequence* x, int64_t m, int64_t n) {
    const int64_t copies = std::max(m, n) + 1;
    PD_RETURN_IF_ERROR(Grow(copies * static_cast<int64_t>(std::max<size_t>(1, x->size())), n < 0 ? 1 : n - m));
    GrammarSequence out;
    for (int64_t i = 0; i < m; ++i) out.insert(out.end(), x->begin(), x->end());
    if (n < 0) {
      const GrammarSequence star = Star(*x);
      out.insert(out.end(), star.begin(), star.end());
    } else if (n > m) {
      // O_k ::= x O_(k+1) | "" ... the last: x | "".
      int32_t next = -1;
      for (int64_t k = n - m; k >= 1; --k) {
        const int32_t h = Helper("upto");
        GrammarSequence body = *x;
        if (next >= 0) body.push_back(RuleElement(next));
        g_->rule(h).alternatives = {std::move(body), {}};
        next = h;
      }
      out.push_back(RuleElement(next));
    }
    *x = std::move(out);
    return absl::OkStatus();
  }

  absl::Status ParsePrimary(GrammarSequence* out, int depth) {
    const char c = Peek();
    if (c == '"' || c == '\'') {
      ++pos_;
      while (true) {
        if (AtEnd()) return Error("unterminated string");
        if (Peek() == c) {
          ++pos_;
          return absl::OkStatus();
        }
        uint32_t cp = 0;
        PD_RETURN_IF_ERROR(ParseChar(&cp));
        uint8_t buf[4];
        const int len = EncodeUtf8(cp, buf);
        for (int i = 0; i < len; ++i) {
          ByteSet set;
          set.set(buf[i]);
          out->push_back(ByteElement(set));
        }
      }
    }
    if (c == '[') {
      ++pos_;
      const bool negated = Consume("^");
      CodeRanges ranges;
      while (true) {
        if (AtEnd()) return Error("unterminated character class");
        if (Peek() == ']') {
          ++pos_;
          break;
        }
        uint32_t lo = 0, hi = 0;
        PD_RETURN_IF_ERROR(ParseChar(&lo));
        hi = lo;
        if (Peek() == '-' && Peek(1) != ']' && Peek(1) != '\0') {
          ++pos_;
          PD_RETURN_IF_ERROR(ParseChar(&hi));
          if (hi < lo) return Error("character range out of order");
        }
        ranges.push_back({lo, hi});
      }
      ranges = NormalizeRanges(std::move(ranges));
      if (negated) ranges = ComplementRanges(ranges);
      return ClassElements(ranges, out);
    }
    if (c == '.') {
      ++pos_;
      return ClassElements(NormalizeRanges({{0, kMaxCodePoint}}), out);
    }
    if (c == '(') {
      ++pos_;
      std::vector<GrammarSequence> alternatives;
      PD_RETURN_IF_ERROR(ParseAlternatives(&alternatives, depth + 1));
      SkipSpace();
      if (!Consume(")")) return Error("expected ')'");
      if (alternatives.size() == 1) {
        *out = std::move(alternatives[0]);
      } else {
        const int32_t h = Helper("group");
        g_->rule(h).alternatives = std::move(alternatives);
        out->push_back(RuleElement(h));
      }
      return absl::OkStatus();
    }
    if (IsNameChar(c)) {
      out->push_back(RuleElement(RuleId(ParseName())));
      return absl::OkStatus();
    }
    if (AtEnd()) return Error("unexpected end of the grammar");
    return Error(Str("unexpected '", std::string(1, c), "'"));
  }

  // A class: its code points' UTF-8 byte sequences, factored like an automaton (as RE2 compiles
  // classes): alternatives grouped by their first byte range, each group's continuations one
  // rule (shared by the groups whose continuations are the same), and the groups with the same
  // continuation merged into one byte set. A class of many ranges (Python's \w, ~700) thus starts
  // with a few dozen alternatives instead of thousands of parse stacks.
  absl::Status ClassElements(const CodeRanges& ranges, GrammarSequence* out) {
    std::vector<ByteRangeSequence> seqs;
    for (const auto& [lo, hi] : ranges) Utf8Sequences(lo, hi, &seqs);
    if (seqs.empty()) return Error("the character class matches nothing");
    absl::flat_hash_map<std::vector<ByteRangeSequence>, int32_t> shared;
    std::vector<GrammarSequence> alternatives;
    PD_RETURN_IF_ERROR(FactorClass(std::move(seqs), &shared, &alternatives));
    if (alternatives.size() == 1) {
      *out = std::move(alternatives[0]);
      return absl::OkStatus();
    }
    const int32_t h = Helper("class");
    g_->rule(h).alternatives = std::move(alternatives);
    out->push_back(RuleElement(h));
    return absl::OkStatus();
  }

  // The alternatives matching exactly the byte strings of `seqs` (non-empty sequences).
  absl::Status FactorClass(std::vector<ByteRangeSequence> seqs,
                           absl::flat_hash_map<std::vector<ByteRangeSequence>, int32_t>* shared,
                           std::vector<GrammarSequence>* alternatives) {
    std::sort(seqs.begin(), seqs.end());
    // First byte range -> the continuations after it (empty: the sequence ends there).
    std::vector<std::pair<ByteRange, std::vector<ByteRangeSequence>>> groups;
    for (ByteRangeSequence& seq : seqs) {
      const ByteRange first = seq[0];
      if (groups.empty() || groups.back().first != first) groups.push_back({first, {}});
      groups.back().second.emplace_back(seq.begin() + 1, seq.end());
    }
    // Continuation rule (-1: none) -> the bytes that lead into it.
    std::vector<std::pair<int32_t, ByteSet>> by_rest;
    for (auto& [first, rests] : groups) {
      int32_t rest = -1;
      std::vector<ByteRangeSequence> tails;
      for (ByteRangeSequence& r : rests) {
        if (!r.empty()) tails.push_back(std::move(r));
      }
      if (!tails.empty()) {
        if (tails.size() != rests.size()) return Error("a character class's sequences overlap");
        auto it = shared->find(tails);
        if (it != shared->end()) {
          rest = it->second;
        } else {
          std::vector<GrammarSequence> inner;
          PD_RETURN_IF_ERROR(FactorClass(tails, shared, &inner));
          rest = Helper("class");
          g_->rule(rest).alternatives = std::move(inner);
          shared->emplace(std::move(tails), rest);
        }
      }
      ByteSet bytes;
      for (int b = first.first; b <= first.second; ++b) bytes.set(static_cast<size_t>(b));
      auto slot = std::find_if(by_rest.begin(), by_rest.end(), [&](const auto& e) { return e.first == rest; });
      if (slot == by_rest.end()) {
        by_rest.push_back({rest, bytes});
      } else {
        slot->second |= bytes;
      }
    }
    for (const auto& [rest, bytes] : by_rest) {
      GrammarSequence alt = {ByteElement(bytes)};
      if (rest >= 0) alt.push_back(RuleElement(rest));
      alternatives->push_back(std::move(alt));
    }
    PD_RETURN_IF_ERROR(Grow(static_cast<int64_t>(alternatives->size()) * 2, 1));
    return absl::OkStatus();
  }

  // One code point of a string or class: UTF-8 as written, or an escape.
  absl::Status ParseChar(uint32_t* cp) {
    const auto byte = [&](size_t i) { return static_cast<uint8_t>(text_[i]); };
    if (Peek() == '\\') {
      ++pos_;
      const char e = Peek();
      ++pos_;
      switch (e) {
        case 'n': *cp = '\n'; return absl::OkStatus();
        case 'r': *cp = '\r'; return absl::OkStatus();
        case 't': *cp = '\t'; return absl::OkStatus();
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
          *cp = static_cast<uint32_t>(e);
          return absl::OkStatus();
        case 'x': return ParseHex(2, cp);
        case 'u': return ParseHex(4, cp);
        case 'U': return ParseHex(8, cp);
        default:
          --pos_;
          return Error(Str("unknown escape '\\", std::string(1, e), "'"));
      }
    }
    const uint8_t b0 = byte(pos_);
    const int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + static_cast<size_t>(len) > text_.size()) return Error("invalid UTF-8");
    uint32_t v = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const uint8_t b = byte(pos_ + static_cast<size_t>(i));
      if ((b & 0xC0) != 0x80) return Error("invalid UTF-8");
      v = (v << 6) | (b & 0x3F);
    }
    pos_ += static_cast<size_t>(len);
    *cp = v;
    return absl::OkStatus();
  }

  absl::Status ParseHex(int digits, uint32_t* cp) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = Peek();
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) return Error(Str("expected ", digits, " hex digits"));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return Error("escape is not a code point");
    *cp = v;
    return absl::OkStatus();
  }

  std::string_view text_;
  Grammar* g_;
  size_t pos_ = 0;
  int64_t elements_ = 0;
  std::string current_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  std::vector<bool> defined_, helper_;
  std::vector<char> quantifier_;  // '*' or '?' for a helper Star or Optional made, per rule.
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> ParseGrammar(std::string_view text, std::string_view root) {
  if (text.size() > kMaxGrammarBytes) {
    return absl::InvalidArgumentError(
        Str("the grammar is ", text.size(), " bytes, over the limit of ", kMaxGrammarBytes));
  }
  auto g = std::make_shared<Grammar>();
  Parser p(text, g.get());
  PD_RETURN_IF_ERROR(p.Parse(root));
  return std::shared_ptr<const Grammar>(std::move(g));
}

std::string GrammarLiteral(std::string_view bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20 || b == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace pdserve::structured
