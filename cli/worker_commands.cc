// pdserve prefill | decode: the worker tiers as processes. Each prints one line when it is
// ready, e.g.
//   pdserve decode ready: grpc=127.0.0.1:8200 transport=tcp://host:40123
// and on SIGTERM or SIGINT stops taking requests, lets running ones finish (up to
// --drain-seconds), and exits 0.

#include <chrono>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/tier_flags.h"
#include "cli/tier_lifetime.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "decode_service/decode_grpc_service.h"
#include "prefill_service/prefill_grpc_service.h"

namespace pdserve::cli {
namespace {

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
  if (absl::Status s = f.engine.LoraToOptions(f.model, &o.engine); !s.ok()) return ReportError(cmd, s, kExitUsage);
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
  if (absl::Status s = f.engine.LoraToOptions(f.model, &o.engine); !s.ok()) return ReportError(cmd, s, kExitUsage);
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
  service.CloseStreams();  // A router's shared stream never ends by itself.
  server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  if (tracer->tracer != nullptr) tracer->tracer->Flush();  // The last spans.
  ExitAfterShutdown(kExitOk);
}

}  // namespace

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

}  // namespace pdserve::cli
