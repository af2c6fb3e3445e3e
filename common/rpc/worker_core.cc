#include "common/rpc/worker_core.h"

#include <future>

#include "common/base/status_macros.h"
#include "common/model/lora_registry.h"
#include "common/rpc/lora_admin.h"
#include "common/rpc/proto_convert.h"

namespace pdserve {

absl::StatusOr<WorkerCore> WorkerCore::Create(const std::string& model_dir,
                                              const EngineOptions& engine,
                                              const std::string& transport,
                                              KvTransportOptions transport_options) {
  WorkerCore core;
  EngineOptions with_events = engine;
  with_events.enable_kv_events = true;  // Routers watch the prefix cache.
  PD_ASSIGN_OR_RETURN(core.engine, LLMEngine::Create(model_dir, with_events));
  PD_ASSIGN_OR_RETURN(const std::string fingerprint, ModelFingerprint(model_dir));
  core.layout = MakeKvLayout(*core.engine, fingerprint);
  core.layout.set_device(std::string(KvPagesDevice(transport, core.engine->device())));
  core.layout_string = LayoutString(core.layout);
  transport_options.layout = core.layout_string;
  transport_options.device = core.engine->device();
  PD_ASSIGN_OR_RETURN(core.transport, CreateKvTransport(transport, transport_options));
  KvPool& pool = core.engine->kv_pool();
  PD_RETURN_IF_ERROR(core.transport->RegisterPool(core.engine->kv_memory(), pool.size_bytes()));
  return core;
}

internal::v1::WorkerInfo MakeWorkerInfo(const std::string& role, const WorkerCore& core,
                                        const TransferCounters& transfers, int64_t waiting_extra) {
  internal::v1::WorkerInfo info;
  info.set_role(role);
  *info.mutable_layout() = core.layout;
  info.set_transport_endpoint(core.transport->endpoint());
  const EngineStats s = core.engine->Stats();
  info.set_total_blocks(s.kv.total_blocks);
  info.set_free_blocks(s.kv.free_blocks);
  info.set_cached_blocks(s.kv.cached_blocks);
  info.set_used_blocks(s.kv.used_blocks);
  info.set_running(static_cast<int32_t>(s.running));
  info.set_waiting(static_cast<int32_t>(s.waiting + waiting_extra));
  info.set_transfers_completed(transfers.completed);
  info.set_transfer_failures(transfers.failures);
  info.set_transfer_pages(transfers.pages);
  info.set_transfer_bytes(transfers.bytes);
  info.set_preemptions(s.preemptions);
  info.set_engine_step_seconds(s.step_seconds);
  info.set_max_model_len(static_cast<int32_t>(core.engine->max_model_len()));
  info.set_vocab_size(static_cast<int32_t>(core.engine->config().vocab_size));
  info.set_page_bytes(static_cast<int64_t>(core.engine->kv_spec().PageBytes()));
  info.set_kv_bytes_per_token(static_cast<int64_t>(core.engine->kv_spec().BytesPerToken()));
  info.set_numerics(core.engine->numerics());
  if (core.engine->lora() != nullptr) {
    std::vector<std::string> running, waiting;
    core.engine->LoraRequestNames(&running, &waiting);
    for (std::string& n : running) info.add_running_lora_adapters(std::move(n));
    for (std::string& n : waiting) info.add_waiting_lora_adapters(std::move(n));
    info.set_max_loras(static_cast<int32_t>(core.engine->max_loras()));
    FillLoraInfo(*core.engine->lora(), &info);
  }
  info.set_prefix_query_tokens(s.kv.prefix_query_tokens);
  info.set_prefix_hit_tokens(s.kv.prefix_hit_tokens);
  info.set_structured_compiled(s.structured_compiled);
  info.set_structured_masks_computed(s.structured_masks_computed);
  info.set_structured_mask_lookups(s.structured_mask_lookups);
  if (core.engine->has_kv_tier()) {
    internal::v1::KvOffloadInfo* o = info.mutable_kv_offload();
    for (const auto& [name, tier] : s.tiers) {
      internal::v1::KvTierInfo* t = o->add_tiers();
      t->set_name(name);
      t->set_blocks(tier.blocks);
      t->set_bytes(tier.bytes);
      t->set_stores(tier.stores);
      t->set_store_bytes(tier.store_bytes);
      t->set_store_seconds(tier.store_seconds);
      t->set_loads(tier.loads);
      t->set_load_bytes(tier.load_bytes);
      t->set_load_seconds(tier.load_seconds);
      t->set_misses(tier.misses);
      t->set_corrupt(tier.corrupt);
      t->set_evictions(tier.evictions);
      t->set_errors(tier.errors);
    }
    o->set_store_drops(s.offload.store_drops);
    o->set_loaded_blocks(s.offload.loaded_blocks);
    o->set_failed_blocks(s.offload.failed_blocks);
    o->set_loaded_tokens(s.offload.loaded_tokens);
    o->set_declined_loads(s.offload.declined_loads);
    o->set_loads_declined(core.engine->TierLoadsDeclined());
    for (size_t t = 0; t < s.tiers.size() && t < s.offload.loaded_tokens_by_tier.size(); ++t) {
      o->add_loaded_tokens_by_tier(s.offload.loaded_tokens_by_tier[t]);
    }
  }
  const SpeculativeOptions& spec = core.engine->speculative();
  if (spec.enabled()) {
    info.set_spec_drafts(s.spec_drafts);
    info.set_spec_draft_tokens(s.spec_draft_tokens);
    info.set_spec_accepted_tokens(s.spec_accepted_tokens);
    for (int32_t i = 0; i < spec.num_tokens; ++i) {
      info.add_spec_accepted_by_position(s.spec_accepted_by_position[static_cast<size_t>(i)]);
    }
  }
  return info;
}

void CommandQueue::Post(std::function<void()> command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(command));
  }
  cv_.notify_one();
}

bool CommandQueue::Run(std::function<void()> command, std::chrono::milliseconds timeout) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> ran = done->get_future();
  Post([command = std::move(command), done] {
    command();
    done->set_value();
  });
  return ran.wait_for(timeout) == std::future_status::ready;
}

std::deque<std::function<void()>> CommandQueue::Take(bool busy, std::chrono::milliseconds poll,
                                                      bool* stopped) {
  std::unique_lock<std::mutex> lock(mu_);
  if (commands_.empty() && !stop_ && !busy) {
    if (poll.count() > 0) {
      cv_.wait_for(lock, poll);
    } else {
      cv_.wait(lock, [&] { return stop_ || !commands_.empty(); });
    }
  }
  *stopped = stop_;
  std::deque<std::function<void()>> out;
  out.swap(commands_);
  return out;
}

void CommandQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

}  // namespace pdserve
