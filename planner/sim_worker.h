// One simulated engine for the capacity planner's simulator (issue 40): the engine's own
// Scheduler and BlockManager (continuous batching, chunked prefill, the prefix cache, preemption,
// remote-prefill reservations) over sequences of token ids, with no model. A step is chosen by the
// real Scheduler (BeginStep); its forward pass is not run: the caller charges the step's cost on
// its virtual clock and then applies what the step did (EndStep), the way LLMEngine::Step applies
// a forward pass's results (num_computed advanced, full blocks published, one token appended to
// each sequence whose last chunk ran, finished sequences removed or held). The tokens appended are
// the caller's (Options::next_token): scheduling never depends on their values except through the
// prefix cache of later prompts that contain them.
//
// What it leaves out: speculative drafts, structured outputs, stop tokens (a request ends at its
// output length or at max_model_len), aborts. sim_worker_test.cc checks its decisions step for
// step against LLMEngine on a real model.
//
// Not thread-safe: one simulation thread owns it.
#ifndef PDSERVE_PLANNER_SIM_WORKER_H_
#define PDSERVE_PLANNER_SIM_WORKER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/engine/scheduler.h"
#include "common/engine/sequence.h"
#include "common/kvcache/block_manager.h"
#include "planner/step_time.h"

namespace pdserve {

class SimWorker {
 public:
  struct Options {
    int64_t num_blocks = 1024;
    int64_t block_size = 16;
    int64_t max_num_seqs = 64;
    int64_t max_num_batched_tokens = 2048;
    int64_t max_model_len = 1 << 20;
    bool enable_prefix_caching = true;
    // The token a request's `position`-th generated token is (request ids are the caller's).
    std::function<int32_t(int64_t request, int64_t position)> next_token;
    // Called with each block newly indexed in the prefix cache (KV cache tiers: what a worker
    // offers them); null: none.
    std::function<void(const BlockHash&)> on_publish;
  };

  // What a step (or a completed remote prefill) did to one request.
  struct Emitted {
    int64_t request = 0;
    int32_t token = 0;
    bool first = false;       // Its first generated token.
    bool finished = false;    // Its last: removed (or held, see Add).
    int64_t cached_prompt_tokens = 0;  // first: prompt tokens its first admission found cached.
  };

  explicit SimWorker(Options options);
  ~SimWorker();

  // A request whose prompt is computed here. hold_after_finish: its blocks stay allocated after
  // it ends until ReleaseHeld (a prefill worker's pages still being sent). `prompt_hashes`: the
  // hashes of the prompt's full blocks if the caller has them (the router hashed it), so the
  // prompt is not hashed again; empty: hashed here when it is admitted.
  void Add(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
           bool hold_after_finish = false, std::vector<BlockHash> prompt_hashes = {});
  // As LLMEngine::StartTierLoad: a request whose prompt's blocks after its cached prefix
  // (`pool_cached_blocks` of them, CachedPrefixTokens's) the KV cache tiers hold; its blocks are
  // reserved now and it waits, parked, until FinishLoad says `loaded_blocks` of them arrived.
  // False (nothing changed) when its blocks are not free now: Add it instead.
  bool AddLoading(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens, bool hold_after_finish,
                  std::vector<BlockHash> prompt_hashes, int64_t pool_cached_blocks);
  // The load ended: the blocks are computed KV (published), the request joins the waiting queue.
  void FinishLoad(int64_t request, int64_t loaded_blocks);
  // Remote prefill, decode side, as DecodeWorker::StartRemote: refuses (false, nothing changed)
  // when the pool is busy (free + cached blocks minus the prompt's would leave fewer than one per
  // running sequence) or the blocks are not there; otherwise reserves the prompt's blocks, reusing
  // its cached prefix, and returns the cached tokens in *cached_tokens.
  bool Reserve(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
               int64_t* cached_tokens, std::vector<BlockHash> prompt_hashes = {});
  // The prompt's pages arrived with the first token: as LLMEngine::CompleteRemotePrefill.
  Emitted CompleteRemote(int64_t request, int32_t first_token, int64_t prefill_cached_tokens);
  void ReleaseHeld(int64_t request);
  // Leading prompt tokens this worker's prefix cache holds (a probe).
  int64_t CachedPrefixTokens(const std::vector<BlockHash>& prompt_hashes, int64_t prompt_len) const;

  // Chooses the next step with the Scheduler; false (and nothing to charge) when there is none.
  // *shape: what the step runs, for the cost model.
  bool BeginStep(StepShape* shape);
  // Applies the step BeginStep chose; appends what it did per request to *out.
  void EndStep(std::vector<Emitted>* out);
  // The step in flight (between BeginStep and EndStep): its chunks and preemptions.
  const SchedulerOutput& schedule() const { return schedule_; }

  bool HasWork() const { return scheduler_.num_running() > 0 || scheduler_.num_waiting() > 0; }
  int64_t num_running() const { return scheduler_.num_running(); }
  int64_t num_waiting() const { return scheduler_.num_waiting(); }
  int64_t num_preemptions() const { return scheduler_.num_preemptions(); }
  KvCacheStats kv() const { return blocks_.Stats(); }
  int64_t block_size() const { return options_.block_size; }
  int64_t sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  Sequence* NewSequence(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens);
  // A new sequence holding its whole prompt's blocks by `plan` (a reservation, a tier load): its
  // cached prefix computed, the rest allocated.
  Sequence* AdmitWhole(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
                       std::vector<BlockHash> hashes, const BlockManager::AdmitPlan& plan);
  // Publishes seq's computed full blocks (their hashes already extended).
  void Publish(Sequence* seq);
  // Publishes `hashes` (seq's leading blocks), telling Options::on_publish of the new ones.
  void PublishHashes(Sequence* seq, absl::Span<const BlockHash> hashes);
  // Gives seq->tokens room for its output (before its first token).
  void ReserveOutput(Sequence* seq) const;
  // Appends the next token; true when the request ends with it.
  bool Append(Sequence* seq, int32_t token);
  void Finish(Sequence* seq);

  Options options_;
  BlockManager blocks_;
  Scheduler scheduler_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  absl::flat_hash_map<int64_t, bool> hold_;  // Requests added with hold_after_finish.
  int block_shift_ = -1;  // log2(block_size) when it is a power of two.
  SeqId next_seq_id_ = 1;
  SchedulerOutput schedule_;
  std::vector<Sequence*> sampled_;  // This step's sequences whose last chunk runs.
  std::vector<Sequence*> publish_;  // EndStep: this step's sequences that filled a block.
  std::vector<std::pair<BlockHash, BlockId>> indexed_;  // PublishHashes' scratch.
};

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_SIM_WORKER_H_
