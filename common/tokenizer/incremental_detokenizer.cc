#include "common/tokenizer/incremental_detokenizer.h"

#include "common/base/status_macros.h"

namespace pdserve {
namespace {

// How many context ids to keep: enough for any decoder's look-behind (a multi-byte character
// split over byte-fallback tokens needs at most 4).
constexpr size_t kContextIds = 5;

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer,
                                               bool skip_special_tokens,
                                               absl::Span<const int32_t> context)
    : tokenizer_(tokenizer) {
  options_.skip_special_tokens = skip_special_tokens;
  options_.clean_up_tokenization_spaces = false;
  const size_t keep = std::min(context.size(), kContextIds);
  ids_.assign(context.end() - keep, context.end());
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

absl::StatusOr<std::string> IncrementalDetokenizer::Next(int32_t id) {
  ids_.push_back(id);
  auto delta = Step(/*final=*/false);
  if (!delta.ok()) ids_.pop_back();
  return delta;
}

std::string IncrementalDetokenizer::Finish() {
  auto delta = Step(/*final=*/true);
  return delta.ok() ? *delta : std::string();
}

absl::StatusOr<std::string> IncrementalDetokenizer::Step(bool final) {
  if (read_offset_ == ids_.size()) return std::string();
  const absl::Span<const int32_t> all(ids_);
  PD_ASSIGN_OR_RETURN(std::string prefix_text,
                      tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                                         options_));
  PD_ASSIGN_OR_RETURN(std::string new_text,
                      tokenizer_->Decode(all.subspan(prefix_offset_), options_));
  if (!final && EndsWithReplacement(new_text)) return std::string();  // Incomplete character.
  if (new_text.size() <= prefix_text.size() || new_text.compare(0, prefix_text.size(), prefix_text) != 0) {
    // Nothing new yet (e.g. a skipped special token), or the window's decode is not an extension
    // of its prefix; keep waiting with the same window.
    if (!final) return std::string();
  }
  std::string delta =
      new_text.size() > prefix_text.size() ? new_text.substr(prefix_text.size()) : std::string();
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

}  // namespace pdserve
