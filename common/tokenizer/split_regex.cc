#include "common/tokenizer/split_regex.h"

#include "common/base/strings.h"
#include "common/tokenizer/unicode.h"
#include "re2/re2.h"

namespace pdserve {
namespace {

// Unicode White_Space, as members of a character class.
constexpr std::string_view kWhitespaceMembers =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view kLookahead = R"(\s+(?!\S))";

absl::StatusOr<std::string> Translate(std::string_view p, bool* has_lookahead) {
  std::string out;
  bool in_class = false;
  *has_lookahead = false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!in_class && p.substr(i, kLookahead.size()) == kLookahead) {
      if (*has_lookahead) {
        return absl::UnimplementedError("pre-tokenizer regex uses `\\s+(?!\\S)` twice");
      }
      *has_lookahead = true;
      StrAppendTo(&out, "(?P<ws_lookahead>[", kWhitespaceMembers, "]+)");
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
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

SplitRegex::~SplitRegex() = default;

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Create(std::string_view pattern) {
  bool has_lookahead = false;
  auto translated = Translate(pattern, &has_lookahead);
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
  if (has_lookahead) {
    const auto& names = s->re_->NamedCapturingGroups();
    s->lookahead_group_ = names.at("ws_lookahead");
  }
  return s;
}

std::vector<std::pair<size_t, size_t>> SplitRegex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  const int ngroups = lookahead_group_ > 0 ? lookahead_group_ + 1 : 1;
  std::vector<re2::StringPiece> groups(ngroups);
  size_t pos = 0;
  const re2::StringPiece input(text.data(), text.size());
  while (pos < text.size()) {
    if (!re_->Match(input, pos, text.size(), RE2::UNANCHORED, groups.data(), ngroups)) break;
    size_t begin = groups[0].data() - text.data();
    size_t end = begin + groups[0].size();
    if (lookahead_group_ > 0 && groups[lookahead_group_].data() != nullptr && end < text.size()) {
      // `\s+(?!\S)` cannot end right before a non-space: give the last whitespace character back.
      size_t next = end;
      const uint32_t following = NextCodePoint(text, &next);
      if (!IsUnicodeWhitespace(following)) {
        size_t last = begin, p = begin;
        while (p < end) {
          last = p;
          NextCodePoint(text, &p);
        }
        if (last > begin) {
          end = last;
        }
        // A single whitespace before a non-space: the original alternative fails here and the
        // next one (`\s+` in every pattern we know) matches the same character, so keep it.
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
