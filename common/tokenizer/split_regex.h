// The pre-tokenizer regexes of tokenizer.json files (Oniguruma / fancy-regex syntax) run on RE2.
//
// RE2 differs in two ways that matter here, and this class bridges both:
//  - `\s` in RE2 is ASCII only; in these regexes it is Unicode White_Space. It is rewritten to an
//    explicit class.
//  - RE2 has no look-ahead. The one look-ahead these regexes use, `\s+(?!\S)` ("a run of
//    whitespace, but leave the last one to prefix the next word"), is matched as `\s+`; when a
//    match is all whitespace, longer than one character and followed by a non-space, and no
//    earlier alternative of the pattern matches at its start (so it is that alternative's), it is
//    shortened by one character.
// Matching asks RE2 for the whole match only, so it runs on RE2's DFA (captures would force the
// much slower NFA).
// Immutable after Create; thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_SPLIT_REGEX_H_
#define PDSERVE_COMMON_TOKENIZER_SPLIT_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}

namespace pdserve {

class SplitRegex {
 public:
  // InvalidArgument / Unimplemented naming the construct RE2 cannot run.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Create(std::string_view pattern);
  ~SplitRegex();

  // Byte ranges [begin, end) of successive non-overlapping matches in `text` (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  const std::string& translated() const { return translated_; }

 private:
  SplitRegex() = default;
  std::unique_ptr<re2::RE2> re_;
  // The alternatives before the emulated `\s+(?!\S)`, anchored; null when there is none.
  std::unique_ptr<re2::RE2> before_lookahead_;
  bool has_lookahead_ = false;
  std::string translated_;
};

// The GPT-2 pre-tokenizer pattern (what ByteLevel's use_regex means).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3's pattern (also Qwen2's but for `\p{N}{1,3}` vs `\p{N}`).
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_SPLIT_REGEX_H_
