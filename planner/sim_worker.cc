#include "planner/sim_worker.h"

#include <algorithm>
#include <utility>

#include "common/base/check.h"
#include "common/kvcache/block_hash.h"

namespace pdserve {

SimWorker::SimWorker(Options options)
    : options_(std::move(options)),
      blocks_(options_.num_blocks, options_.block_size, options_.enable_prefix_caching),
      scheduler_(SchedulerOptions{options_.max_num_seqs, options_.max_num_batched_tokens, /*drafts=*/false},
                 &blocks_) {
  PD_CHECK(options_.next_token != nullptr);
  const int64_t bs = options_.block_size;
  if ((bs & (bs - 1)) == 0) block_shift_ = __builtin_ctzll(static_cast<uint64_t>(bs));
}

SimWorker::~SimWorker() = default;

void SimWorker::ReserveOutput(Sequence* seq) const {
  constexpr int64_t kReservedOutputTokens = 4096;  // As LLMEngine::NewSequence.
  const int64_t most = std::min<int64_t>(
      seq->num_prompt_tokens + std::min<int64_t>(seq->params.max_tokens, kReservedOutputTokens),
      options_.max_model_len);
  seq->tokens.reserve(static_cast<size_t>(std::max<int64_t>(most, seq->num_prompt_tokens)));
}

inline bool SimWorker::Append(Sequence* seq, int32_t token) {
  seq->tokens.push_back(token);
  if (seq->num_generated() >= seq->params.max_tokens) return true;
  return static_cast<int64_t>(seq->tokens.size()) >= options_.max_model_len;
}

Sequence* SimWorker::NewSequence(int64_t request, std::vector<int32_t> prompt,
                                 int64_t output_tokens) {
  auto seq = std::make_unique<Sequence>();
  // The caller's request ids are unique on a worker: they name the block manager's sequences too.
  seq->id = request;
  seq->num_prompt_tokens = static_cast<int64_t>(prompt.size());
  seq->params.max_tokens = static_cast<int32_t>(output_tokens);
  seq->tokens = std::move(prompt);
  // LLMEngine::NewSequence reserves the output's room here; the simulator does it with the first
  // token (ReserveOutput): a request queued behind a full batch (thousands, in an overloaded
  // simulation) then holds only its prompt, and an arrival no longer allocates and copies into
  // fresh memory (about a tenth of a simulated step with 8,900 queued). Only where the memory is
  // taken differs: the block table's capacity is not a scheduling decision.
  Sequence* raw = seq.get();
  auto [it, inserted] = seqs_.emplace(request, std::move(seq));
  PD_CHECK_MSG(inserted, "a request id is already on this simulated worker");
  return raw;
}

void SimWorker::Add(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
                    bool hold_after_finish, std::vector<BlockHash> prompt_hashes) {
  Sequence* seq = NewSequence(request, std::move(prompt), output_tokens);
  seq->block_hashes = std::move(prompt_hashes);  // The Scheduler extends them on admission.
  if (hold_after_finish) hold_[request] = true;
  scheduler_.AddWaiting(seq);
}

bool SimWorker::AddLoading(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
                           bool hold_after_finish, std::vector<BlockHash> prompt_hashes, int64_t pool_cached_blocks) {
  const int64_t bs = options_.block_size;
  const int64_t len = static_cast<int64_t>(prompt.size());
  std::vector<BlockHash> hashes = std::move(prompt_hashes);
  ExtendBlockHashes(prompt, bs, &hashes);
  auto plan = blocks_.PlanAdmit(hashes, (len - 1) / bs, len, len);
  if (!plan.ok() || plan->num_cached_tokens != pool_cached_blocks * bs) return false;
  AdmitWhole(request, std::move(prompt), output_tokens, std::move(hashes), *plan);
  if (hold_after_finish) hold_[request] = true;
  return true;
}

Sequence* SimWorker::AdmitWhole(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
                                std::vector<BlockHash> hashes, const BlockManager::AdmitPlan& plan) {
  Sequence* seq = NewSequence(request, std::move(prompt), output_tokens);
  seq->block_hashes = std::move(hashes);
  blocks_.CommitAdmit(seq->id, plan, static_cast<int64_t>(seq->tokens.capacity()));
  seq->num_computed = plan.num_cached_tokens;
  seq->num_cached_prompt_tokens = plan.num_cached_tokens;
  seq->admitted_before = true;
  return seq;
}

void SimWorker::FinishLoad(int64_t request, int64_t loaded_blocks) {
  auto it = seqs_.find(request);
  PD_CHECK_MSG(it != seqs_.end(), "FinishLoad without AddLoading");
  Sequence* seq = it->second.get();
  seq->num_computed += loaded_blocks * options_.block_size;
  seq->num_cached_prompt_tokens = std::min(seq->num_computed, seq->num_prompt_tokens);
  Publish(seq);
  scheduler_.AddWaiting(seq);
}

bool SimWorker::Reserve(int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
                        int64_t* cached_tokens, std::vector<BlockHash> prompt_hashes) {
  const int64_t bs = options_.block_size;
  const int64_t len = static_cast<int64_t>(prompt.size());
  const KvCacheStats kv = blocks_.Stats();
  if (kv.free_blocks + kv.cached_blocks - (len + bs - 1) / bs < scheduler_.num_running()) return false;
  std::vector<BlockHash> hashes = std::move(prompt_hashes);
  ExtendBlockHashes(prompt, bs, &hashes);  // Only what the caller did not hash.
  auto plan = blocks_.PlanAdmit(hashes, (len - 1) / bs, len, len);
  if (!plan.ok()) return false;
  AdmitWhole(request, std::move(prompt), output_tokens, std::move(hashes), *plan);
  *cached_tokens = plan->num_cached_tokens;
  return true;
}

SimWorker::Emitted SimWorker::CompleteRemote(int64_t request, int32_t first_token,
                                             int64_t prefill_cached_tokens) {
  auto it = seqs_.find(request);
  PD_CHECK_MSG(it != seqs_.end(), "CompleteRemote without a reservation");
  Sequence* seq = it->second.get();
  seq->num_computed = seq->num_prompt_tokens;
  PublishHashes(seq, seq->block_hashes);
  seq->num_cached_prompt_tokens = std::clamp<int64_t>(prefill_cached_tokens, 0, seq->num_prompt_tokens);
  Emitted e{request, first_token, true, false, seq->num_cached_prompt_tokens};
  ReserveOutput(seq);
  e.finished = Append(seq, first_token);
  if (e.finished) {
    Finish(seq);
  } else {
    scheduler_.AddWaiting(seq);  // Joins without a new allocation (it holds its blocks).
  }
  return e;
}

void SimWorker::ReleaseHeld(int64_t request) {
  auto it = seqs_.find(request);
  if (it == seqs_.end() || !it->second->held) return;
  blocks_.Free(it->second->id);
  seqs_.erase(it);
}

int64_t SimWorker::CachedPrefixTokens(const std::vector<BlockHash>& prompt_hashes,
                                      int64_t prompt_len) const {
  if (prompt_len == 0) return 0;
  auto probe = blocks_.PlanAdmit(prompt_hashes, (prompt_len - 1) / options_.block_size, 0, 0);
  return probe.ok() ? probe->num_cached_tokens : 0;
}

bool SimWorker::BeginStep(StepShape* shape) {
  *shape = StepShape{};
  scheduler_.Schedule(&schedule_);
  sampled_.clear();
  if (schedule_.chunks.empty()) return false;
  // The decode rows summed in registers and added once (the same values: a double's sum of
  // integers below 2^53 is exact in any order), not AddChunk's chain of stores and reloads a row.
  int64_t decode_rows = 0, decode_keys = 0;
  for (const ScheduledChunk& chunk : schedule_.chunks) {
    Sequence* seq = chunk.seq;
    if (chunk.num_tokens == 1) {
      ++decode_rows;
      decode_keys += seq->num_computed + 1;
    } else {
      shape->AddChunk(chunk.num_tokens, seq->num_computed);
    }
    if (seq->num_computed + chunk.num_tokens == static_cast<int64_t>(seq->tokens.size())) {
      sampled_.push_back(seq);
    }
  }
  shape->AddDecodeRows(decode_rows, decode_keys);
  return true;
}

void SimWorker::Publish(Sequence* seq) {
  // seq->block_hashes already cover its full blocks (EndStep extended them).
  const int64_t bs = options_.block_size;
  PublishHashes(seq, absl::MakeConstSpan(seq->block_hashes)
                         .subspan(0, std::min<size_t>(seq->block_hashes.size(), seq->num_computed / bs)));
}

void SimWorker::PublishHashes(Sequence* seq, absl::Span<const BlockHash> hashes) {
  if (!options_.on_publish) {
    blocks_.Publish(seq->id, hashes, {});
    return;
  }
  indexed_.clear();
  blocks_.Publish(seq->id, hashes, {}, &indexed_);
  for (const auto& [hash, block] : indexed_) options_.on_publish(hash);
}

void SimWorker::Finish(Sequence* seq) {
  auto h = hold_.find(seq->id);
  if (h != hold_.end()) {
    hold_.erase(h);
    scheduler_.RemoveKeepBlocks(seq);
    seq->held = true;
    return;
  }
  scheduler_.Remove(seq);
  seqs_.erase(seq->id);
}

void SimWorker::EndStep(std::vector<Emitted>* out) {
  const int64_t bs = options_.block_size;
  for (const ScheduledChunk& chunk : schedule_.chunks) {
    Sequence* seq = chunk.seq;
    const int64_t before = seq->num_computed;
    seq->num_computed += chunk.num_tokens;
    // The engine publishes after every step; only a step that fills a block publishes anything
    // (BlockManager::Publish starts where the last one ended), so the others are skipped here.
    // (Block sizes are powers of two in practice: a shift, where two 64-bit divisions were half
    // of this loop.)
    const bool fills = block_shift_ >= 0 ? (seq->num_computed >> block_shift_) > (before >> block_shift_)
                                         : seq->num_computed / bs > before / bs;
    if (fills) {
      ExtendBlockHashes(seq->tokens, bs, &seq->block_hashes);
      // Each new block's index entry is a cache miss in a large pool: ask for them all now and
      // publish once they are on their way.
      if (!seq->block_hashes.empty()) blocks_.PrefetchIndex(seq->block_hashes.back());
      publish_.push_back(seq);
    }
  }
  for (Sequence* seq : publish_) Publish(seq);
  publish_.clear();
  for (Sequence* seq : sampled_) {
    // Filled in place (a copy of a half-written Emitted stalled on store forwarding).
    Emitted& e = out->emplace_back();
    e.request = seq->id;
    const int64_t position = seq->num_generated();
    e.token = options_.next_token(e.request, position);
    e.first = position == 0;
    if (e.first) {
      e.cached_prompt_tokens = seq->num_cached_prompt_tokens;
      ReserveOutput(seq);
    }
    e.finished = Append(seq, e.token);
    if (e.finished) Finish(seq);  // Destroys seq unless held.
  }
  sampled_.clear();
}

}  // namespace pdserve
