#include "common/structured/regex_grammar.h"

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <utility>
#include <vector>

#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/structured/utf8_ranges.h"

namespace pdserve::structured {
namespace {

constexpr int kMaxNesting = 256;
// A pattern's length: every character becomes a grammar element of ~13 bytes of text, so a
// pattern of a few hundred KB costs a request a second of compiling (many under a sanitizer).
constexpr size_t kMaxPatternBytes = size_t{1} << 16;

struct Node {
  enum class Kind { kClass, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kConcat;
  CodeRanges ranges;        // kClass.
  std::vector<Node> kids;   // kConcat, kAlt; kRepeat: one.
  int64_t min = 0, max = -1;  // kRepeat; max < 0: unbounded.
};

Node Class(CodeRanges r) {
  Node n;
  n.kind = Node::Kind::kClass;
  n.ranges = NormalizeRanges(std::move(r));
  return n;
}

#include "common/structured/regex_classes.inc"

template <size_t N>
CodeRanges Table(const std::pair<uint32_t, uint32_t> (&t)[N]) {
  return CodeRanges(std::begin(t), std::end(t));
}

// \d \w \s as Python's re reads them in a str pattern (Unicode): its decimal digits, its word
// characters (str.isalnum() and '_'), its whitespace.
const CodeRanges kDigits = Table(kPythonDigit);
const CodeRanges kWord = Table(kPythonWord);
const CodeRanges kSpace = Table(kPythonSpace);

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : p_(p) {}

  absl::StatusOr<Node> Parse() {
    if (Peek() == '^') {
      ++pos_;
    } else if (p_.substr(0, 2) == "\\A") {
      pos_ += 2;
    }
    PD_ASSIGN_OR_RETURN(Node n, Alternatives(0));
    if (pos_ < p_.size()) return Error("unbalanced ')'");
    return n;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(Str("regex: ", what, " at offset ", pos_));
  }
  char Peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0'; }
  bool AtEnd() const { return pos_ >= p_.size(); }
  // `$` or `\Z` closing the pattern (or an alternative reaching its end).
  bool AtEndAnchor() const {
    if (Peek() == '$' && pos_ + 1 == p_.size()) return true;
    return p_.substr(pos_) == "\\Z";
  }

  absl::StatusOr<Node> Alternatives(int depth) {
    if (depth > kMaxNesting) return Error(Str("groups nested deeper than ", kMaxNesting));
    Node alt;
    alt.kind = Node::Kind::kAlt;
    while (true) {
      PD_ASSIGN_OR_RETURN(Node seq, Sequence(depth));
      alt.kids.push_back(std::move(seq));
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  absl::StatusOr<Node> Sequence(int depth) {
    Node seq;
    seq.kind = Node::Kind::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (AtEndAnchor()) {
        pos_ = p_.size();
        break;
      }
      PD_ASSIGN_OR_RETURN(Node atom, Atom(depth));
      PD_RETURN_IF_ERROR(Quantifiers(&atom));
      seq.kids.push_back(std::move(atom));
    }
    if (seq.kids.size() == 1) return std::move(seq.kids[0]);
    return seq;
  }

  // At most one quantifier (and its lazy `?`) per atom: a second is "multiple repeat", as Python's
  // re says, so the tree's depth is bounded by the groups' nesting, not by the pattern's length.
  absl::Status Quantifiers(Node* atom) {
    int64_t min = 0, max = -1;
    const size_t start = pos_;
    if (!Quantifier(&min, &max)) return absl::OkStatus();
    if (max >= 0 && max < min) {
      pos_ = start;
      return Error("a repetition's maximum is below its minimum");
    }
    if (Peek() == '?') {
      ++pos_;  // Lazy: the same language.
    } else if (Peek() == '+') {
      return Error("possessive quantifiers are not supported");
    }
    int64_t unused_min, unused_max;
    const size_t second = pos_;
    if (Quantifier(&unused_min, &unused_max)) {
      pos_ = second;
      return Error("multiple repeat");
    }
    Node rep;
    rep.kind = Node::Kind::kRepeat;
    rep.min = min;
    rep.max = max;
    rep.kids.push_back(std::move(*atom));
    *atom = std::move(rep);
    return absl::OkStatus();
  }

  // A quantifier (* + ? {m} {m,} {,n} {m,n}) at pos_, consumed; false (nothing consumed) if none.
  bool Quantifier(int64_t* min, int64_t* max) {
    *min = 0;
    *max = -1;
    switch (Peek()) {
      case '*': ++pos_; return true;
      case '+': ++pos_; *min = 1; return true;
      case '?': ++pos_; *max = 1; return true;
      case '{': return ParseBraces(min, max);
      default: return false;
    }
  }

  // {m}, {m,}, {,n}, {m,n}; false (nothing consumed) where Python reads a literal '{'.
  bool ParseBraces(int64_t* min, int64_t* max) {
    size_t i = pos_ + 1;
    auto number = [&](int64_t* v) {
      const size_t from = i;
      *v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9' && i - from < 9) *v = *v * 10 + (p_[i++] - '0');
      return i > from;
    };
    int64_t m = 0, n = -1;
    const bool has_m = number(&m);
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(&n)) n = -1;
    } else if (has_m) {
      n = m;
    } else {
      return false;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    pos_ = i + 1;
    *min = m;
    *max = n;
    return true;
  }

  absl::StatusOr<Node> Atom(int depth) {
    const char c = Peek();
    if (c == '(') {
      ++pos_;
      if (Peek() == '?') {
        if (Peek(1) == ':') {
          pos_ += 2;
        } else if (Peek(1) == 'P' && Peek(2) == '<') {
          PD_RETURN_IF_ERROR(SkipGroupName(3));
        } else if (Peek(1) == '<' && Peek(2) != '=' && Peek(2) != '!') {
          PD_RETURN_IF_ERROR(SkipGroupName(2));
        } else {
          return Error("lookarounds, inline flags and (?...) extensions other than (?:...) and "
                       "named groups are not supported");
        }
      }
      PD_ASSIGN_OR_RETURN(Node inner, Alternatives(depth + 1));
      if (Peek() != ')') return Error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (c != '{') return Error("nothing to repeat");
      int64_t m, n;
      const size_t save = pos_;
      if (ParseBraces(&m, &n)) {
        pos_ = save;
        return Error("nothing to repeat");
      }
    }
    if (c == '^') return Error("'^' is supported only at the start of the pattern");
    if (c == '$') return Error("'$' is supported only at the end of the pattern");
    if (c == '.') {
      ++pos_;
      return Class({{0, '\n' - 1}, {'\n' + 1, kMaxCodePoint}});
    }
    if (c == '[') return ClassExpression();
    if (c == '\\') {
      CodeRanges r;
      PD_RETURN_IF_ERROR(Escape(/*in_class=*/false, &r));
      return Class(std::move(r));
    }
    uint32_t cp = 0;
    PD_RETURN_IF_ERROR(CodePoint(&cp));
    return Class({{cp, cp}});
  }

  absl::Status SkipGroupName(size_t skip) {
    pos_ += skip;
    while (!AtEnd() && Peek() != '>') ++pos_;
    if (AtEnd()) return Error("unterminated group name");
    ++pos_;
    return absl::OkStatus();
  }

  absl::StatusOr<Node> ClassExpression() {
    ++pos_;  // '['
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodeRanges r;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      CodeRanges item;
      if (Peek() == '\\') {
        PD_RETURN_IF_ERROR(Escape(/*in_class=*/true, &item));
      } else if (Peek() == '[' && (Peek(1) == ':' || Peek(1) == '=' || Peek(1) == '.')) {
        return Error("POSIX classes ([:alpha:]) are not supported");
      } else {
        uint32_t cp = 0;
        PD_RETURN_IF_ERROR(CodePoint(&cp));
        item = {{cp, cp}};
      }
      // A range: single code point '-' single code point (a '-' before ']' is literal).
      if (item.size() == 1 && item[0].first == item[0].second && Peek() == '-' && Peek(1) != ']' &&
          pos_ + 1 < p_.size()) {
        ++pos_;
        CodeRanges hi;
        if (Peek() == '\\') {
          PD_RETURN_IF_ERROR(Escape(true, &hi));
        } else {
          uint32_t cp = 0;
          PD_RETURN_IF_ERROR(CodePoint(&cp));
          hi = {{cp, cp}};
        }
        if (hi.size() != 1 || hi[0].first != hi[0].second) return Error("bad character range");
        if (hi[0].first < item[0].first) return Error("character range out of order");
        item = {{item[0].first, hi[0].first}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    r = NormalizeRanges(std::move(r));
    if (negated) r = ComplementRanges(r);
    return Class(std::move(r));
  }

  absl::Status Hex(int digits, uint32_t* cp) {
    *cp = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = Peek();
      int v;
      if (h >= '0' && h <= '9') {
        v = h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v = h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v = h - 'A' + 10;
      } else {
        return Error(Str("expected ", digits, " hex digits"));
      }
      *cp = *cp * 16 + static_cast<uint32_t>(v);
      ++pos_;
    }
    if (*cp > kMaxCodePoint) return Error("code point past U+10FFFF");
    return absl::OkStatus();
  }

  absl::Status Escape(bool in_class, CodeRanges* out) {
    ++pos_;  // '\'
    if (AtEnd()) return Error("a trailing backslash");
    const char e = Peek();
    ++pos_;
    auto one = [&](uint32_t cp) {
      *out = {{cp, cp}};
      return absl::OkStatus();
    };
    switch (e) {
      case 'd': *out = kDigits; return absl::OkStatus();
      case 'w': *out = kWord; return absl::OkStatus();
      case 's': *out = kSpace; return absl::OkStatus();
      case 'D': *out = ComplementRanges(kDigits); return absl::OkStatus();
      case 'W': *out = ComplementRanges(kWord); return absl::OkStatus();
      case 'S': *out = ComplementRanges(kSpace); return absl::OkStatus();
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'a': return one('\a');
      case '0': return one(0);
      case 'x': { uint32_t cp = 0; PD_RETURN_IF_ERROR(Hex(2, &cp)); return one(cp); }
      case 'u': { uint32_t cp = 0; PD_RETURN_IF_ERROR(Hex(4, &cp)); return one(cp); }
      case 'U': { uint32_t cp = 0; PD_RETURN_IF_ERROR(Hex(8, &cp)); return one(cp); }
      case 'b':
        if (in_class) return one('\b');
        pos_ -= 2;
        return Error("word boundaries (\\b) are not supported");
      case 'B': case 'A': case 'Z': case 'z': case 'G':
        pos_ -= 2;
        return Error(Str("the anchor \\", std::string(1, e), " is supported only at the pattern's ends"));
      default:
        break;
    }
    if (e >= '1' && e <= '9') {
      pos_ -= 2;
      return Error("backreferences are not supported");
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      pos_ -= 2;
      return Error(Str("unknown escape \\", std::string(1, e)));
    }
    --pos_;
    uint32_t cp = 0;
    PD_RETURN_IF_ERROR(CodePoint(&cp));  // \. \( \\ and other punctuation: itself.
    return one(cp);
  }

  // One UTF-8 encoded code point of the pattern.
  absl::Status CodePoint(uint32_t* cp) {
    const auto b = static_cast<uint8_t>(Peek());
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > p_.size()) return Error("invalid UTF-8");
    *cp = len == 1 ? b : b & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto c = static_cast<uint8_t>(p_[pos_ + i]);
      if ((c >> 6) != 2) return Error("invalid UTF-8");
      *cp = (*cp << 6) | (c & 0x3F);
    }
    pos_ += static_cast<size_t>(len);
    return absl::OkStatus();
  }

  std::string_view p_;
  size_t pos_ = 0;
};

std::string Hex8(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(cp));
  return buf;
}

// The bytes of a JSON string's content for code point `cp` when it must be escaped there.
std::string JsonEscape(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '\b': return "\\b";
    case '\f': return "\\f";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      return buf;
    }
  }
}

bool JsonEscaped(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

class Printer {
 public:
  explicit Printer(const RegexOptions& options) : options_(options) {}

  absl::Status Print(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::Kind::kClass:
        return PrintClass(n.ranges, out);
      case Node::Kind::kConcat:
        if (n.kids.empty()) {
          *out += "\"\"";
          return absl::OkStatus();
        }
        *out += "(";
        for (size_t i = 0; i < n.kids.size(); ++i) {
          if (i > 0) *out += " ";
          PD_RETURN_IF_ERROR(Print(n.kids[i], out));
        }
        *out += ")";
        return absl::OkStatus();
      case Node::Kind::kAlt:
        *out += "(";
        for (size_t i = 0; i < n.kids.size(); ++i) {
          if (i > 0) *out += " | ";
          PD_RETURN_IF_ERROR(Print(n.kids[i], out));
        }
        *out += ")";
        return absl::OkStatus();
      case Node::Kind::kRepeat:
        *out += "(";
        PD_RETURN_IF_ERROR(Print(n.kids[0], out));
        *out += ")";
        if (n.max < 0) {
          *out += n.min == 0 ? "*" : n.min == 1 ? "+" : Str("{", n.min, ",}");
        } else if (n.min == 0 && n.max == 1) {
          *out += "?";
        } else {
          *out += Str("{", n.min, ",", n.max, "}");
        }
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  absl::Status PrintClass(CodeRanges r, std::string* out) {
    if (options_.json_string) {
      if (r.size() == 1 && r[0].first == r[0].second && JsonEscaped(r[0].first)) {
        *out += "\"";
        for (char c : JsonEscape(r[0].first)) *out += Hex8(static_cast<uint8_t>(c));
        *out += "\"";
        return absl::OkStatus();
      }
      CodeRanges keep;  // r minus the characters a JSON string escapes.
      const CodeRanges allowed = ComplementRanges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
      for (const auto& [lo, hi] : r) {
        for (const auto& [alo, ahi] : allowed) {
          const uint32_t a = std::max(lo, alo), b = std::min(hi, ahi);
          if (a <= b) keep.push_back({a, b});
        }
      }
      r = NormalizeRanges(std::move(keep));
    }
    if (r.empty()) {
      return absl::InvalidArgumentError(
          options_.json_string
              ? "regex: a character class matches only characters a JSON string escapes"
              : "regex: a character class matches nothing");
    }
    if (r.size() == 1 && r[0].first == r[0].second) {
      *out += Str("\"", Hex8(r[0].first), "\"");
      return absl::OkStatus();
    }
    *out += "[";
    for (const auto& [lo, hi] : r) {
      *out += Hex8(lo);
      if (hi != lo) *out += Str("-", Hex8(hi));
    }
    *out += "]";
    return absl::OkStatus();
  }

  RegexOptions options_;
};

}  // namespace

absl::StatusOr<std::string> RegexToGrammar(std::string_view pattern, const RegexOptions& options) {
  if (pattern.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(
        Str("regex: ", pattern.size(), " bytes, over the limit of ", kMaxPatternBytes));
  }
  PD_ASSIGN_OR_RETURN(Node n, RegexParser(pattern).Parse());
  std::string out;
  PD_RETURN_IF_ERROR(Printer(options).Print(n, &out));
  return out;
}

}  // namespace pdserve::structured
