// One request's state inside an engine. Owned by the LLMEngine; the Scheduler holds pointers.
#ifndef PDSERVE_COMMON_ENGINE_SEQUENCE_H_
#define PDSERVE_COMMON_ENGINE_SEQUENCE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/speculative.h"
#include "common/engine/suffix_trie.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_manager.h"
#include "common/model/lora_adapter.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/structured/token_constraint.h"

namespace pdserve {

using Clock = std::chrono::steady_clock;

struct Sequence {
  // What the scheduler and the step's bookkeeping read for every running sequence every step
  // comes first, in two cache lines (the simulator's step cost at batch 256 is mostly cache
  // misses on these; a test in scheduler_test.cc keeps them there).
  SeqId id = 0;
  std::vector<int32_t> tokens;  // Prompt, then generated tokens.
  int64_t num_prompt_tokens = 0;
  int64_t num_computed = 0;     // Tokens whose KV is in the pool.
  int32_t kv_slot = -1;         // BlockManager::Reserve's hint (where its block table was).
  int64_t num_cached_prompt_tokens = 0;  // Prefix-cache hits at first admission (usage).
  // Speculative decoding: tokens proposed to follow tokens.back(), verified by the next step
  // (the scheduler trims or drops them to fit; empty unless the sequence is decoding).
  std::vector<int32_t> draft;
  SamplingParams params;        // params.max_tokens first.
  bool admitted_before = false;
  bool held = false;  // Finished, blocks kept for a transfer still in flight.
  bool tier_loading = false;  // Its next prefix blocks are being loaded from the KV tiers.
  // The tiers were asked for its prefix (at arrival, or at the head of the waiting queue once
  // the pool had room): not asked again.
  bool tier_tried = false;
  bool remote_reserved = false;  // Reserved for a remote prefill (not yet completed).
  int64_t num_preemptions = 0;
  std::vector<BlockHash> block_hashes;  // Of the full blocks of `tokens`, chained from:
  BlockHash hash_root;                  // Its adapter's kv_root (base model: zero).
  std::shared_ptr<const LoraAdapter> lora;  // params.lora_name's, held while the request runs.
  std::string request_id;
  SamplerState sampler;
  // The draft's step input (tokens.back() then the draft), and the request's acceptance so far.
  std::vector<int32_t> step_tokens;
  SpeculationState speculation;
  std::unique_ptr<SuffixTrie> suffix;  // Suffix decoding: the request's own tokens, indexed
  int64_t suffix_indexed = 0;          // up to here.
  SuffixTrie::Cursor recent_match;     // Where its tokens matched the worker's recent outputs.
  // Structured outputs: where its output stands in params.constraint (null: unconstrained).
  std::unique_ptr<structured::TokenConstraint> constraint;
  Clock::time_point arrival;
  Clock::time_point first_scheduled;
  Clock::time_point first_token;
  Clock::time_point last_token;

  int64_t num_generated() const {
    return static_cast<int64_t>(tokens.size()) - num_prompt_tokens;
  }
  int64_t num_uncomputed() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SEQUENCE_H_
