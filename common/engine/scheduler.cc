#include "common/engine/scheduler.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"

#include "common/base/check.h"

namespace pdserve {

Scheduler::Scheduler(const SchedulerOptions& options, BlockManager* blocks)
    : options_(options), blocks_(blocks) {
  running_.reserve(options.max_num_seqs);
}

void Scheduler::AddWaiting(Sequence* seq) { waiting_.push_back(seq); }

void Scheduler::Preempt(Sequence* seq) {
  blocks_->Free(seq->id);
  seq->num_computed = 0;
  ++seq->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(seq);
}

void Scheduler::Schedule(SchedulerOutput* out) {
  out->chunks.clear();
  out->preempted.clear();
  out->num_tokens = 0;
  int64_t budget = options_.max_num_batched_tokens;

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int64_t n = std::min(seq->num_uncomputed(), budget);
    PD_CHECK(n > 0);
    bool self_preempted = false;
    while (!blocks_->Reserve(seq->id, seq->num_computed + n, &seq->kv_slot).ok()) {
      Sequence* victim = running_.back();
      running_.pop_back();
      Preempt(victim);
      out->preempted.push_back(victim);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    out->chunks.push_back({seq, n});
    budget -= n;
    ++i;
  }

  // Speculative tokens ride on the decode steps once every running sequence has its token, where
  // the budget and free blocks allow: a draft never preempts anyone.
  if (options_.drafts) ScheduleDrafts(budget, out);
  if (!out->preempted.empty()) {
    for (const ScheduledChunk& c : out->chunks) out->num_tokens += c.num_tokens;
    return;
  }
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    if (!LoraFits(seq)) break;  // First come, first served: it waits for an adapter's slot.
    if (!Admit(seq, budget, out)) {
      // First come, first served: no overtaking. But with nothing running, no block will ever be
      // freed except those that waiting sequences hold (prompts prefilled remotely): release the
      // newest such holders, then the head's own blocks, until the head fits.
      if (!running_.empty() || out->chunks.size() > 0 || !ReleaseWaitingHolders(seq, budget, out)) {
        break;
      }
    }
    waiting_.pop_front();
    running_.push_back(seq);
    budget -= out->chunks.back().num_tokens;
  }
  for (const ScheduledChunk& c : out->chunks) out->num_tokens += c.num_tokens;
}

void Scheduler::ScheduleDrafts(int64_t& budget, SchedulerOutput* out) {
  for (ScheduledChunk& c : out->chunks) {
    Sequence* seq = c.seq;
    if (seq->draft.empty()) continue;
    const int64_t k = std::min<int64_t>(static_cast<int64_t>(seq->draft.size()), budget);
    if (out->preempted.empty() && c.num_tokens == 1 && seq->num_uncomputed() == 1 && k > 0 &&
        blocks_->Reserve(seq->id, seq->num_computed + 1 + k, &seq->kv_slot).ok()) {
      seq->draft.resize(static_cast<size_t>(k));
      c.num_tokens += k;
      budget -= k;
    } else {
      seq->draft.clear();
    }
  }
  for (size_t i = out->chunks.size(); i < running_.size(); ++i) running_[i]->draft.clear();
}

bool Scheduler::LoraFits(const Sequence* seq) const {
  if (options_.max_loras <= 0 || seq->lora == nullptr) return true;
  // The distinct adapters running (at most max_loras of them: a short scan per admission).
  absl::InlinedVector<const LoraAdapter*, 8> seen;
  for (const Sequence* r : running_) {
    const LoraAdapter* a = r->lora.get();
    if (a == nullptr || std::find(seen.begin(), seen.end(), a) != seen.end()) continue;
    if (a == seq->lora.get()) return true;
    seen.push_back(a);
  }
  return static_cast<int64_t>(seen.size()) < options_.max_loras;
}

bool Scheduler::Admit(Sequence* seq, int64_t budget, SchedulerOutput* out) {
  seq->draft.clear();  // Drafts are for running sequences.
  const int64_t bs = blocks_->block_size();
  const int64_t len = static_cast<int64_t>(seq->tokens.size());
  if (blocks_->Has(seq->id)) {  // Prefilled elsewhere: its blocks are reserved already.
    const int64_t n = std::min(seq->num_uncomputed(), budget);
    if (n <= 0 || !blocks_->Reserve(seq->id, seq->num_computed + n, &seq->kv_slot).ok()) return false;
    out->chunks.push_back({seq, n});
    return true;
  }
  ExtendBlockHashes(seq->tokens, bs, &seq->block_hashes, seq->hash_root);
  // At least one token is always computed: its logits produce the next token.
  const int64_t max_cached_blocks = (len - 1) / bs;
  auto probe = blocks_->PlanAdmit(seq->block_hashes, max_cached_blocks, 0, 0);
  if (!probe.ok()) return false;
  const int64_t cached = probe->num_cached_tokens;
  const int64_t n = std::min(len - cached, budget);
  // Prefix-cache statistics count the prompt on its first admission only.
  const int64_t query = seq->admitted_before ? 0 : seq->num_prompt_tokens;
  auto plan = blocks_->PlanAdmit(seq->block_hashes, max_cached_blocks, cached + n, query);
  if (!plan.ok()) return false;
  PD_CHECK(plan->num_cached_tokens == cached);
  blocks_->CommitAdmit(seq->id, *plan, static_cast<int64_t>(seq->tokens.capacity()));
  seq->num_computed = cached;
  if (!seq->admitted_before) {
    seq->num_cached_prompt_tokens = std::min(cached, seq->num_prompt_tokens);
    seq->admitted_before = true;
    seq->first_scheduled = Clock::now();
  }
  out->chunks.push_back({seq, n});
  return true;
}

bool Scheduler::ReleaseWaitingHolders(Sequence* head, int64_t budget, SchedulerOutput* out) {
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    Sequence* victim = *it;
    if (victim == head || !blocks_->Has(victim->id)) continue;
    blocks_->Free(victim->id);
    victim->num_computed = 0;
    ++victim->num_preemptions;
    ++num_preemptions_;
    out->preempted.push_back(victim);
    if (Admit(head, budget, out)) return true;
  }
  if (blocks_->Has(head->id)) {
    blocks_->Free(head->id);
    head->num_computed = 0;
    ++head->num_preemptions;
    ++num_preemptions_;
    out->preempted.push_back(head);
    return Admit(head, budget, out);
  }
  return false;
}

void Scheduler::Remove(Sequence* seq) {
  blocks_->Free(seq->id);
  RemoveKeepBlocks(seq);
}

void Scheduler::RemoveKeepBlocks(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) {
    running_.erase(it);
    return;
  }
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
}

}  // namespace pdserve
