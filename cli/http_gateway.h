// The OpenAI-compatible HTTP API in front of a router's public gRPC server (router and serve):
// starting it from the router's flags, and the public side's drain.
#ifndef PDSERVE_CLI_HTTP_GATEWAY_H_
#define PDSERVE_CLI_HTTP_GATEWAY_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/security_flags.h"
#include "cli/tier_flags.h"
#include "common/metrics/metrics.h"
#include "common/rpc/server_builder.h"
#include "openai_api/openai_server.h"
#include "router/router.h"
#include "router/router_grpc_service.h"

namespace pdserve::cli {

// The gateway's way into the Generation service: an in-process channel to a second gRPC server
// of the same service (so API keys still apply; plain, on loopback only), which unlike the public
// one is not shut down at the drain (its Shutdown would end in-process calls at once).
struct HttpGatewayTarget {
  std::unique_ptr<GenerationService> service;
  std::unique_ptr<RouterAdminService> admin;  // The runtime LoRA endpoints call it.
  StartedServer server;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
};

absl::StatusOr<std::unique_ptr<HttpGatewayTarget>> GatewayTarget(const RouterFlags& rf, Router* router,
                                                                   const SecurityFlags& security);

// The OpenAI HTTP API in front of the Generation service through `target` (null when
// --http-listen is empty).
absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> StartHttp(
    const RouterFlags& rf, const std::string& model, const HttpGatewayTarget& target,
    const SecurityFlags& security, const ApiKeys& keys, const Router& router,
    metrics::Registry* registry);

// " http=ADDRESS" for the ready line ("" without the HTTP API).
std::string HttpReadyField(const openai::OpenAiServer* http);

// The public side's drain after a stop signal: new HTTP requests and the health endpoints say the
// server is stopping; calls in flight finish (gRPC within `grace`), then the HTTP responses they
// feed are written out before the process leaves. (Leaving as soon as gRPC's calls ended cut the
// last chunks of HTTP responses still on their way to the client.)
void DrainPublic(const StartedServer& server, openai::OpenAiServer* http, std::chrono::seconds grace);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_HTTP_GATEWAY_H_
