#include "common/rpc/worker_metrics.h"

#include <chrono>

#include "absl/strings/str_join.h"
#include "common/metrics/buckets.h"

namespace pdserve {
namespace {

const std::vector<std::string> kLabels = {"model_name", "role"};

}  // namespace

WorkerMetrics::WorkerMetrics(metrics::Registry* registry, const std::string& model_name,
                             const std::string& role,
                             std::function<internal::v1::WorkerInfo()> info)
    : own_registry_(registry == nullptr ? std::make_unique<metrics::Registry>() : nullptr),
      registry_(registry == nullptr ? own_registry_.get() : registry),
      model_name_(model_name),
      role_(role),
      requests_(registry_, model_name, role),
      running_(registry_->AddGauge("pdserve_num_requests_running", "Requests in the running batch.",
                           kLabels, "vllm:num_requests_running")
                   .With({model_name, role})),
      waiting_(registry_->AddGauge("pdserve_num_requests_waiting",
                           "Requests waiting to be scheduled (incl. remote prefills in flight).",
                           kLabels, "vllm:num_requests_waiting")
                   .With({model_name, role})),
      kv_usage_(registry_->AddGauge("pdserve_kv_cache_usage_perc",
                            "Fraction of KV blocks held by requests (0-1).", kLabels,
                            "vllm:kv_cache_usage_perc")
                    .With({model_name, role})),
      kv_blocks_total_(registry_->AddGauge("pdserve_kv_cache_blocks", "KV blocks in the pool.", kLabels)
                           .With({model_name, role})),
      prefix_queries_(registry_->AddCounter("pdserve_prefix_cache_queries_total",
                                    "Prompt tokens looked up in the prefix cache.", kLabels,
                                    "vllm:prefix_cache_queries_total")
                          .With({model_name, role})),
      prefix_hits_(registry_->AddCounter("pdserve_prefix_cache_hits_total",
                                 "Prompt tokens found in the prefix cache.", kLabels,
                                 "vllm:prefix_cache_hits_total")
                       .With({model_name, role})),
      preemptions_(registry_->AddCounter("pdserve_num_preemptions_total",
                                 "Requests preempted (their KV recomputed later).", kLabels,
                                 "vllm:num_preemptions_total")
                       .With({model_name, role})),
      step_seconds_(registry_->AddCounter("pdserve_engine_step_seconds_total",
                                  "Seconds the engine spent in its steps (schedule, forward pass, "
                                  "sampling): process_cpu_seconds_total beyond it is serving's.",
                                  kLabels)
                        .With({model_name, role})),
      transfer_bytes_(registry_->AddCounter("pdserve_kv_transfer_bytes_total",
                                    "KV page bytes of completed transfers (sent by prefill, "
                                    "received by decode).",
                                    kLabels)
                          .With({model_name, role})),
      transfer_pages_(registry_->AddCounter("pdserve_kv_transfer_pages_total",
                                    "KV pages (one block of one layer) of completed transfers.",
                                    kLabels)
                          .With({model_name, role})),
      transfers_(registry_->AddCounter("pdserve_kv_transfers_total", "Completed KV transfers.", kLabels)
                     .With({model_name, role})),
      transfer_seconds_(registry_->AddHistogram("pdserve_kv_transfer_seconds",
                                        "KV transfer time in seconds: decode, from reservation "
                                        "to every page received and checked; prefill, from the "
                                        "request to every page sent.",
                                        kLabels, metrics::TransferBuckets())
                            .With({model_name, role})),
      reservations_(registry_->AddGauge("pdserve_kv_reservations_active",
                                "Blocks reservations waiting for a remote prefill's pages.",
                                kLabels)
                        .With({model_name, role})),
      lease_expired_(registry_->AddCounter("pdserve_kv_lease_expired_total",
                                   "Reservations dropped because the prefill did not arrive "
                                   "within the lease.",
                                   kLabels)
                         .With({model_name, role})),
      quarantine_released_(registry_->AddCounter("pdserve_kv_quarantine_released_total",
                                         "Reservations of given-up transfers returned once the "
                                         "sender's late one-sided puts had landed.",
                                         kLabels)
                               .With({model_name, role})),
      transfer_failures_(registry_->AddCounter("pdserve_kv_transfer_failures_total",
                                               "KV transfers that failed, by reason.",
                                               {"model_name", "role", "reason"})),
      collector_(registry_, [this, info = std::move(info)] { Collect(info()); }) {}

void WorkerMetrics::Observe(const RequestOutput& out) {
  // One observation per token, as the router counts them: tokens that arrive together (accepted
  // speculative drafts) follow the first after no gap.
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    if (i == 0 && out.first_token) {
      requests_.FirstToken(out.ttft_seconds, out.prompt_tokens);
    } else {
      requests_.NextToken(i == 0 ? out.itl_seconds : 0.0);
    }
  }
  if (out.finished) {
    metrics::FinishedRequest f;
    f.finish_reason = out.finish_reason;
    f.generation_tokens = out.completion_tokens;
    f.e2e_seconds = out.e2e_seconds;
    f.ttft_seconds = out.ttft_seconds;
    f.has_phases = true;
    f.queue_seconds = out.queue_seconds;
    f.prefill_seconds = out.prefill_seconds;
    f.decode_seconds = out.decode_seconds;
    requests_.Finished(f);
  }
}

void WorkerMetrics::TransferDone(double seconds) { transfer_seconds_.Observe(seconds); }

void WorkerMetrics::TransferFailed(const std::string& reason) {
  transfer_failures_.With({model_name_, role_, reason}).Inc();
  if (reason == "lease_expired") lease_expired_.Inc();
}

void WorkerMetrics::QuarantineReleased() { quarantine_released_.Inc(); }

void WorkerMetrics::SetReservations(int64_t active) {
  reservations_.Set(static_cast<double>(active));
}

void WorkerMetrics::Collect(const internal::v1::WorkerInfo& info) {
  running_.Set(info.running());
  waiting_.Set(info.waiting());
  kv_blocks_total_.Set(static_cast<double>(info.total_blocks()));
  registry_
      ->AddGauge("pdserve_kv_cache_config_info",
                 "The KV pool's format (value 1): dtype, block size, bytes per token and per "
                 "(layer, block) page, scales included.",
                 {"model_name", "role", "kv_dtype", "block_size", "bytes_per_token", "page_bytes"})
      .With({model_name_, role_, info.layout().kv_dtype(), std::to_string(info.layout().block_size()),
             std::to_string(info.kv_bytes_per_token()), std::to_string(info.page_bytes())})
      .Set(1);
  // What the worker computes with: its compute dtype and, for quantized weights, their block
  // formats ("f32+Q4_K+Q6_K"): tiers on different files of one model show here.
  registry_
      ->AddGauge("pdserve_numerics_info",
                 "The worker's arithmetic (value 1): compute dtype, and the block formats of "
                 "quantized weights.",
                 {"model_name", "role", "numerics"})
      .With({model_name_, role_, info.numerics()})
      .Set(1);
  kv_usage_.Set(info.total_blocks() > 0
                    ? static_cast<double>(info.used_blocks()) / info.total_blocks()
                    : 0.0);
  prefix_queries_.SetTotal(static_cast<double>(info.prefix_query_tokens()));
  prefix_hits_.SetTotal(static_cast<double>(info.prefix_hit_tokens()));
  preemptions_.SetTotal(static_cast<double>(info.preemptions()));
  step_seconds_.SetTotal(info.engine_step_seconds());
  transfer_bytes_.SetTotal(static_cast<double>(info.transfer_bytes()));
  transfer_pages_.SetTotal(static_cast<double>(info.transfer_pages()));
  transfers_.SetTotal(static_cast<double>(info.transfers_completed()));
  if (info.spec_accepted_by_position_size() > 0) CollectSpeculative(info);
  if (info.structured_mask_lookups() > 0) CollectStructured(info);
  if (info.has_kv_offload()) CollectKvOffload(info.kv_offload());
  CollectCachedBySource(info);
  // A worker that takes runtime loads reports while it serves none too (its last adapter unloaded).
  if (info.lora_adapters_size() > 0 || info.lora_runtime_updates()) CollectLora(info);
}

void WorkerMetrics::CollectLora(const internal::v1::WorkerInfo& info) {
  // vLLM's lora_requests_info: one series, its labels the adapters of the running and of the
  // waiting requests (comma-separated), its value the time it was set. vLLM leaves the series of
  // earlier label values behind (readers take the newest); here the previous one is removed.
  auto& family = registry_->AddGauge(
      "pdserve_lora_requests_info",
      "LoRA adapters of the running and waiting requests (value: when set, seconds since the epoch).",
      {"model_name", "role", "max_lora", "running_lora_adapters", "waiting_lora_adapters"},
      "vllm:lora_requests_info");
  std::vector<std::string> labels = {model_name_, role_, std::to_string(info.max_loras()),
                                     absl::StrJoin(info.running_lora_adapters(), ","),
                                     absl::StrJoin(info.waiting_lora_adapters(), ",")};
  if (!lora_info_labels_.empty() && lora_info_labels_ != labels) family.Remove(lora_info_labels_);
  family.With(labels).Set(std::chrono::duration<double>(
                              std::chrono::system_clock::now().time_since_epoch()).count());
  lora_info_labels_ = std::move(labels);
}

void WorkerMetrics::CollectCachedBySource(const internal::v1::WorkerInfo& info) {
  // vLLM's sources: "device" the pool's own prefix hits, "host" and "disk" the local tiers,
  // "external_unspecified" the shared store; "p2p" (KV another instance sends) stays 0 here:
  // pages from a prefill worker are that request's computed prompt, not a cache hit.
  auto& family = registry_->AddCounter(
      "pdserve_prompt_tokens_cached_by_source_total",
      "Prompt tokens not computed, by where their KV came from: the pool's prefix cache (device) "
      "or a KV cache tier (host, disk, external_unspecified: the shared store).",
      {"model_name", "role", "source"}, "vllm:prompt_tokens_cached_by_source_total");
  family.With({model_name_, role_, "device"}).SetTotal(static_cast<double>(info.prefix_hit_tokens()));
  const internal::v1::KvOffloadInfo& o = info.kv_offload();
  for (int t = 0; t < o.tiers_size() && t < o.loaded_tokens_by_tier_size(); ++t) {
    const std::string& name = o.tiers(t).name();
    const char* source = name == "host" ? "host" : name == "disk" ? "disk" : "external_unspecified";
    family.With({model_name_, role_, source}).SetTotal(static_cast<double>(o.loaded_tokens_by_tier(t)));
  }
}

void WorkerMetrics::CollectStructured(const internal::v1::WorkerInfo& info) {
  // Registered once a constrained request has run here.
  const auto counter = [&](const char* name, const char* help) -> metrics::Counter& {
    return registry_->AddCounter(name, help, kLabels).With({model_name_, role_});
  };
  counter("pdserve_structured_output_grammars_compiled_total",
          "Structured-output constraints compiled (the worker's cache of them missed).")
      .SetTotal(static_cast<double>(info.structured_compiled()));
  counter("pdserve_structured_output_masks_computed_total",
          "Token masks computed: a constraint's matcher state met for the first time.")
      .SetTotal(static_cast<double>(info.structured_masks_computed()));
  counter("pdserve_structured_output_mask_lookups_total",
          "Token masks used: one per constrained sampled position (computed or found).")
      .SetTotal(static_cast<double>(info.structured_mask_lookups()));
}

void WorkerMetrics::CollectKvOffload(const internal::v1::KvOffloadInfo& o) {
  // Registered on workers with a tier. The tiers' own counters are labelled by the tier ("host",
  // "disk", "redis"); the engine's offers and loads (from whichever tier) are not.
  for (const internal::v1::KvTierInfo& t : o.tiers()) CollectKvTier(t);
  const auto engine_counter = [&](const char* name, const char* help, double total) {
    registry_->AddCounter(name, help, kLabels).With({model_name_, role_}).SetTotal(total);
  };
  engine_counter("pdserve_kv_offload_store_drops_total",
                 "Published blocks not stored: every store buffer was busy (a store never waits).",
                 static_cast<double>(o.store_drops()));
  engine_counter("pdserve_kv_offload_loaded_blocks_total", "Blocks this worker loaded into its pool from its tiers.",
                 static_cast<double>(o.loaded_blocks()));
  engine_counter("pdserve_kv_offload_failed_blocks_total",
                 "Blocks this worker asked of its tiers and recomputed instead (a miss or a failed check).",
                 static_cast<double>(o.failed_blocks()));
  engine_counter("pdserve_kv_offload_loaded_tokens_total",
                 "Prompt tokens whose KV this worker loaded from its tiers instead of computing it.",
                 static_cast<double>(o.loaded_tokens()));
  engine_counter("pdserve_kv_offload_declined_loads_total",
                 "Requests that computed a prefix their tiers held: loading it was expected to take longer "
                 "(--kv-tier-load faster).",
                 static_cast<double>(o.declined_loads()));
}

void WorkerMetrics::CollectKvTier(const internal::v1::KvTierInfo& t) {
  const std::vector<std::string> labels = {"model_name", "role", "tier"};
  const std::vector<std::string> values = {model_name_, role_, t.name()};
  const auto counter = [&](const char* name, const char* help, double total) {
    registry_->AddCounter(name, help, labels).With(values).SetTotal(total);
  };
  const auto gauge = [&](const char* name, const char* help, double value) {
    registry_->AddGauge(name, help, labels).With(values).Set(value);
  };
  gauge("pdserve_kv_offload_blocks", "Prefix blocks the KV tier holds.", static_cast<double>(t.blocks()));
  gauge("pdserve_kv_offload_bytes", "Bytes the KV tier holds.", static_cast<double>(t.bytes()));
  counter("pdserve_kv_offload_store_bytes_total", "Block bytes stored in the KV tier.",
          static_cast<double>(t.store_bytes()));
  counter("pdserve_kv_offload_store_seconds_total", "Seconds spent storing blocks (I/O thread).",
          t.store_seconds());
  counter("pdserve_kv_offload_load_bytes_total", "Block bytes loaded from the KV tier and checked.",
          static_cast<double>(t.load_bytes()));
  counter("pdserve_kv_offload_load_seconds_total", "Seconds spent loading blocks (I/O thread).",
          t.load_seconds());
  counter("pdserve_kv_offload_misses_total", "Blocks asked of the KV tier and not there.",
          static_cast<double>(t.misses()));
  counter("pdserve_kv_offload_corrupt_blocks_total",
          "Blocks found in the KV tier that failed their checks (removed, recomputed).",
          static_cast<double>(t.corrupt()));
  counter("pdserve_kv_offload_evictions_total", "Blocks removed from the KV tier for its byte budget.",
          static_cast<double>(t.evictions()));
  counter("pdserve_kv_offload_errors_total", "Failed writes or calls of the KV tier (a full disk, a store out of reach).",
          static_cast<double>(t.errors()));
}

void WorkerMetrics::CollectSpeculative(const internal::v1::WorkerInfo& info) {
  // vLLM's spec_decode counters, under both names; registered once speculation reports.
  const auto counter = [&](const char* name, const char* help, const char* vllm) -> metrics::Counter& {
    return registry_->AddCounter(name, help, kLabels, vllm).With({model_name_, role_});
  };
  counter("pdserve_spec_decode_num_drafts_total",
          "Decode steps of a request that verified a speculative draft.",
          "vllm:spec_decode_num_drafts_total")
      .SetTotal(static_cast<double>(info.spec_drafts()));
  counter("pdserve_spec_decode_num_draft_tokens_total", "Speculative tokens drafted.",
          "vllm:spec_decode_num_draft_tokens_total")
      .SetTotal(static_cast<double>(info.spec_draft_tokens()));
  counter("pdserve_spec_decode_num_accepted_tokens_total",
          "Drafted tokens accepted (each one the token plain decoding samples).",
          "vllm:spec_decode_num_accepted_tokens_total")
      .SetTotal(static_cast<double>(info.spec_accepted_tokens()));
  auto& by_position = registry_->AddCounter(
      "pdserve_spec_decode_num_accepted_tokens_per_pos_total",
      "Drafted tokens accepted, by their position in the draft (0 first).",
      {"model_name", "role", "position"}, "vllm:spec_decode_num_accepted_tokens_per_pos_total");
  for (int i = 0; i < info.spec_accepted_by_position_size(); ++i) {
    by_position.With({model_name_, role_, std::to_string(i)})
        .SetTotal(static_cast<double>(info.spec_accepted_by_position(i)));
  }
}

}  // namespace pdserve
