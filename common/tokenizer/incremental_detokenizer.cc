#include "common/tokenizer/incremental_detokenizer.h"

#include <cctype>
#include <optional>

#include "common/base/status_macros.h"

namespace pdserve {
namespace {

// How many context ids to keep: enough for any decoder's look-behind (a multi-byte character
// split over byte-fallback tokens needs at most 4).
constexpr size_t kContextIds = 5;

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

// A SentencePiece byte-fallback token ("<0xE4>"). The ByteFallback decoder decodes a whole run of
// them at once and, when the run is not valid UTF-8, turns every byte of it into U+FFFD, so a
// character that looked complete can still become U+FFFD while the run goes on.
bool IsByteFallbackToken(const Tokenizer& tokenizer, int32_t id) {
  const std::optional<std::string> token = tokenizer.IdToToken(id);
  return token.has_value() && token->size() == 6 && token->compare(0, 3, "<0x") == 0 &&
         std::isxdigit(static_cast<unsigned char>((*token)[3])) &&
         std::isxdigit(static_cast<unsigned char>((*token)[4])) && (*token)[5] == '>';
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
  // A context that ends inside a character (a prompt cut mid-character, or the last bytes a model
  // emitted before a resumption) would let the first output id complete that character, and the
  // output's text would then not start where the context's decode ends. Such trailing ids are
  // dropped: the text is the output's own decode.
  while (!ids_.empty()) {
    auto text = tokenizer_->Decode(ids_, options_);
    if (text.ok() && !EndsWithReplacement(*text)) break;
    ids_.pop_back();
  }
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
  // A byte-fallback run is decided only when a token that is not part of it arrives (skipped
  // special tokens vanish before decoding: the run goes on across them).
  if (!final) {
    for (size_t i = ids_.size(); i > read_offset_; --i) {
      if (options_.skip_special_tokens && tokenizer_->IsSpecial(ids_[i - 1])) continue;
      if (IsByteFallbackToken(*tokenizer_, ids_[i - 1])) return std::string();
      break;
    }
  }
  const bool extends = new_text.compare(0, prefix_text.size(), prefix_text) == 0;
  // Nothing new yet (e.g. a skipped special token): keep the window.
  if (!final && extends && new_text.size() == prefix_text.size()) return std::string();
  size_t cut = prefix_text.size();
  if (!extends) {
    // The window's decode does not extend what was emitted from it. No supported decoder does
    // this from a clean window start (the tests check it); should one, go on from the next
    // character boundary, so the stream stays valid UTF-8 and keeps flowing.
    while (cut < new_text.size() && (static_cast<uint8_t>(new_text[cut]) & 0xc0) == 0x80) ++cut;
  }
  std::string delta = cut < new_text.size() ? new_text.substr(cut) : std::string();
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

}  // namespace pdserve
