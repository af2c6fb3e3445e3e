// pdserve serve: the router, a prefill worker and a decode worker in one process (the local KV
// transport, one copy of the weights).

#include <chrono>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/http_gateway.h"
#include "cli/tier_flags.h"
#include "cli/tier_lifetime.h"
#include "cli/address_flags.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/engine/shared_weights.h"
#include "decode_service/decode_grpc_service.h"
#include "prefill_service/prefill_grpc_service.h"
#include "router/router_grpc_service.h"

namespace pdserve::cli {

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
  // One set of LoRA adapters for both workers.
  if (absl::Status s = f.engine.LoraToOptions(f.model, &po.engine); !s.ok()) return ReportError(cmd, s, kExitUsage);
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
  // The router reaches its own workers in-process (their ports stay open: the decode worker
  // calls the prefill worker's by address, and operators may look at them).
  ro.worker_channels[prefill_server->address] = InProcessChannel(*prefill_server->server);
  ro.worker_channels[decode_server->address] = InProcessChannel(*decode_server->server);
  ro.block_size = po.engine.block_size;
  ro.kv_dtype = po.engine.kv_dtype;
  ro.local_prefill_tokens = f.local_prefill_tokens;
  ro.metrics = &registry;
  ro.api_keys = *keys;
  ro.lora_runtime_updates = f.engine.lora_runtime_updates;  // One flag for the three.
  ro.tracer = tracer->tracer.get();
  auto router = Router::Create(ro);
  if (!router.ok()) return ReportError(cmd, router.status());
  GenerationService service(router->get());
  RouterAdminService admin(router->get());
  auto server = StartGrpcServer(f.listen, {&service, &admin}, *server_options);
  if (!server.ok()) return ReportError(cmd, server.status());
  auto exporter = f.metrics.Start(&registry);
  if (!exporter.ok()) return ReportFlagError(cmd, exporter.status());
  auto target = GatewayTarget(rf, router->get(), f.security);
  if (!target.ok()) return ReportError(cmd, target.status());
  auto http = StartHttp(rf, f.model, **target, f.security, *keys, **router, &registry);
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
  (*router)->Stop();  // Before the workers' servers shut down (the router's channels are in-process).
  decode_service.CloseStreams();
  decode_server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  prefill_server->server->Shutdown(std::chrono::system_clock::now() + kFlushCalls);
  if (tracer->tracer != nullptr) tracer->tracer->Flush();  // The last spans.
  ExitAfterShutdown(kExitOk);
}

}  // namespace pdserve::cli
