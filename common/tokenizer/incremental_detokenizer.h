// Streaming detokenization: fed one id at a time, emits text as soon as it is decided. Every piece
// is valid UTF-8 (an invalid byte sequence is U+FFFD, an unfinished one waits and becomes U+FFFD
// at Finish), and everything it emits (Next calls, then Finish) concatenates to
// Decode(context + ids) minus Decode(context), for every supported tokenizer, spaces included;
// for byte-level tokenizers that is Decode(ids).
//
// Method (as vLLM's): decode a short window [prefix, end) and the same window without the newest
// ids [prefix, read); the difference is the new text unless it ends in an incomplete character
// (U+FFFD). The window starts where the last emission ended, so a decoder that treats its first
// token specially (Metaspace, Strip) treats both decodes alike. Clean-up of tokenization spaces
// is not applied (it is not a per-token operation).
//
// Not thread-safe: one per sequence. The Tokenizer must outlive it.
#ifndef PDSERVE_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define PDSERVE_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

class IncrementalDetokenizer {
 public:
  // `context`: ids already shown to the user (the prompt), used only so the first emitted token
  // decodes as it would in context (e.g. keeps its leading space). Only its tail is kept, and
  // only up to its last complete character: the output never completes a character the context
  // left unfinished.
  IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens,
                         absl::Span<const int32_t> context = {});

  // The text `id` completes; empty while a character is still incomplete. InvalidArgument for an
  // id outside the vocabulary (nothing is consumed).
  absl::StatusOr<std::string> Next(int32_t id);
  // Whatever is still pending (an incomplete character becomes U+FFFD).
  std::string Finish();

 private:
  absl::StatusOr<std::string> Step(bool final);

  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // Window start: text before it is already out.
  size_t read_offset_ = 0;    // Ids before it are reflected in the emitted text.
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
