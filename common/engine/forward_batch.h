// The typed message from the scheduler to a ModelRunner: which tokens of which sequences to run
// this step. Each sequence brings its own block table; chunks of a long prompt and single decode
// tokens mix freely in one batch.
#ifndef PDSERVE_COMMON_ENGINE_FORWARD_BATCH_H_
#define PDSERVE_COMMON_ENGINE_FORWARD_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace pdserve {

class LoraAdapter;

struct SequenceChunk {
  absl::Span<const int32_t> tokens;       // The tokens to run (a prefill chunk or 1 decode token).
  int64_t start_position = 0;             // Position of tokens[0]; positions before it are cached.
  absl::Span<const int32_t> block_table;  // Must cover start_position + tokens.size() tokens.
  // Return logits of the last num_logits tokens: 0 none, 1 a prefill's last chunk or a decode
  // token, more a decode token followed by speculative drafts (each position's next token).
  int32_t num_logits = 0;
  // The LoRA adapter this sequence runs with (its projections add B (A x)); null: the base model.
  // The engine's sequence holds it for the step.
  const LoraAdapter* lora = nullptr;
};

struct ForwardBatch {
  std::vector<SequenceChunk> sequences;

  int64_t num_tokens() const {
    int64_t n = 0;
    for (const SequenceChunk& s : sequences) n += static_cast<int64_t>(s.tokens.size());
    return n;
  }
  int64_t num_logit_rows() const {
    int64_t n = 0;
    for (const SequenceChunk& s : sequences) n += s.num_logits;
    return n;
  }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_FORWARD_BATCH_H_
