// One worker's engine: model weights, KV pool, block manager, scheduler, model runner and
// sampler, driven step by step. `pdserve generate` runs it directly; the decode and prefill
// services will drive it from their scheduler threads.
//
// Not thread-safe: every method is called from the one thread that owns the engine.
#ifndef PDSERVE_COMMON_ENGINE_LLM_ENGINE_H_
#define PDSERVE_COMMON_ENGINE_LLM_ENGINE_H_

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "common/engine/engine_options.h"
#include "common/engine/kv_offload.h"
#include "common/engine/model_runner.h"
#include "common/engine/scheduler.h"
#include "common/engine/sequence.h"
#include "common/kvcache/block_manager.h"
#include "common/kvcache/kv_pool.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/sampling/sampler.h"

namespace pdserve {

struct TokenOutput {
  int32_t token;
  float logprob;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// The finish reason of a constrained request that reached a dead end: no token of the
// vocabulary continues its output and the constraint cannot end there (documented in the guide's
// structured outputs, docs/guide/api.md; the OpenAI API passes it through as finish_reason).
inline constexpr char kFinishConstraintDeadEnd[] = "constraint_dead_end";

// What one step produced for one request.
struct RequestOutput {
  std::string request_id;
  // New this step: 0 or 1, more when speculative drafts were accepted; inline, so a plain
  // decode step's output costs no allocation.
  absl::InlinedVector<TokenOutput, 1> tokens;
  bool finished = false;
  // "stop", "length", "abort" or kFinishConstraintDeadEnd when finished.
  std::string finish_reason;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;        // Prompt tokens served from the prefix cache.
  bool first_token = false;         // tokens[0] is the first this engine produced for it.
  double ttft_seconds = 0;          // Arrival to first token (set from the first token on).
  double e2e_seconds = 0;           // Arrival to now.
  double itl_seconds = 0;           // Since the previous token (0 for the first).
  // Phases, set on the finished output (vLLM's definitions): arrival to first scheduled, first
  // scheduled to first token, first to last token. A remote prefill is scheduled when reserved.
  double queue_seconds = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Per-request choices beyond sampling.
struct RequestOptions {
  // Keep the blocks of a finished request until ReleaseHeld (a prefill worker still sending its
  // pages).
  bool hold_blocks_after_finish = false;
  // Output tokens generated before (elsewhere) for this request: recomputed with the prompt and
  // counted as output (max_tokens, penalties, the seeded sampler's position), never returned
  // again. The continuation equals an uninterrupted run.
  std::vector<int32_t> resume_output;
};

// A decode worker's reservation for a prompt whose KV a prefill worker will write.
struct RemotePrefillPlan {
  std::vector<BlockId> blocks;  // The whole prompt's block table.
  int64_t cached_tokens = 0;    // Leading tokens already in this pool (their blocks come first).
  // The KV cache tiers hold the blocks that follow: they are being loaded into the reservation,
  // and TakeTierReservations reports when, with the cached tokens then. Ask the prefill worker
  // for the pages after those.
  bool tier_loading = false;
};

// A remote prefill's reservation whose tier load has ended (LLMEngine::TakeTierReservations).
struct TierReservation {
  std::string request_id;
  int64_t cached_tokens = 0;  // Leading prompt tokens in the pool now: the pool's and the tiers'.
};

struct EngineStats {
  int64_t steps = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens_computed = 0;
  int64_t generated_tokens = 0;
  // Speculative decoding (vLLM's spec_decode counters): verification steps of a request with a
  // draft, drafted tokens, accepted tokens, and accepted tokens by their position in the draft.
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::array<int64_t, SpeculativeOptions::kMaxTokens> spec_accepted_by_position{};
  // Structured outputs: constraints compiled (cache misses), and token masks computed against
  // looked up (a lookup that finds the mask of its matcher state computed before is a hit).
  int64_t structured_compiled = 0, structured_masks_computed = 0, structured_mask_lookups = 0;
  int64_t structured_masks_overlapped = 0;  // Of those computed, during a forward pass.
  // Where the steps' time went (cumulative), each part timed on its own: the whole of Step; the
  // model's forward pass; sampling + output records; and the scheduler's own work before the
  // forward pass (choosing the batch, reserving blocks, building the batch) and after it
  // (advancing sequences, hashing and publishing full blocks to the prefix cache).
  double step_seconds = 0, forward_seconds = 0, sample_seconds = 0, schedule_seconds = 0;
  // The forward passes' time by phase, where the backend times them (ModelRunner::phase_seconds).
  ForwardPhaseSeconds forward_phase_seconds{};
  KvCacheStats kv;
  // KV cache tiers (EngineOptions::kv_tiers): this engine's offers and loads, and each tier's
  // own counters by name, in order (shared by the process's engines).
  KvOffloadStats offload;
  std::vector<std::pair<std::string, KvTierStats>> tiers;
};

// EngineOptions::kv_tier_load's rule: loading `blocks` blocks at `seconds_per_block` behind
// `pending_blocks` already queued is done no later than computing their `block_tokens` tokens each
// at `seconds_per_token`; true while either figure is unknown (0).
bool TierLoadPays(int64_t blocks, int64_t pending_blocks, double seconds_per_block, int64_t block_tokens,
                  double seconds_per_token);

class LLMEngine {
 public:
  // Loads config.json, generation_config.json (extra EOS ids) and the weights from `model_dir`.
  static absl::StatusOr<std::unique_ptr<LLMEngine>> Create(const std::string& model_dir,
                                                           const EngineOptions& options);
  // A model of `config`'s shape with ModelWeights::Synthetic's weights for `seed`: in host memory
  // for the cpu backend, made in device memory by a device backend. For benchmarks without a
  // checkpoint (bench-engine --random-weights); EOS ids are the config's.
  static absl::StatusOr<std::unique_ptr<LLMEngine>> CreateSynthetic(const ModelConfig& config,
                                                                    const EngineOptions& options,
                                                                    uint64_t seed);

  // InvalidArgument naming the field (empty prompt, token id outside the vocabulary, prompt
  // longer than max_model_len, bad sampling parameters); AlreadyExists for a duplicate id.
  absl::Status AddRequest(const std::string& request_id, std::vector<int32_t> prompt,
                          const SamplingParams& params, const RequestOptions& options = {});
  // Runs one scheduling step and appends what it produced to *outputs.
  absl::Status Step(std::vector<RequestOutput>* outputs);
  // Frees the request's blocks now; its final output (finish_reason "abort") is appended.
  bool Abort(const std::string& request_id, std::vector<RequestOutput>* outputs);
  // True while any request is waiting, running or awaiting its remote prefill.
  bool HasUnfinished() const { return sequences_.size() > held_; }
  // True when a Step would do work.
  bool HasScheduledWork() const;

  // Remote prefill, decode side. Reserve: validates like AddRequest, reuses this pool's cached
  // prefix, allocates the rest of the prompt's blocks (ResourceExhausted, nothing changed, when
  // they are not free now). Complete: the prompt's pages have arrived; `first` is the token the
  // prefill worker sampled and `prefill_cached_tokens` how many prompt tokens it took from its own
  // prefix cache (usage reports those as cached: they were not computed for this request); the
  // request joins the running batch. Abort frees a reservation. With KV cache tiers, the blocks
  // after the pool's prefix that the tiers hold are loaded into the reservation first
  // (RemotePrefillPlan::tier_loading; Step polls the load, TakeTierReservations reports its end).
  absl::StatusOr<RemotePrefillPlan> ReserveForRemotePrefill(const std::string& request_id,
                                                            std::vector<int32_t> prompt,
                                                            const SamplingParams& params);
  absl::Status CompleteRemotePrefill(const std::string& request_id, const SampledToken& first,
                                     int64_t prefill_cached_tokens,
                                     std::vector<RequestOutput>* outputs);
  // The reservations whose tier loads ended since the last call (aborted ones are not reported).
  void TakeTierReservations(std::vector<TierReservation>* out) {
    out->insert(out->end(), tier_reservations_.begin(), tier_reservations_.end());
    tier_reservations_.clear();
  }
  // Leading prompt tokens this pool's prefix cache holds now (a probe: nothing changes), for the
  // base model or the LoRA adapter of that name.
  int64_t CachedPrefixTokens(const std::vector<int32_t>& prompt,
                             std::string_view lora_name = {}) const;

  // Blocks of a running, reserved or held request (empty if unknown).
  absl::Span<const BlockId> BlockTable(const std::string& request_id) const;
  // Frees a held request's blocks.
  void ReleaseHeld(const std::string& request_id);
  // Ends the request like Abort (no output) but keeps its blocks, held under a new name that
  // this returns ("" if unknown), so the request id can be used again at once. For a reservation
  // a one-sided transport may still write into: ReleaseHeld(name) once it is quiescent.
  std::string AbortKeepingBlocks(const std::string& request_id,
                                 std::vector<RequestOutput>* outputs = nullptr);

  // Called during Step after each layer's KV is in the pool, with the step's schedule (sequences'
  // num_computed is still the value before the step).
  using LayerObserver = std::function<void(int64_t layer, const SchedulerOutput& schedule)>;
  void SetLayerObserver(LayerObserver observer);

  // Called with each sampled row's raw logits before sampling (tests and debugging).
  using LogitsObserver = std::function<void(const std::string& request_id, const float* logits,
                                            int64_t vocab)>;
  void SetLogitsObserver(LogitsObserver observer) { logits_observer_ = std::move(observer); }

  const ModelConfig& config() const { return weights_->config(); }
  const ModelWeights& weights() const { return *weights_; }
  // Where the runner reads the weights a decode step streams (ModelRunner::DecodeWeightMemory).
  std::vector<absl::Span<const std::byte>> decode_weight_memory() const {
    return runner_->DecodeWeightMemory();
  }
  const std::vector<int32_t>& eos_token_ids() const { return eos_ids_; }
  int64_t max_model_len() const { return max_model_len_; }
  const KvCacheSpec& kv_spec() const { return pool_->spec(); }
  // The linear layers' arithmetic, resolved from EngineOptions::compute_dtype (never kAuto).
  ComputeDType compute_dtype() const { return compute_dtype_; }
  // The KV pool, for the KV transport to register (pages are read and written in place).
  KvPool& kv_pool() { return *pool_; }
  // Where the pool's pages are: the KvPool's memory, or the runner's device copy of it.
  uint8_t* kv_memory() { return runner_->kv_memory() != nullptr ? runner_->kv_memory() : pool_->data(); }
  // "cpu" or "cuda": the device the pool lives on (EngineOptions::backend).
  const std::string& device() const { return options_.backend; }
  // What fixes its outputs' bits (WorkerInfo::numerics): "f32", "bf16/vdpbf16ps", "bf16/amx",
  // "cuda/bf16".
  std::string numerics() const;
  int64_t num_kv_blocks() const { return pool_->num_blocks(); }
  const SpeculativeOptions& speculative() const { return options_.speculative; }
  // The LoRA adapters requests may name (EngineOptions::lora); null: none.
  const std::shared_ptr<LoraRegistry>& lora() const { return options_.lora; }
  int64_t max_loras() const { return options_.max_loras; }
  // The LoRA adapters of the running requests and of the waiting ones, each once, sorted (vLLM's
  // lora_requests_info; a load report's, not Stats': O(requests)). Empty without adapters.
  void LoraRequestNames(std::vector<std::string>* running, std::vector<std::string>* waiting) const;
  EngineStats Stats() const;
  bool has_kv_tier() const { return offload_ != nullptr; }
  // With kv_tier_load faster: the tiers' measured seconds a block exceed computing a block now,
  // so a request's prefix they hold would be computed (routers count none of it as cached).
  bool TierLoadsDeclined() const {
    return offload_ != nullptr && tier_load_faster_ &&
           !TierLoadPays(1, 0, offload_->SecondsPerBlock(), blocks_->block_size(), prefill_token_seconds_);
  }
  // KV cache tiers: waits until the blocks queued for the tiers so far are stored (tests; a
  // worker draining before it exits). Nothing without a tier.
  void FlushKvOffload() {
    if (offload_ != nullptr) offload_->FlushStores();
  }
  // Prefix-cache changes since the last call (EngineOptions::enable_kv_events), and the full set.
  // KV cache tiers with KV events on: events of stores still to be drained (a worker idle
  // meanwhile polls for them).
  bool TierEventsPending() const { return offload_ != nullptr && offload_->EventsPending(); }
  // With KV cache tiers, the tiers' events follow the pool's (each with its tier's medium).
  void DrainKvEvents(std::vector<KvEvent>* out) {
    blocks_->DrainEvents(out);
    if (offload_ != nullptr) offload_->DrainEvents(out);
  }
  std::vector<BlockHash> IndexedBlockHashes() const { return blocks_->IndexedHashes(); }

 private:
  LLMEngine() = default;
  // The rest of Create once weights_ and eos_ids_ are set.
  static absl::StatusOr<std::unique_ptr<LLMEngine>> Build(std::unique_ptr<LLMEngine> e,
                                                          std::optional<uint64_t> synthetic_seed);
  RequestOutput MakeOutput(const Sequence& seq) const;
  // Appends a sampled token; returns the finish reason, or nullopt to continue.
  std::optional<std::string> Append(Sequence* seq, const SampledToken& t, RequestOutput* out);
  void Finish(Sequence* seq);
  // Proposes seq->draft for this step (speculative decoding on, the request decoding).
  void Draft(Sequence* seq);
  // Drafts for every decoding request, then trims them to what the step cost model says pays.
  void DraftForRunning();
  // After a step: what its drafts saved and cost, to the ledger that pauses drafting that does
  // not pay (with the step budget on).
  void AccountDrafts(int64_t drafted, int64_t accepted, double sample_seconds, int64_t sampled_rows);
  // After a step that verified a draft: counters, the request's acceptance, and its blocks.
  void EndSpeculation(Sequence* seq, int64_t drafted, int64_t accepted, bool finished);
  // Hashes and publishes the full blocks whose KV is computed.
  void PublishComputed(Sequence* seq);
  // Publishes seq's first hashes.size() blocks, offering those it newly indexed to the tiers.
  void Publish(Sequence* seq, absl::Span<const BlockHash> hashes);
  // KV cache tiers: starts loading the prompt's next prefix blocks from the tiers when they have
  // some (its blocks reserved, the sequence parked until the load ends); false: nothing to load
  // (or no room), admit as usual.
  bool StartTierLoad(Sequence* seq, bool at_head = false);
  // The waiting queue's head, if it never asked the tiers (no room at its arrival): asks them now
  // that its blocks may fit (StartTierLoad, keeping its place).
  void TierLoadsForWaiting();
  // Loads the tiers' run of the prompt's blocks after the first `cached_blocks` (the sequence
  // holds the whole prompt's blocks) up to its last full block before the final token; false
  // when the tiers hold none of them.
  bool LoadFromTiers(Sequence* seq, int64_t cached_blocks);
  // The finished loads: each sequence joins the waiting queue with its loaded blocks computed (a
  // remote prefill's reservation is reported by TakeTierReservations instead).
  void PollTierLoads();
  // What fixes a block's bits (KvTierKey::model): the model's shape and weights, the arithmetic,
  // the pool's layout.
  BlockHash TierModelKey() const;
  // The tokens for the block manager's stored events (EngineOptions::kv_event_tokens), or none.
  absl::Span<const int32_t> EventTokens(const Sequence& seq) const;
  // Suffix decoding: indexes a finished request's output for later requests' drafts.
  void RememberOutput(const Sequence& seq);
  // Marks `out` finished with `reason` and sets its phase times.
  void SetFinished(const Sequence& seq, const std::string& reason, RequestOutput* out) const;
  absl::Status ValidateRequest(const std::string& request_id, const std::vector<int32_t>& prompt,
                               const SamplingParams& params) const;
  // A request naming a LoRA adapter (params.lora_name): the adapter from EngineOptions::lora,
  // held by the sequence, and its blocks' hash root. NotFound naming lora_name for an adapter
  // not served; ResourceExhausted when it cannot be loaded now (--max-cpu-loras, all in use).
  absl::Status AttachLora(Sequence* seq);
  // Structured outputs: the request's matcher (params.constraint), advanced over its output so
  // far; InvalidArgument naming the constraint's field where it does not compile or the output
  // so far leaves its language (`what` names where that output came from).
  absl::Status StartConstraint(Sequence* seq, const char* what);
  // Loads the tokenizer's token bytes at the first constrained request.
  absl::Status EnsureConstraintCache();
  // EngineOptions::overlap_masks resolved for this engine (and a constrained request seen).
  bool OverlapMasks() const;
  std::unique_ptr<Sequence> NewSequence(const std::string& request_id, std::vector<int32_t> prompt,
                                        const SamplingParams& params);

  EngineOptions options_;
  std::string model_dir_;  // Empty for synthetic weights.
  std::unique_ptr<structured::ConstraintCache> constraints_;
  std::shared_ptr<const ModelWeights> weights_;  // Shared with the process's other engines.
  std::vector<int32_t> eos_ids_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<KvPool> pool_;
  // After pool_: destroyed first, so its loads in flight end before the pool's memory does.
  std::unique_ptr<KvOffload> offload_;
  // Loads in flight by sequence id: the request's name (a new one if aborted while loading: its
  // blocks are then held until the load ends, then freed).
  absl::flat_hash_map<uint64_t, std::string> tier_loads_;
  std::vector<TierReservation> tier_reservations_;  // Loads ended, not yet taken.
  // EngineOptions::kv_tier_load resolved: load only what loads sooner than it computes.
  bool tier_load_faster_ = false;
  double prefill_token_seconds_ = 0;  // Measured (with tier_load_faster_), 0 before.
  int64_t tier_loads_declined_ = 0;
  static constexpr int64_t kTierProbeEvery = 16;
  std::vector<std::pair<BlockHash, BlockId>> indexed_;  // Publish's scratch.
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  ComputeDType compute_dtype_ = ComputeDType::kF32;
  Sampler sampler_;
  LogitsObserver logits_observer_;
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> sequences_;
  absl::flat_hash_map<std::string, RequestOptions> options_by_request_;
  size_t held_ = 0;  // Finished requests whose blocks are kept (still in sequences_).
  uint64_t next_kept_ = 0;  // Names of AbortKeepingBlocks' held sequences.
  LayerObserver layer_observer_;
  SeqId next_seq_id_ = 1;
  EngineStats stats_;
  // Per-step buffers, reused so a steady decode step does not allocate.
  SchedulerOutput schedule_;
  ForwardBatch batch_;
  std::vector<float> logits_;
  std::vector<Sequence*> sampled_;
  std::vector<Sequence*> cold_masks_;  // Constrained rows whose mask the step must compute.
  // Suffix decoding: the outputs of this engine's recent requests, and a draft buffer.
  std::unique_ptr<SuffixTrie> recent_outputs_;
  // Finished requests' suffix indexes, kept for the next requests' (a new index in fresh memory
  // cost ~1 ms of page faults per request on a VM, a probe step after a paused stretch several
  // plain steps: every request that started during the pause indexes its prompt then).
  std::vector<std::unique_ptr<SuffixTrie>> spare_suffixes_;
  std::vector<int32_t> suffix_scratch_;
  StepCostModel step_cost_;  // Decode steps' time by rows (speculation's draft budget).
  DraftLedger draft_ledger_;  // Whether drafting pays as a whole (with the step budget).
  double draft_seconds_ = 0;  // The step's drafting.
  int64_t draft_decoding_ = 0;  // The step's decoding sequences.
  std::vector<Sequence*> drafting_;
  std::vector<double> draft_acceptance_;
  std::vector<int32_t> draft_lengths_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_LLM_ENGINE_H_
