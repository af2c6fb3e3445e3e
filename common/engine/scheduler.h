// Decides what runs each step (continuous batching, chunked prefill, prefix reuse, preemption).
//
// Policy, as vLLM v1: running sequences first, oldest first, each taking what it still needs (one
// token when decoding, the next chunk when prefilling) from a per-step token budget. When the KV
// pool cannot hold a running sequence's next tokens, the newest running sequence is preempted: its
// blocks are freed and it goes back to the front of the queue, to be recomputed later (its
// published blocks usually survive in the prefix cache). Nothing is ever dropped. New sequences
// are admitted first-come-first-served while budget, sequence slots and blocks last, and never in
// a step that had to preempt. A waiting sequence that already holds blocks (its prompt's KV was
// written by a prefill worker) joins without a new allocation.
//
// Not thread-safe: owned by the engine's scheduler thread.
#ifndef PDSERVE_COMMON_ENGINE_SCHEDULER_H_
#define PDSERVE_COMMON_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "common/engine/sequence.h"
#include "common/kvcache/block_manager.h"

namespace pdserve {

struct SchedulerOptions {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  // False: no sequence ever carries a draft (speculative decoding off), so Schedule skips its
  // pass over the drafts (a cache line per running sequence per step).
  bool drafts = true;
  // LoRA adapters among the running sequences at most (vLLM's --max-loras; 0: no bound). A
  // waiting sequence whose adapter would exceed it waits (first come, first served) until a
  // running sequence of another adapter ends.
  int64_t max_loras = 0;
};

struct ScheduledChunk {
  Sequence* seq;
  // Starting at seq->num_computed; for a decode with a draft, 1 + seq->draft.size().
  int64_t num_tokens;
};

// The scheduler's decision for one step.
struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;
  int64_t num_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, BlockManager* blocks);

  void AddWaiting(Sequence* seq);
  // The waiting queue's head (null when empty), taken out of it, or put back at its front.
  Sequence* waiting_head() const { return waiting_.empty() ? nullptr : waiting_.front(); }
  void PopWaitingHead() { waiting_.pop_front(); }
  void PushWaitingFront(Sequence* seq) { waiting_.push_front(seq); }
  // Fills *out (cleared first); reuses its storage so a steady decode loop does not allocate.
  void Schedule(SchedulerOutput* out);
  // Removes a finished or aborted sequence and frees its blocks.
  void Remove(Sequence* seq);
  // Removes a finished sequence but leaves its blocks allocated (the caller frees them later).
  void RemoveKeepBlocks(Sequence* seq);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // Running sequences, oldest first (the engine drafts speculative tokens for them).
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  void Preempt(Sequence* seq);
  // Extends decode chunks by their sequences' drafts where budget and blocks allow; drops the rest.
  void ScheduleDrafts(int64_t& budget, SchedulerOutput* out);
  bool Admit(Sequence* seq, int64_t budget, SchedulerOutput* out);
  // Whether `seq` may run beside the running sequences under max_loras.
  bool LoraFits(const Sequence* seq) const;
  // Frees blocks of waiting sequences (newest first, the head last) until `head` is admitted.
  bool ReleaseWaitingHolders(Sequence* head, int64_t budget, SchedulerOutput* out);

  const SchedulerOptions options_;
  BlockManager* blocks_;
  std::vector<Sequence*> running_;  // Oldest first.
  std::deque<Sequence*> waiting_;
  int64_t num_preemptions_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SCHEDULER_H_
