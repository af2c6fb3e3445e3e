// pdserve router: the public pdserve.v1.Generation API (and with --http-listen the OpenAI API)
// over prefill and decode workers in other processes.

#include <chrono>
#include <memory>

#include "cli/address_flags.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/http_gateway.h"
#include "cli/metrics_flags.h"
#include "cli/planner_flags.h"
#include "cli/tier_flags.h"
#include "cli/tier_lifetime.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "router/router_grpc_service.h"

namespace pdserve::cli {

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
  auto target = GatewayTarget(rf, router->get(), sf);
  if (!target.ok()) return ReportError(cmd, target.status());
  auto http = StartHttp(rf, model, **target, sf, *keys, **router, &registry);
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

}  // namespace pdserve::cli
