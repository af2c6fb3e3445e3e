#include "router/router.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/model/gguf_model.h"
#include "common/model/gguf_tokenizer.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/proto_convert.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/kv_cache_spec.h"
#include "common/tokenizer/unicode.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  if (options.decode.empty()) {
    return absl::InvalidArgumentError("the router needs at least one decode worker (--decode)");
  }
  std::unique_ptr<Router> r(new Router());
  r->options_ = options;
  {
    std::random_device entropy;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%08x%08x", entropy(), entropy());
    r->instance_ = hex;
  }
  PD_ASSIGN_OR_RETURN(r->config_, LoadModelConfig(options.model_dir));
  PD_ASSIGN_OR_RETURN(r->tokenizer_, LoadModelTokenizer(options.tokenizer.empty()
                                                             ? options.model_dir
                                                             : options.tokenizer));
  PD_ASSIGN_OR_RETURN(const std::string fingerprint, ModelFingerprint(options.model_dir));

  WorkerPoolOptions po;
  po.block_size = options.block_size;
  po.kv_dtype = std::string(KvDTypeName(options.kv_dtype));
  po.use_events = options.kv_events;
  po.approx_ttl = absl::ToChronoMilliseconds(options.approx_ttl);
  po.recent_half_life = std::max(std::chrono::milliseconds(1),
                                 absl::ToChronoMilliseconds(options.recent_half_life));
  po.model_fingerprint = fingerprint;
  po.credentials = options.worker_credentials;
  po.channels = options.worker_channels;
  r->numerics_ = std::make_shared<NumericsWatch>();
  po.numerics = r->numerics_;
  po.store = std::make_shared<SharedStoreIndex>();
  r->decode_ = std::make_unique<WorkerPool>(po);
  po.prefill_tier = true;
  r->prefill_ = std::make_unique<WorkerPool>(po);
  const auto interval = absl::ToChronoMilliseconds(options.discovery_interval);
  WorkerPool* decode = r->decode_.get();
  WorkerPool* prefill = r->prefill_.get();
  r->decode_discovery_ = std::make_unique<Discovery>(
      options.decode, interval, [decode](const std::vector<std::string>& a) { decode->SetAddresses(a); });
  r->prefill_discovery_ = std::make_unique<Discovery>(
      options.prefill, interval, [prefill](const std::vector<std::string>& a) { prefill->SetAddresses(a); });
  const auto wait = absl::ToChronoMilliseconds(options.worker_wait);
  r->decode_->WaitForReports(wait);
  r->prefill_->WaitForReports(wait);
  if (r->decode_->usable() == 0) {
    return absl::UnavailableError(Str("no decode worker of '", options.decode,
                                      "' answered with this model and layout within ",
                                      absl::FormatDuration(options.worker_wait)));
  }
  const ModelConfig& c = r->config_;
  r->model_info_.set_name(options.served_model_name.empty() ? BaseName(options.model_dir)
                                                            : options.served_model_name);
  r->model_info_.set_architecture(c.architecture);
  r->model_info_.set_family(std::string(ModelFamilyName(c.family)));
  r->model_info_.set_vocab_size(static_cast<int32_t>(c.vocab_size));
  r->model_info_.set_block_size(static_cast<int32_t>(options.block_size));
  r->model_info_.set_kv_dtype(std::string(KvDTypeName(options.kv_dtype)));
  const KvCacheSpec spec{c.num_layers, c.num_kv_heads, c.head_dim, options.block_size,
                         options.kv_dtype};
  r->model_info_.set_kv_bytes_per_token(static_cast<int64_t>(spec.BytesPerToken()));
  if (options.lora_runtime_updates) {
    r->lora_updates_ = std::make_unique<LoraUpdates>(r->decode_.get(), r->prefill_.get(), r->model_info_.name());
  }
  Router* raw = r.get();
  r->metrics_ = std::make_unique<RouterMetrics>(
      options.metrics, r->model_info_.name(),
      std::string(RoutingPolicyName(options.routing.policy)), [raw] {
        RouterMetrics::PoolSnapshot s;
        s.tiers.emplace_back("decode", raw->decode_->Stats());
        s.tiers.emplace_back("prefill", raw->prefill_->Stats());
        s.refusals = raw->decode_->refusals() + raw->prefill_->refusals();
        return s;
      });
  return r;
}

Router::~Router() {
  lora_updates_.reset();  // Its calls use the pools.
  // Discovery threads call into the pools: stop them first.
  decode_discovery_.reset();
  prefill_discovery_.reset();
}

void Router::Stop() {
  if (lora_updates_ != nullptr) lora_updates_->Stop();
  decode_discovery_.reset();
  prefill_discovery_.reset();
  decode_->Stop();
  prefill_->Stop();
}

int64_t Router::ContextLength() const {
  int64_t len = 0;
  for (const auto& w : decode_->Stats()) {
    if (!w.healthy || w.refused) continue;
    len = len == 0 ? w.info.max_model_len() : std::min<int64_t>(len, w.info.max_model_len());
  }
  return len > 0 ? len : config_.max_position_embeddings;
}

v1::ModelInfo Router::model_info() const {
  v1::ModelInfo info = model_info_;
  info.set_context_length(static_cast<int32_t>(ContextLength()));
  for (v1::LoraAdapterInfo& a : decode_->LoraAdapters()) *info.add_lora_adapters() = std::move(a);
  return info;
}

absl::StatusOr<Route> Router::RouteRequest(const std::vector<int32_t>& prompt,
                                           const RouteConstraints& constraints) {
  const int64_t bs = options_.block_size;
  std::vector<BlockHash> hashes;
  // An adapter's blocks are its own: the workers hash them from its root (LoraAdapter::kv_root),
  // which they report. (No worker reporting one yet: no prefix is credited anywhere.)
  if (constraints.lora_name.empty()) {
    ExtendBlockHashes(prompt, bs, &hashes);
  } else if (const auto root = decode_->LoraKvRoot(constraints.lora_name)) {
    ExtendBlockHashes(prompt, bs, &hashes, *root);
  }
  const int64_t prompt_blocks = (static_cast<int64_t>(prompt.size()) + bs - 1) / bs;
  auto decode = decode_->Choose(options_.routing, hashes, prompt_blocks, constraints.exclude_decode,
                                constraints.lora_name);
  if (!decode) {
    return constraints.lora_name.empty() || decode_->usable() == 0
               ? absl::UnavailableError("no decode worker is available")
               : absl::UnavailableError(Str("no available decode worker serves the LoRA adapter '",
                                            constraints.lora_name, "'"));
  }
  if (!constraints.retry) ++requests_;
  if (decode->fell_back) ++fallbacks_;
  metrics_->Decision("decode", WorkerPool::Address(*decode->worker));
  metrics_->PromptBlocks("decode", decode->cached_prefix_blocks, decode->tier_prefix_blocks, prompt_blocks);
  Route route{*decode, std::nullopt};
  // What the decode worker would compute: past its pool's prefix and what its KV cache tiers hold
  // (loaded, not computed: a prompt the store holds is prefilled there, not sent across).
  const int64_t uncached =
      static_cast<int64_t>(prompt.size()) - (decode->cached_prefix_blocks + decode->tier_prefix_blocks) * bs;
  if (!constraints.local_prefill && uncached > options_.local_prefill_tokens && prefill_->usable() > 0 &&
      !prefill_->Saturated(options_.prefill_max_waiting)) {
    route.prefill = prefill_->Choose(options_.routing, hashes, prompt_blocks, {}, constraints.lora_name);
    if (route.prefill && route.prefill->fell_back) ++fallbacks_;
  }
  if (route.prefill) {
    ++remote_prefills_;
    metrics_->Decision("prefill", WorkerPool::Address(*route.prefill->worker));
    metrics_->PromptBlocks("prefill", route.prefill->cached_prefix_blocks, route.prefill->tier_prefix_blocks,
                           prompt_blocks);
  } else {
    ++local_prefills_;
  }
  metrics_->Prefill(!route.prefill.has_value());
  return route;
}

absl::Status Router::Admit() {
  const int64_t n = inflight_.fetch_add(1) + 1;
  if (options_.max_inflight > 0 && n > options_.max_inflight) {
    inflight_.fetch_sub(1);
    return absl::ResourceExhaustedError(Str("router is full: ", options_.max_inflight,
                                            " requests in flight (--max-inflight-requests); "
                                            "retry later"));
  }
  return absl::OkStatus();
}

std::shared_ptr<DecodeStreamClient> Router::DecodeStream(const std::shared_ptr<WorkerPool::Worker>& worker) {
  return options_.shared_decode_streams ? decode_->DecodeStream(worker) : nullptr;
}

void Router::Done(const Route& route) {
  decode_->Done(route.decode.worker);
  if (route.prefill) prefill_->Done(route.prefill->worker);
}

internal::v1::RouterStats Router::Stats() const {
  internal::v1::RouterStats s;
  s.set_policy(std::string(RoutingPolicyName(options_.routing.policy)));
  s.set_requests(requests_.load());
  s.set_local_prefills(local_prefills_.load());
  s.set_remote_prefills(remote_prefills_.load());
  s.set_guard_fallbacks(fallbacks_.load());
  s.set_refused_workers(decode_->refusals() + prefill_->refusals());
  s.set_resumes(metrics_->resumes());
  s.set_mixed_numerics_workers(numerics_->mixed());
  for (const auto& [pool, out] : {std::pair{decode_.get(), s.mutable_decode()},
                                  std::pair{prefill_.get(), s.mutable_prefill()}}) {
    for (const auto& w : pool->Stats()) {
      internal::v1::RoutedWorker* rw = out->Add();
      rw->set_address(w.address);
      rw->set_healthy(w.healthy);
      rw->set_refused(w.refused);
      rw->set_decisions(w.decisions);
      rw->set_inflight(w.inflight);
      *rw->mutable_info() = w.info;
    }
  }
  return s;
}

absl::StatusOr<RoutedRequest> Router::Prepare(const v1::GenerateRequest& request,
                                              std::chrono::system_clock::time_point deadline) const {
  RequestLimits limits;
  limits.vocab_size = config_.vocab_size;
  limits.context_length = ContextLength();
  limits.max_stop_strings = options_.max_stop_strings;
  limits.max_stop_string_bytes = options_.max_stop_string_bytes;
  const uint64_t fallback_seed =
      std::random_device{}() * 0x9e3779b97f4a7c15ull + std::random_device{}();
  PD_ASSIGN_OR_RETURN(RoutedRequest out,
                      ValidateGenerateRequest(request, *tokenizer_, limits, deadline, fallback_seed));
  if (!out.params.lora_name.empty() && !decode_->ServesLora(out.params.lora_name)) {
    return absl::NotFoundError(Str("sampling.lora_name: the model `", out.params.lora_name,
                                   "` does not exist (no decode worker serves a LoRA adapter of "
                                   "that name)"));
  }
  // Two routers, or two clients, may use the same id: the workers key requests by a
  // downstream id that adds this router's instance and a counter.
  const uint64_t n = const_cast<Router*>(this)->next_request_.fetch_add(1);
  out.request_id = request.request_id().empty() ? Str("req-", instance_, "-", n) : request.request_id();
  out.downstream_id = request.request_id().empty() ? out.request_id
                                                   : Str(out.request_id, "#", instance_, "-", n);
  return out;
}

}  // namespace pdserve
