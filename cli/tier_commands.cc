// pdserve prefill | decode | router | serve: the tiers as processes.
//
// Each prints one line when it is ready, e.g.
//   pdserve decode ready: grpc=127.0.0.1:8200 transport=tcp://host:40123
// and on SIGTERM or SIGINT stops taking requests, lets running ones finish (up to
// --drain-seconds), and exits 0.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include <grpcpp/health_check_service_interface.h>

#include "cli/address_flags.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/kv_events_flags.h"
#include "cli/metrics_flags.h"
#include "cli/planner_flags.h"
#include "cli/security_flags.h"
#include "cli/tracing_flags.h"
#include "common/base/file_util.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/shared_weights.h"
#include "common/rpc/server_builder.h"
#include "decode_service/decode_grpc_service.h"
#include "openai_api/openai_server.h"
#include "openai_api/tool_calls.h"
#include "prefill_service/prefill_grpc_service.h"
#include "router/router_grpc_service.h"

namespace pdserve::cli {
namespace {

// cuda_ipc and nccl move pages between GPU pools only. (The transport registry makes the same
// check; this says it before the model loads.) A CUDA worker may use any transport: tcp and ucx
// stage its pages through host memory.
absl::Status TierDevice(const EngineOptions& engine, const std::string& transport) {
  if (engine.backend != "cuda" && (transport == "cuda_ipc" || transport == "nccl")) {
    return absl::InvalidArgumentError(
        Str("--transport ", transport, " moves pages between GPU pools: it needs --device cuda"));
  }
  return absl::OkStatus();
}

// SIGTERM/SIGINT write a byte to this pipe (the only async-signal-safe thing the handler does);
// a watcher thread blocks reading it. A handler rather than sigwait, because threads started
// before main (OpenBLAS starts its pool from a library constructor) would otherwise take the
// signal with its default action and kill the process.
int g_stop_pipe[2] = {-1, -1};

void OnStopSignal(int signal) {
  const char b = static_cast<char>(signal);
  [[maybe_unused]] ssize_t n = ::write(g_stop_pipe[1], &b, 1);
}

// Before a tier's ready line nothing is serving (a router waiting for its workers, a worker
// loading its model): a stop signal ends the process at once, exit 0. After it, the signal wakes
// the command's main thread, which drains. Guarded by g_stop_mu.
std::mutex g_stop_mu;
std::condition_variable g_stop_cv;
bool g_serving = false;
bool g_stop_requested = false;

[[noreturn]] void ExitAfterShutdown(int code);

// Started by each tier command before it loads anything.
void StartStopWatcher(const char* cmd) {
  std::thread([cmd] {
    char b;
    while (::read(g_stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    std::lock_guard<std::mutex> lock(g_stop_mu);
    if (!g_serving) {
      PD_LOG(Info) << cmd << ": stopped before it was ready";
      ExitAfterShutdown(kExitOk);
    }
    g_stop_requested = true;
    g_stop_cv.notify_all();
  }).detach();
}

void WaitForStopSignal() {
  std::unique_lock<std::mutex> lock(g_stop_mu);
  g_stop_cv.wait(lock, [] { return g_stop_requested; });
}

// Ends a tier process after its orderly shutdown: requests drained, servers shut down (every
// call finished or cancelled). Nothing is destroyed after that: gRPC 1.51's callback threads are
// still releasing the servers' completion queues when Shutdown returns, and freeing channels or
// servers meanwhile corrupted the heap (double free in grpc_cq_internal_unref, ~1 in 3 `serve`
// exits after a request that failed validation; and earlier SIGABRT from exit handlers). Nothing
// is left to clean up, so leave at once.
[[noreturn]] void ExitAfterShutdown(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

// After a drain, how long Shutdown lets calls finish writing what they have queued: a worker's
// Drain returns when the engine is done, while its stream reactors may still hold the drained
// requests' last tokens. Calls that are done end it at once; 1 s was too short on a loaded
// machine (the call was cancelled and a drained stream lost its last tokens, once in CI).
constexpr std::chrono::seconds kFlushCalls{10};

// A bad --metrics-* flag is a usage error; an address that cannot be bound is not.
int ReportFlagError(const char* cmd, const absl::Status& s) {
  return ReportError(cmd, s, s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitError);
}

void Ready(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_stop_mu);
  g_serving = true;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// A weight or ratio flag: a finite number >= `lo` (NaN and infinities are refused: `x < 0` lets
// NaN through).
absl::Status AtLeast(double v, double lo, const char* flag) {
  if (std::isfinite(v) && v >= lo) return absl::OkStatus();
  return absl::InvalidArgumentError(Str(flag, ": must be a finite number >= ", lo, ", got ", v));
}

// The KV transports by name, for the usage check before anything loads (the registry says which
// are built into this binary).
bool KnownTransport(const std::string& t) {
  return t == "tcp" || t == "ucx" || t == "local" || t == "cuda_ipc" || t == "nccl";
}

// The router's routing flags (router and serve).
struct RouterFlags {
  std::string policy = "kv_aware";
  std::string kv_dtype = "f32";
  RouterOptions options;
  double worker_wait = 60;
  double discovery_interval = 5;
  double approx_ttl = 120;
  double recent_half_life = 2;
  std::string http_listen, served_model_name, chat_template, tool_call_parser, tokenizer;
  int64_t http_max_connections = 1024;
  double http_request_timeout = 30;
  double http_keep_alive = 75;

  void Register(FlagSet& flags, bool standalone) {
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
    if (standalone) {
      flags.Int("block-size", &options.block_size, "KV block size the workers must use");
      flags.String("kv-dtype", &kv_dtype,
                   "KV cache dtype the workers must use: f32, bf16, int8 or int4");
      flags.Int("local-prefill-tokens", &options.local_prefill_tokens,
                "prefill on the decode worker when its uncached part of the prompt is this short");
      flags.Double("discovery-interval-seconds", &discovery_interval,
                   "how often dns:/// worker names are re-resolved");
    }
  }

  absl::Status ToOptions(RouterOptions* out) const {
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
};

// From the stop signal on, the gRPC health service answers NOT_SERVING, so readiness probes (a
// Kubernetes Service stops sending new connections) and health-checking clients see the drain.
void MarkNotServing(const StartedServer& server) {
  if (auto* health = server.server->GetHealthCheckService()) health->SetServingStatus(false);
}

struct TierFlags {
  std::string listen;
  std::string model;
  std::string transport = "tcp";
  std::string transport_listen = "127.0.0.1:0";
  std::string transport_advertise;
  int64_t local_prefill_tokens = 32;
  int64_t lease_ms = 60000;
  int64_t max_waiting = 512;
  int64_t kv_send_timeout_ms = 30000;
  double drain_seconds = 30;
  std::string served_model_name;  // prefill, decode (serve takes the router's flag).
  std::string tokenizer;          // prefill, decode (serve takes the router's flag).
  EngineFlags engine;
  MetricsFlags metrics;
  SecurityFlags security;
  KvEventsFlags kv_events;
  TracingFlags tracing;

  void Register(FlagSet& flags, bool decode) {
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

  KvTransportOptions TransportOptions() const {
    KvTransportOptions t;
    t.listen_address = transport_listen;
    t.advertise_host = transport_advertise;
    if (security.tls.mutual()) t.tls = {security.tls.cert, security.tls.key, security.tls.ca};
    t.send_timeout_ms = kv_send_timeout_ms;
    return t;
  }

  // The checks that need no model: addresses (syntax, then free ports) and plain ranges. Returns
  // the exit code, or -1 to go on.
  int Check(const char* cmd) const {
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
};

// The model's name in metrics: --served-model-name, else the model directory's.
std::string ModelName(const TierFlags& f) {
  return f.served_model_name.empty() ? BaseName(f.model) : f.served_model_name;
}

int RunPrefill(const TierFlags& f) {
  const char* cmd = "prefill";
  metrics::Registry registry;
  PrefillWorkerOptions o;
  o.served_model_name = f.served_model_name;
  o.metrics = &registry;
  o.model_dir = f.model;
  o.transport = f.transport;
  o.transport_options = f.TransportOptions();
  if (absl::Status s = f.engine.ToOptions(&o.engine); !s.ok()) return ReportError(cmd, s, kExitUsage);
  if (absl::Status s = TierDevice(o.engine, f.transport); !s.ok()) return ReportError(cmd, s, kExitUsage);
  o.engine.tokenizer = f.tokenizer;
  auto server_options = f.security.InternalServer();
  if (!server_options.ok()) return ReportError(cmd, server_options.status(), kExitUsage);
  auto kv_events = f.kv_events.Start(o.engine.block_size, o.engine.backend);
  if (!kv_events.ok()) return ReportError(cmd, kv_events.status(), kExitUsage);
  o.kv_events = kv_events->get();
  o.engine.kv_event_tokens = o.kv_events != nullptr;
  auto tracer = StartTracer(f.tracing, "prefill", ModelName(f), &registry);
  if (!tracer.ok()) return ReportError(cmd, tracer.status(), kExitUsage);
  o.tracer = tracer->tracer.get();
  auto worker = PrefillWorker::Create(o);
  if (!worker.ok()) return ReportError(cmd, worker.status());
  PrefillGrpcService service(worker->get());
  auto server = StartGrpcServer(f.listen, {&service}, *server_options);
  if (!server.ok()) return ReportError(cmd, server.status());
  auto exporter = f.metrics.Start(&registry);
  if (!exporter.ok()) return ReportFlagError(cmd, exporter.status());
  Ready(Str("pdserve prefill ready: grpc=", server->address, " transport=",
            (*worker)->TransportDescription(), MetricsReadyField(exporter->get()),
            KvEventsReadyField(kv_events->get())));
  WaitForStopSignal();
  PD_LOG(Info) << "prefill: draining";
  MarkNotServing(*server);
  (*worker)->Drain(absl::Seconds(f.drain_seconds));
  server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  if (tracer->tracer != nullptr) tracer->tracer->Flush();  // The last spans.
  ExitAfterShutdown(kExitOk);
}

int RunDecode(const TierFlags& f) {
  const char* cmd = "decode";
  metrics::Registry registry;
  DecodeWorkerOptions o;
  o.served_model_name = f.served_model_name;
  o.metrics = &registry;
  o.model_dir = f.model;
  o.transport = f.transport;
  o.transport_options = f.TransportOptions();
  o.local_prefill_tokens = f.local_prefill_tokens;
  o.lease_ms = f.lease_ms;
  o.max_waiting = f.max_waiting;
  if (absl::Status s = f.engine.ToOptions(&o.engine); !s.ok()) return ReportError(cmd, s, kExitUsage);
  if (absl::Status s = TierDevice(o.engine, f.transport); !s.ok()) return ReportError(cmd, s, kExitUsage);
  o.engine.tokenizer = f.tokenizer;
  auto server_options = f.security.InternalServer();
  if (!server_options.ok()) return ReportError(cmd, server_options.status(), kExitUsage);
  auto prefill_credentials = f.security.InternalChannel();
  if (!prefill_credentials.ok()) return ReportError(cmd, prefill_credentials.status(), kExitUsage);
  o.prefill_credentials = *prefill_credentials;
  auto kv_events = f.kv_events.Start(o.engine.block_size, o.engine.backend);
  if (!kv_events.ok()) return ReportError(cmd, kv_events.status(), kExitUsage);
  o.kv_events = kv_events->get();
  o.engine.kv_event_tokens = o.kv_events != nullptr;
  auto tracer = StartTracer(f.tracing, "decode", ModelName(f), &registry);
  if (!tracer.ok()) return ReportError(cmd, tracer.status(), kExitUsage);
  o.tracer = tracer->tracer.get();
  auto worker = DecodeWorker::Create(o);
  if (!worker.ok()) return ReportError(cmd, worker.status());
  DecodeGrpcService service(worker->get());
  auto server = StartGrpcServer(f.listen, {&service}, *server_options);
  if (!server.ok()) return ReportError(cmd, server.status());
  auto exporter = f.metrics.Start(&registry);
  if (!exporter.ok()) return ReportFlagError(cmd, exporter.status());
  Ready(Str("pdserve decode ready: grpc=", server->address, " transport=",
            (*worker)->TransportDescription(), MetricsReadyField(exporter->get()),
            KvEventsReadyField(kv_events->get())));
  WaitForStopSignal();
  PD_LOG(Info) << "decode: draining";
  MarkNotServing(*server);
  (*worker)->Drain(absl::Seconds(f.drain_seconds));
  server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  if (tracer->tracer != nullptr) tracer->tracer->Flush();  // The last spans.
  ExitAfterShutdown(kExitOk);
}

}  // namespace

void InstallStopSignalHandler() {
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A parent may have started us with them blocked (the mask is inherited across exec): a stop
  // signal must always reach the handler.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
}

void StartExitOnStopSignal(const char* cmd) {
  std::thread([cmd] {
    char b = 0;
    while (::read(g_stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    std::fprintf(stderr, "pdserve %s: stopped by signal %d\n", cmd, static_cast<int>(b));
    ExitAfterShutdown(128 + static_cast<int>(b));  // The shell's convention: 130 for Ctrl-C.
  }).detach();
}

// The OpenAI HTTP API in front of the public gRPC server at `grpc_address` (null when
// --http-listen is empty).
absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> StartHttp(
    const RouterFlags& rf, const std::string& model, const std::string& grpc_address,
    const SecurityFlags& security, const ApiKeys& keys, const Router& router,
    metrics::Registry* registry) {
  if (rf.http_listen.empty()) return std::unique_ptr<openai::OpenAiServer>();
  openai::OpenAiServerOptions o;
  o.listen = rf.http_listen;
  o.grpc_target = grpc_address;
  o.model_dir = model;
  o.served_model_name = rf.served_model_name.empty() ? BaseName(model) : rf.served_model_name;
  o.chat_template = rf.chat_template;
  o.tokenizer = rf.tokenizer;
  o.max_request_bytes = static_cast<size_t>(security.max_request_bytes);
  o.max_model_len = router.model_info().context_length();
  o.tls_cert = security.tls.cert;
  o.tls_key = security.tls.key;
  o.max_connections = static_cast<size_t>(rf.http_max_connections);
  o.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(rf.http_request_timeout * 1000));
  o.metrics = registry;
  o.tool_call_parser = rf.tool_call_parser;
  o.api_keys = keys;
  o.keep_alive = std::chrono::milliseconds(static_cast<int64_t>(rf.http_keep_alive * 1000));
  o.max_inflight = rf.options.max_inflight;
  // OpenAI's system_fingerprint: the serving configuration (model, context, KV layout), so a
  // client sees when it changes.
  const v1::ModelInfo& info = router.model_info();
  o.system_fingerprint =
      Str("fp_", absl::Hex(std::hash<std::string>()(info.SerializeAsString()) & 0xffffffffffULL,
                           absl::kZeroPad10));
  return openai::OpenAiServer::Start(o);
}

// The gateway's way into the Generation service. With TLS on the public port, a second, plain
// listener on loopback only (the same service, so API keys still apply); else the public port.
struct HttpGatewayTarget {
  std::unique_ptr<GenerationService> service;
  StartedServer server;
  std::string address;
};

absl::StatusOr<std::unique_ptr<HttpGatewayTarget>> GatewayTarget(const RouterFlags& rf, Router* router,
                                                                   const std::string& public_address,
                                                                   const SecurityFlags& security) {
  auto t = std::make_unique<HttpGatewayTarget>();
  t->address = public_address;
  if (rf.http_listen.empty() || !security.tls.server_tls()) return t;
  t->service = std::make_unique<GenerationService>(router);
  ServerOptions o;
  o.max_receive_bytes = static_cast<int>(security.max_request_bytes);
  o.flag = "--http-listen";
  PD_ASSIGN_OR_RETURN(t->server, StartGrpcServer("127.0.0.1:0", {t->service.get()}, o));
  t->address = t->server.address;
  return t;
}

std::string HttpReadyField(const openai::OpenAiServer* http) {
  return http == nullptr ? "" : Str(" http=", http->address());
}

// The public side's drain after a stop signal: new HTTP requests and the health endpoints say the
// server is stopping; calls in flight finish (gRPC within `grace`), then the HTTP responses they
// feed are written out before the process leaves. (Leaving as soon as gRPC's calls ended cut the
// last chunks of HTTP responses still on their way to the client.)
void DrainPublic(const StartedServer& server, openai::OpenAiServer* http,
                 std::chrono::seconds grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  MarkNotServing(server);
  if (http != nullptr) http->BeginDrain();
  server.server->Shutdown(std::chrono::system_clock::now() + grace);
  if (http != nullptr && !http->WaitDrained(deadline + kFlushCalls)) {
    PD_LOG(Warning) << "HTTP responses still in flight at the drain's end are cut";
  }
}

std::chrono::seconds DrainGrace(double seconds) {
  return std::chrono::seconds(static_cast<int64_t>(std::ceil(seconds)));
}


int PrefillCommand(int argc, char** argv) {
  TierFlags f;
  f.listen = "0.0.0.0:8100";
  FlagSet flags("prefill", "Runs a prefill worker: computes prompts' KV and sends the pages to "
                           "decode workers.");
  f.Register(flags, false);
  flags.String("served-model-name", &f.served_model_name,
               "the model name in metrics (default: the model directory's name)");
  flags.String("tokenizer", &f.tokenizer,
               "the tokenizer structured outputs read token bytes from, instead of the model's");
  int code;
  if (!ParseFlagsOrExit(flags, "prefill", argc, argv, &code)) return code;
  if (f.model.empty()) return ReportError("prefill", absl::InvalidArgumentError("--model is required"), kExitUsage);
  if (int checked = f.Check("prefill"); checked >= 0) return checked;
  StartStopWatcher("prefill");
  return RunPrefill(f);
}

int DecodeCommand(int argc, char** argv) {
  TierFlags f;
  f.listen = "0.0.0.0:8200";
  FlagSet flags("decode", "Runs a decode worker: owns a KV pool, generates with continuous batching.");
  f.Register(flags, true);
  flags.String("served-model-name", &f.served_model_name,
               "the model name in metrics (default: the model directory's name)");
  flags.String("tokenizer", &f.tokenizer,
               "the tokenizer structured outputs read token bytes from, instead of the model's");
  int code;
  if (!ParseFlagsOrExit(flags, "decode", argc, argv, &code)) return code;
  if (f.model.empty()) return ReportError("decode", absl::InvalidArgumentError("--model is required"), kExitUsage);
  if (int checked = f.Check("decode"); checked >= 0) return checked;
  StartStopWatcher("decode");
  return RunDecode(f);
}

int RouterCommand(int argc, char** argv) {
  const char* cmd = "router";
  std::string listen = "0.0.0.0:8000", model, prefill, decode;
  double drain_seconds = 30;
  RouterFlags rf;
  MetricsFlags mf;
  SecurityFlags sf;
  TracingFlags tf;
  FlagSet flags("router", "Runs the router: the public pdserve.v1.Generation API over the tiers.");
  flags.String("listen", &listen, "public gRPC address, host:port");
  flags.String("model", &model, "the model directory (config.json and tokenizer; no weights)");
  flags.String("prefill", &prefill,
               "prefill workers: host:port or dns:///name:port, comma-separated (may be empty)");
  flags.String("decode", &decode, "decode workers: host:port or dns:///name:port, comma-separated");
  flags.Double("drain-seconds", &drain_seconds,
               "on SIGTERM, how long requests in flight may finish (new ones are refused)");
  rf.Register(flags, true);
  mf.Register(flags);
  sf.RegisterTls(flags);
  sf.RegisterPublic(flags);
  tf.Register(flags);
  PlannerFlags pf;
  pf.Register(flags);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (model.empty()) return ReportError(cmd, absl::InvalidArgumentError("--model is required"), kExitUsage);
  AddressFlags addresses;
  addresses.Listen(listen, "--listen")
      .Listen(mf.listen, "--metrics-listen", true)
      .Listen(rf.http_listen, "--http-listen", true)
      .Peers(prefill, "--prefill", true)
      .Peers(decode, "--decode", false);
  if (absl::Status s = addresses.Check(); !s.ok()) return ReportError(cmd, s, AddressExitCode(s));
  if (absl::Status s = AtLeast(drain_seconds, 0, "--drain-seconds"); !s.ok()) {
    return ReportError(cmd, s, kExitUsage);
  }
  if (absl::Status s = tf.Check(); !s.ok()) return ReportError(cmd, s, kExitUsage);
  RouterOptions o;
  if (absl::Status s = rf.ToOptions(&o); !s.ok()) return ReportError(cmd, s, kExitUsage);
  auto planner_options = pf.ToOptions(o.block_size, o.routing.policy);
  if (!planner_options.ok()) return ReportError(cmd, planner_options.status(), kExitUsage);
  if (planner_options->has_value()) {
    auto config = ModelConfig::FromFile(JoinPath(model, "config.json"));
    if (!config.ok()) return ReportError(cmd, config.status(), kExitUsage);
    if (absl::Status s = CheckProfileModel((*planner_options)->profile, *config); !s.ok()) {
      return ReportError(cmd, absl::InvalidArgumentError(Str("--planner-profile: ", s.message())), kExitUsage);
    }
  }
  StartStopWatcher(cmd);
  metrics::Registry registry;
  o.model_dir = model;
  o.prefill = prefill;
  o.decode = decode;
  o.metrics = &registry;
  auto server_options = sf.PublicServer();
  if (!server_options.ok()) return ReportError(cmd, server_options.status(), kExitUsage);
  auto worker_credentials = sf.InternalChannel();
  if (!worker_credentials.ok()) return ReportError(cmd, worker_credentials.status(), kExitUsage);
  o.worker_credentials = *worker_credentials;
  auto keys = sf.Keys();
  if (!keys.ok()) return ReportError(cmd, keys.status(), kExitUsage);
  o.api_keys = *keys;
  auto tracer = StartTracer(tf, "router",
                            rf.served_model_name.empty() ? BaseName(model) : rf.served_model_name,
                            &registry);
  if (!tracer.ok()) return ReportError(cmd, tracer.status(), kExitUsage);
  o.tracer = tracer->tracer.get();
  auto router = Router::Create(o);
  if (!router.ok()) return ReportError(cmd, router.status());
  GenerationService service(router->get());
  RouterAdminService admin(router->get());
  auto server = StartGrpcServer(listen, {&service, &admin}, *server_options);
  if (!server.ok()) return ReportError(cmd, server.status());
  auto exporter = mf.Start(&registry);
  if (!exporter.ok()) return ReportFlagError(cmd, exporter.status());
  // The online planner reads the router's totals: requests arrived, prompts and tokens served.
  std::unique_ptr<PlannerLoop> planner;
  if (planner_options->has_value()) {
    Router* r = router->get();
    planner = std::make_unique<PlannerLoop>(
        **planner_options,
        [r] {
          TrafficCounters c;
          c.requests = static_cast<double>(r->Stats().requests());
          const metrics::RequestMetrics& m = r->metrics().requests();
          c.prompt_tokens = m.prompt_tokens();
          c.first_tokens = static_cast<double>(m.first_tokens());
          c.generation_tokens = m.generation_tokens();
          return c;
        },
        &registry, rf.served_model_name.empty() ? BaseName(model) : rf.served_model_name);
  }
  auto target = GatewayTarget(rf, router->get(), server->address, sf);
  if (!target.ok()) return ReportError(cmd, target.status());
  auto http = StartHttp(rf, model, (*target)->address, sf, *keys, **router, &registry);
  if (!http.ok()) return ReportFlagError(cmd, http.status());
  Ready(Str("pdserve router ready: grpc=", server->address, MetricsReadyField(exporter->get()),
            HttpReadyField(http->get())));
  WaitForStopSignal();
  planner.reset();
  PD_LOG(Info) << "router: draining";
  DrainPublic(*server, http->get(), DrainGrace(drain_seconds));
  if (tracer->tracer != nullptr) tracer->tracer->Flush();  // The last spans.
  ExitAfterShutdown(kExitOk);
}

int ServeCommand(int argc, char** argv) {
  const char* cmd = "serve";
  TierFlags f;
  f.listen = "127.0.0.1:8000";
  f.transport = "local";
  RouterFlags rf;
  FlagSet flags("serve", "Runs router, prefill and decode in one process (local KV transport).");
  f.Register(flags, true);
  rf.Register(flags, false);
  f.security.RegisterPublic(flags);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (f.model.empty()) return ReportError(cmd, absl::InvalidArgumentError("--model is required"), kExitUsage);
  if (int checked = f.Check(cmd); checked >= 0) return checked;
  // Every flag is checked before the engines load (minutes for a large model).
  AddressFlags http_address;
  http_address.Listen(rf.http_listen, "--http-listen", true);
  if (absl::Status s = http_address.Check(); !s.ok()) return ReportError(cmd, s, AddressExitCode(s));
  RouterOptions ro;
  if (absl::Status s = rf.ToOptions(&ro); !s.ok()) return ReportError(cmd, s, kExitUsage);
  // The tiers talk over loopback inside this process; TLS and API keys guard the public port.
  auto server_options = f.security.PublicServer();
  if (!server_options.ok()) return ReportError(cmd, server_options.status(), kExitUsage);
  auto keys = f.security.Keys();
  if (!keys.ok()) return ReportError(cmd, keys.status(), kExitUsage);
  StartStopWatcher(cmd);

  // One registry: the three components' series differ by their role label.
  metrics::Registry registry;
  PrefillWorkerOptions po;
  po.metrics = &registry;
  po.model_dir = f.model;
  po.served_model_name = rf.served_model_name;
  po.transport = f.transport;
  po.transport_options = f.TransportOptions();
  DecodeWorkerOptions dopts;
  dopts.metrics = &registry;
  dopts.model_dir = f.model;
  dopts.served_model_name = rf.served_model_name;
  dopts.transport = f.transport;
  dopts.transport_options = f.TransportOptions();
  dopts.local_prefill_tokens = f.local_prefill_tokens;
  dopts.lease_ms = f.lease_ms;
  dopts.max_waiting = f.max_waiting;
  if (absl::Status s = f.engine.ToOptions(&po.engine); !s.ok()) return ReportError(cmd, s, kExitUsage);
  if (absl::Status s = TierDevice(po.engine, f.transport); !s.ok()) return ReportError(cmd, s, kExitUsage);
  // One model in memory for both workers: loaded once, the cpu runner's copies made once, one
  // upload to the GPU whose memory the two then share.
  po.engine.shared_weights = std::make_shared<SharedWeights>();
  if (po.engine.backend == "cuda") po.engine.engines_per_device = 2;
  po.engine.tokenizer = rf.tokenizer;
  dopts.engine = po.engine;
  po.engine.speculative = SpeculativeOptions{};  // The prefill worker samples one token.
  // KV events: the decode worker's cache (every request's KV ends there; the prefill worker's
  // cache only saves it recomputing shared prefixes).
  auto kv_events = f.kv_events.Start(dopts.engine.block_size, dopts.engine.backend);
  if (!kv_events.ok()) return ReportError(cmd, kv_events.status(), kExitUsage);
  dopts.kv_events = kv_events->get();
  dopts.engine.kv_event_tokens = dopts.kv_events != nullptr;
  // One tracer for the three: a request's router, decode and prefill spans in one process.
  auto tracer = StartTracer(f.tracing, "serve",
                            rf.served_model_name.empty() ? BaseName(f.model) : rf.served_model_name,
                            &registry);
  if (!tracer.ok()) return ReportError(cmd, tracer.status(), kExitUsage);
  po.tracer = dopts.tracer = tracer->tracer.get();
  auto prefill = PrefillWorker::Create(po);
  if (!prefill.ok()) return ReportError(cmd, prefill.status());
  auto decode = DecodeWorker::Create(dopts);
  if (!decode.ok()) return ReportError(cmd, decode.status());
  PrefillGrpcService prefill_service(prefill->get());
  DecodeGrpcService decode_service(decode->get());
  auto prefill_server = StartGrpcServer("127.0.0.1:0", {&prefill_service});
  if (!prefill_server.ok()) return ReportError(cmd, prefill_server.status());
  auto decode_server = StartGrpcServer("127.0.0.1:0", {&decode_service});
  if (!decode_server.ok()) return ReportError(cmd, decode_server.status());
  ro.model_dir = f.model;
  ro.prefill = prefill_server->address;
  ro.decode = decode_server->address;
  ro.block_size = po.engine.block_size;
  ro.kv_dtype = po.engine.kv_dtype;
  ro.local_prefill_tokens = f.local_prefill_tokens;
  ro.metrics = &registry;
  ro.api_keys = *keys;
  ro.tracer = tracer->tracer.get();
  auto router = Router::Create(ro);
  if (!router.ok()) return ReportError(cmd, router.status());
  GenerationService service(router->get());
  RouterAdminService admin(router->get());
  auto server = StartGrpcServer(f.listen, {&service, &admin}, *server_options);
  if (!server.ok()) return ReportError(cmd, server.status());
  auto exporter = f.metrics.Start(&registry);
  if (!exporter.ok()) return ReportFlagError(cmd, exporter.status());
  auto target = GatewayTarget(rf, router->get(), server->address, f.security);
  if (!target.ok()) return ReportError(cmd, target.status());
  auto http = StartHttp(rf, f.model, (*target)->address, f.security, *keys, **router, &registry);
  if (!http.ok()) return ReportFlagError(cmd, http.status());
  Ready(Str("pdserve serve ready: grpc=", server->address, MetricsReadyField(exporter->get()),
            HttpReadyField(http->get()), KvEventsReadyField(kv_events->get())));
  WaitForStopSignal();
  PD_LOG(Info) << "serve: draining";
  MarkNotServing(*server);
  if (*http != nullptr) (*http)->BeginDrain();
  (*decode)->Drain(absl::Seconds(f.drain_seconds));
  (*prefill)->Drain(absl::Seconds(1));
  DrainPublic(*server, http->get(), kFlushCalls);
  decode_server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  prefill_server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  if (tracer->tracer != nullptr) tracer->tracer->Flush();  // The last spans.
  ExitAfterShutdown(kExitOk);
}

}  // namespace pdserve::cli
