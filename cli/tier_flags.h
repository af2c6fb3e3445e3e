// The flags of the tier commands: a worker's (prefill, decode, serve) and the router's (router,
// serve), each with the checks that need no model, so a bad flag is refused before minutes of
// model loading.
#ifndef PDSERVE_CLI_TIER_FLAGS_H_
#define PDSERVE_CLI_TIER_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "cli/kv_events_flags.h"
#include "cli/metrics_flags.h"
#include "cli/security_flags.h"
#include "cli/tracing_flags.h"
#include "common/engine/engine_options.h"
#include "common/transport/kv_transport.h"
#include "router/router.h"

namespace pdserve::cli {

// cuda_ipc and nccl move pages between GPU pools only. (The transport registry makes the same
// check; this says it before the model loads.) A CUDA worker may use any transport: tcp and ucx
// stage its pages through host memory.
absl::Status TierDevice(const EngineOptions& engine, const std::string& transport);

// A weight or ratio flag: a finite number >= `lo` (NaN and infinities are refused: `x < 0` lets
// NaN through).
absl::Status AtLeast(double v, double lo, const char* flag);

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

  void Register(FlagSet& flags, bool standalone);

  absl::Status ToOptions(RouterOptions* out) const;
};

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

  void Register(FlagSet& flags, bool decode);

  KvTransportOptions TransportOptions() const;

  // The checks that need no model: addresses (syntax, then free ports) and plain ranges. Returns
  // the exit code, or -1 to go on.
  int Check(const char* cmd) const;
};

// The model's name in metrics: --served-model-name, else the model directory's.
std::string ModelName(const TierFlags& f);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_TIER_FLAGS_H_
