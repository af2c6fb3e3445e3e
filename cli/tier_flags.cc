#include "cli/tier_flags.h"

#include <cmath>

#include "cli/address_flags.h"
#include "common/base/file_util.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "openai_api/tool_calls.h"

namespace pdserve::cli {
namespace {

// The KV transports by name, for the usage check before anything loads (the registry says which
// are built into this binary).
bool KnownTransport(const std::string& t) {
  return t == "tcp" || t == "ucx" || t == "local" || t == "cuda_ipc" || t == "nccl";
}

}  // namespace

absl::Status TierDevice(const EngineOptions& engine, const std::string& transport) {
  if (engine.backend != "cuda" && (transport == "cuda_ipc" || transport == "nccl")) {
    return absl::InvalidArgumentError(
        Str("--transport ", transport, " moves pages between GPU pools: it needs --device cuda"));
  }
  return absl::OkStatus();
}

absl::Status AtLeast(double v, double lo, const char* flag) {
  if (std::isfinite(v) && v >= lo) return absl::OkStatus();
  return absl::InvalidArgumentError(Str(flag, ": must be a finite number >= ", lo, ", got ", v));
}

void RouterFlags::Register(FlagSet& flags, bool standalone) {
  flags.String("http-listen", &http_listen,
               "also serve the OpenAI-compatible HTTP API on host:port (off when empty)");
  flags.Int("http-max-connections", &http_max_connections,
            "open connections the HTTP API holds at most; the next is answered 503");
  flags.Double("http-request-timeout-seconds", &http_request_timeout,
               "a request's head and body must reach the HTTP API within this (408 otherwise)");
  flags.Double("http-keep-alive-seconds", &http_keep_alive,
               "an idle keep-alive HTTP connection closes after this (sent as Keep-Alive: "
               "timeout=); keep it above the idle timeout of a load balancer in front");
  flags.String("served-model-name", &served_model_name,
               "the model name clients send and see, also in metrics (default: the model directory's name)");
  flags.String("tokenizer", &tokenizer,
               "a tokenizer directory instead of the model's (a GGUF file without a vocabulary)");
  flags.String("chat-template", &chat_template,
               "a Jinja chat template file for /v1/chat/completions instead of the model's");
  flags.String("tool-call-parser", &tool_call_parser,
               "find tool calls in chat output (requests with tools): hermes (Qwen, Hermes) or "
               "llama3_json");
  flags.String("policy", &policy, "routing policy: kv_aware, least_loaded or round_robin");
  flags.Double("w-prefix", &options.routing.w_prefix,
               "kv_aware: weight of the prompt blocks a worker would still have to prefill");
  flags.Double("w-tier", &options.routing.w_tier,
               "kv_aware: what a prompt block a worker would load from its KV cache tiers (its "
               "disk, the shared store) costs, against computing it (1)");
  flags.Double("w-queue", &options.routing.w_queue, "kv_aware: weight of a worker's queue");
  flags.Double("w-lora", &options.routing.w_lora,
               "kv_aware: what reading a request's LoRA adapter into a worker that does not hold "
               "it costs, in prompt blocks to prefill (twice that when it drops another adapter)");
  flags.Double("w-recent", &options.routing.w_recent,
               "weight of a worker's excess share of the prompts this router sent lately");
  flags.Double("recent-half-life-seconds", &recent_half_life,
               "half-life of that recent load");
  flags.Double("imbalance-ratio", &options.routing.imbalance_ratio,
               "kv_aware: above this (max+1)/(min+1) load ratio, route least-loaded...");
  flags.Double("imbalance-min-blocks", &options.routing.imbalance_min_blocks,
               "...when max and min load also differ by more than this many blocks");
  flags.Double("routing-temperature", &options.routing.temperature,
               "> 0: sample workers by softmax of their scores (several routers)");
  flags.Bool("kv-events", &options.kv_events,
             "track workers' caches by their KV events (false: predict from own decisions)");
  flags.Double("approx-ttl-seconds", &approx_ttl,
               "without events, how long a routed prompt is assumed cached");
  flags.Int("prefill-max-waiting", &options.prefill_max_waiting,
            "prefill on the decode worker when every prefill worker queues this many");
  flags.Double("worker-wait-seconds", &worker_wait, "how long to wait for the workers at start");
  flags.Int("max-inflight-requests", &options.max_inflight,
            "refuse new requests (RESOURCE_EXHAUSTED, retry hint) beyond this many in flight (0: no limit)");
  flags.Int("max-resumes", &options.max_resumes,
            "how many times a request whose decode stream broke continues on another decode worker");
  flags.Int("stream-interval", &options.stream_interval,
            "tokens a streamed message carries: 1 one engine step each; N > 1 every N tokens, "
            "and a client that falls behind gets what waits for it in one message");
  flags.Bool("shared-decode-streams", &options.shared_decode_streams,
             "one stream per decode worker carries all of this router's requests there, a "
             "message an engine step (default false: a stream a request, a message a token; "
             "experimental, see docs/guide/routing.md)");
  if (standalone) {
    flags.Int("block-size", &options.block_size, "KV block size the workers must use");
    flags.String("kv-dtype", &kv_dtype,
                 "KV cache dtype the workers must use: f32, bf16, int8 or int4");
    flags.Int("local-prefill-tokens", &options.local_prefill_tokens,
              "prefill on the decode worker when its uncached part of the prompt is this short");
    flags.Double("discovery-interval-seconds", &discovery_interval,
                 "how often dns:/// worker names are re-resolved");
    flags.Bool("enable-lora-runtime-updates", &options.lora_runtime_updates,
               "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind the API "
               "key): each load or unload goes to every worker of both tiers (started with the "
               "same flag), and to workers that join later");
  }
}

absl::Status RouterFlags::ToOptions(RouterOptions* out) const {
  *out = options;
  PD_ASSIGN_OR_RETURN(out->routing.policy, ParseRoutingPolicy(policy));
  if (http_max_connections < 1) {
    return absl::InvalidArgumentError("--http-max-connections: must be >= 1");
  }
  if (auto parser = openai::ParseToolParserName(tool_call_parser); !parser.ok()) {
    return parser.status();
  }
  if (!(http_request_timeout > 0) || http_request_timeout > 3600) {
    return absl::InvalidArgumentError("--http-request-timeout-seconds: must be in (0, 3600]");
  }
  if (!(http_keep_alive > 0) || http_keep_alive > 3600) {
    return absl::InvalidArgumentError("--http-keep-alive-seconds: must be in (0, 3600]");
  }
  PD_RETURN_IF_ERROR(AtLeast(options.routing.w_prefix, 0, "--w-prefix"));
  PD_RETURN_IF_ERROR(AtLeast(options.routing.w_queue, 0, "--w-queue"));
  if (!(options.routing.w_tier >= 0 && options.routing.w_tier <= 1)) {
    return absl::InvalidArgumentError("--w-tier: must be in [0, 1] (a loaded block costs at most computing it)");
  }
  PD_RETURN_IF_ERROR(AtLeast(options.routing.w_recent, 0, "--w-recent"));
  PD_RETURN_IF_ERROR(AtLeast(options.routing.w_lora, 0, "--w-lora"));
  if (!(recent_half_life > 0) || !std::isfinite(recent_half_life)) {
    return absl::InvalidArgumentError("--recent-half-life-seconds: must be > 0");
  }
  PD_RETURN_IF_ERROR(AtLeast(options.routing.imbalance_ratio, 1, "--imbalance-ratio"));
  PD_RETURN_IF_ERROR(AtLeast(options.routing.imbalance_min_blocks, 0, "--imbalance-min-blocks"));
  PD_RETURN_IF_ERROR(AtLeast(options.routing.temperature, 0, "--routing-temperature"));
  if (options.block_size < 1) return absl::InvalidArgumentError("--block-size: must be >= 1");
  const absl::StatusOr<KvDType> kv = ParseKvDType(kv_dtype);
  if (!kv.ok()) return absl::InvalidArgumentError(Str("--kv-dtype: ", kv.status().message()));
  out->kv_dtype = *kv;
  out->served_model_name = served_model_name;
  out->tokenizer = tokenizer;
  if (options.max_resumes < 0) return absl::InvalidArgumentError("--max-resumes: must be >= 0");
  if (options.stream_interval < 1 || options.stream_interval > 1024) {
    return absl::InvalidArgumentError("--stream-interval: must be in [1, 1024]");
  }
  if (options.max_inflight < 0) {
    return absl::InvalidArgumentError("--max-inflight-requests: must be >= 0");
  }
  if (!(discovery_interval > 0) || !std::isfinite(discovery_interval)) {
    return absl::InvalidArgumentError("--discovery-interval-seconds: must be > 0");
  }
  if (!(approx_ttl > 0) || !std::isfinite(approx_ttl)) {
    return absl::InvalidArgumentError("--approx-ttl-seconds: must be > 0");
  }
  PD_RETURN_IF_ERROR(AtLeast(worker_wait, 0, "--worker-wait-seconds"));
  out->worker_wait = absl::Seconds(worker_wait);
  out->discovery_interval = absl::Seconds(discovery_interval);
  out->approx_ttl = absl::Seconds(approx_ttl);
  out->recent_half_life = absl::Seconds(recent_half_life);
  return absl::OkStatus();
}
void TierFlags::Register(FlagSet& flags, bool decode) {
  flags.String("listen", &listen, "gRPC address, host:port (port 0 picks one)");
  flags.String("model", &model, "Hugging Face model directory");
  flags.String("transport", &transport, "KV transport: tcp, ucx, local, cuda_ipc or nccl (the last two for --device cuda: cuda_ipc for workers of one host, the decode worker pulling pages GPU to GPU; nccl a communicator per worker pair)");
  flags.String("transport-listen", &transport_listen, "where the KV transport listens (tcp)");
  flags.String("transport-advertise", &transport_advertise,
               "host peers use to reach the KV transport (tcp; default: the listen host, or the "
               "hostname when listening on 0.0.0.0; in Kubernetes: the pod IP)");
  flags.Int("kv-send-timeout-ms", &kv_send_timeout_ms,
            "tcp: give up a KV peer that accepts nothing for this long (its transfers fail)");
  if (decode) {
    flags.Int("local-prefill-tokens", &local_prefill_tokens,
              "prefill prompts of at most this many tokens here, not on a prefill worker");
    flags.Int("lease-ms", &lease_ms, "how long a remote prefill may take before it is redone here");
    flags.Int("max-waiting", &max_waiting,
              "refuse requests (RESOURCE_EXHAUSTED) when this many wait here (0: no limit)");
  }
  flags.Double("drain-seconds", &drain_seconds, "on SIGTERM, how long running requests may finish");
  engine.Register(flags, /*speculative=*/decode);
  metrics.Register(flags);
  security.RegisterTls(flags);
  kv_events.Register(flags);
  tracing.Register(flags);
}

KvTransportOptions TierFlags::TransportOptions() const {
  KvTransportOptions t;
  t.listen_address = transport_listen;
  t.advertise_host = transport_advertise;
  if (security.tls.mutual()) t.tls = {security.tls.cert, security.tls.key, security.tls.ca};
  t.send_timeout_ms = kv_send_timeout_ms;
  return t;
}

int TierFlags::Check(const char* cmd) const {
  if (absl::Status s = AtLeast(drain_seconds, 0, "--drain-seconds"); !s.ok()) {
    return ReportError(cmd, s, kExitUsage);
  }
  if (!KnownTransport(transport)) {
    return ReportError(cmd,
                       absl::InvalidArgumentError(Str("--transport: unknown KV transport '",
                                                      transport,
                                                      "' (tcp, ucx, local, cuda_ipc or nccl)")),
                       kExitUsage);
  }
  if (lease_ms < 1) {
    return ReportError(cmd, absl::InvalidArgumentError("--lease-ms: must be >= 1"), kExitUsage);
  }
  if (kv_send_timeout_ms < 1) {
    return ReportError(cmd, absl::InvalidArgumentError("--kv-send-timeout-ms: must be >= 1"),
                       kExitUsage);
  }
  if (max_waiting < 0) {
    return ReportError(cmd, absl::InvalidArgumentError("--max-waiting: must be >= 0"), kExitUsage);
  }
  if (absl::Status s = kv_events.Check(); !s.ok()) return ReportError(cmd, s, kExitUsage);
  if (absl::Status s = tracing.Check(); !s.ok()) return ReportError(cmd, s, kExitUsage);
  AddressFlags addresses;
  addresses.Listen(listen, "--listen").Listen(metrics.listen, "--metrics-listen", true);
  if (transport == "tcp") addresses.Listen(transport_listen, "--transport-listen");
  if (!transport_advertise.empty()) {
    if (absl::Status s = ValidateHost(transport_advertise, "--transport-advertise"); !s.ok()) {
      return ReportError(cmd, s, kExitUsage);
    }
  }
  if (absl::Status s = addresses.Check(); !s.ok()) {
    return ReportError(cmd, s, AddressExitCode(s));
  }
  if ((transport == "ucx" || transport == "nccl") && security.tls.mutual()) {
    // One-sided RDMA puts and NCCL's sends carry no TLS: say so rather than let --tls-ca
    // suggest otherwise. (cuda_ipc's pages never leave the host.)
    PD_LOG(Warning) << cmd << ": KV pages over " << transport << " are not encrypted; --tls-ca "
                    << "protects the gRPC calls between the tiers"
                    << (transport == "nccl" ? " and nccl's control connection" : "")
                    << " only (use tcp for encrypted KV pages)";
  }
  return -1;
}
std::string ModelName(const TierFlags& f) {
  return f.served_model_name.empty() ? BaseName(f.model) : f.served_model_name;
}

}  // namespace pdserve::cli
