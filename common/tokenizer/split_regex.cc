#include "common/tokenizer/split_regex.h"

#include <vector>

#include "common/base/strings.h"
#include "common/tokenizer/unicode.h"
#include "re2/re2.h"

namespace pdserve {
namespace {

// Unicode White_Space, as members of a character class.
constexpr std::string_view kWhitespaceMembers =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view kLookahead = R"(\s+(?!\S))";

// Translates to RE2 syntax. *lookahead_alternative is the index of the top-level alternative
// that was `\s+(?!\S)` (-1 if none); *alternatives receives the translated top-level
// alternatives.
absl::StatusOr<std::string> Translate(std::string_view p, int* lookahead_alternative,
                                      std::vector<std::string>* alternatives) {
  std::string out;
  bool in_class = false;
  int depth = 0;
  size_t alt_start = 0;
  *lookahead_alternative = -1;
  auto close_alternative = [&] {
    alternatives->push_back(out.substr(alt_start));
    alt_start = out.size() + 1;  // After the '|' about to be appended.
  };
  for (size_t i = 0; i < p.size(); ++i) {
    if (!in_class && p.substr(i, kLookahead.size()) == kLookahead) {
      const bool whole_alternative =
          depth == 0 && out.size() == alt_start &&
          (i + kLookahead.size() == p.size() || p[i + kLookahead.size()] == '|');
      if (*lookahead_alternative >= 0 || !whole_alternative) {
        return absl::UnimplementedError(
            "pre-tokenizer regex uses `\\s+(?!\\S)` other than as one top-level alternative");
      }
      *lookahead_alternative = static_cast<int>(alternatives->size());
      StrAppendTo(&out, "[", kWhitespaceMembers, "]+");
      i += kLookahead.size() - 1;
      continue;
    }
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        StrAppendTo(&out, in_class ? "" : "[", kWhitespaceMembers, in_class ? "" : "]");
      } else if (n == 'S') {
        if (in_class) {
          return absl::UnimplementedError("pre-tokenizer regex uses \\S inside a character class");
        }
        StrAppendTo(&out, "[^", kWhitespaceMembers, "]");
      } else if ((n == 'p' || n == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
        // A Unicode class \p{..}: copy it whole so its '}' is not taken for a quantifier's.
        const size_t close = p.find('}', i + 2);
        if (close == std::string_view::npos) {
          return absl::InvalidArgumentError("pre-tokenizer regex has an unclosed \\p{");
        }
        out.append(p.substr(i, close + 1 - i));
        i = close;
        continue;
      } else {
        out.push_back(c);
        out.push_back(n);
      }
      ++i;
      continue;
    }
    if (!in_class && (p.substr(i, 3) == "(?=" || p.substr(i, 3) == "(?!" ||
                      p.substr(i, 4) == "(?<=" || p.substr(i, 4) == "(?<!")) {
      return absl::UnimplementedError(
          "pre-tokenizer regex uses a look-around other than \\s+(?!\\S)");
    }
    if (!in_class && (c == '+' || c == '*' || c == '?' || c == '}') && i + 1 < p.size() &&
        p[i + 1] == '+') {
      return absl::UnimplementedError("pre-tokenizer regex uses a possessive quantifier");
    }
    if (c == '[' && !in_class) {
      in_class = true;
    } else if (c == ']' && in_class) {
      in_class = false;
    } else if (!in_class && c == '(') {
      ++depth;
    } else if (!in_class && c == ')') {
      --depth;
    } else if (!in_class && depth == 0 && c == '|') {
      close_alternative();
    }
    out.push_back(c);
  }
  alternatives->push_back(out.substr(alt_start));
  return out;
}

}  // namespace

SplitRegex::~SplitRegex() = default;

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Create(std::string_view pattern) {
  int lookahead_alternative = -1;
  std::vector<std::string> alternatives;
  auto translated = Translate(pattern, &lookahead_alternative, &alternatives);
  if (!translated.ok()) return translated.status();
  std::unique_ptr<SplitRegex> s(new SplitRegex());
  s->translated_ = *translated;
  RE2::Options options;
  options.set_log_errors(false);
  options.set_encoding(RE2::Options::EncodingUTF8);
  s->re_ = std::make_unique<re2::RE2>(s->translated_, options);
  if (!s->re_->ok()) {
    return absl::InvalidArgumentError(Str("pre-tokenizer regex '", pattern,
                                          "' does not compile: ", s->re_->error()));
  }
  s->has_lookahead_ = lookahead_alternative >= 0;
  if (lookahead_alternative > 0) {
    std::string before;
    for (int i = 0; i < lookahead_alternative; ++i) {
      StrAppendTo(&before, i == 0 ? "" : "|", alternatives[i]);
    }
    s->before_lookahead_ = std::make_unique<re2::RE2>(Str("(?:", before, ")"), options);
    if (!s->before_lookahead_->ok()) {
      return absl::InternalError(Str("pre-tokenizer regex '", pattern,
                                     "': cannot split its alternatives: ",
                                     s->before_lookahead_->error()));
    }
  }
  return s;
}

std::vector<std::pair<size_t, size_t>> SplitRegex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  re2::StringPiece match;
  size_t pos = 0;
  const re2::StringPiece input(text.data(), text.size());
  while (pos < text.size()) {
    if (!re_->Match(input, pos, text.size(), RE2::UNANCHORED, &match, 1)) break;
    size_t begin = match.data() - text.data();
    size_t end = begin + match.size();
    if (has_lookahead_ && end < text.size() && end - begin > 1) {
      // Is this `\s+(?!\S)` stopping right before a non-space? Then it must give its last
      // whitespace character back -- unless an earlier alternative produced the match.
      size_t next = end;
      if (!IsUnicodeWhitespace(NextCodePoint(text, &next))) {
        bool all_space = true;
        size_t last = begin;
        for (size_t p = begin; p < end;) {
          last = p;
          if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) {
            all_space = false;
            break;
          }
        }
        if (all_space && last > begin &&
            !(before_lookahead_ &&
              before_lookahead_->Match(input, begin, text.size(), RE2::ANCHOR_START, nullptr, 0))) {
          end = last;
        }
      }
    }
    if (end == begin) {  // Empty match: step one character to make progress.
      NextCodePoint(text, &end);
      pos = end;
      continue;
    }
    out.emplace_back(begin, end);
    pos = end;
  }
  return out;
}

}  // namespace pdserve
