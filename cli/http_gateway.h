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

// The OpenAI HTTP API in front of the public gRPC server at `grpc_address` (null when
// --http-listen is empty).
absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> StartHttp(
    const RouterFlags& rf, const std::string& model, const std::string& grpc_address,
    const SecurityFlags& security, const ApiKeys& keys, const Router& router,
    metrics::Registry* registry);

// The gateway's way into the Generation service. With TLS on the public port, a second, plain
// listener on loopback only (the same service, so API keys still apply); else the public port.
struct HttpGatewayTarget {
  std::unique_ptr<GenerationService> service;
  StartedServer server;
  std::string address;
};

absl::StatusOr<std::unique_ptr<HttpGatewayTarget>> GatewayTarget(const RouterFlags& rf, Router* router,
                                                                   const std::string& public_address,
                                                                   const SecurityFlags& security);

// " http=ADDRESS" for the ready line ("" without the HTTP API).
std::string HttpReadyField(const openai::OpenAiServer* http);

// The public side's drain after a stop signal: new HTTP requests and the health endpoints say the
// server is stopping; calls in flight finish (gRPC within `grace`), then the HTTP responses they
// feed are written out before the process leaves. (Leaving as soon as gRPC's calls ended cut the
// last chunks of HTTP responses still on their way to the client.)
void DrainPublic(const StartedServer& server, openai::OpenAiServer* http, std::chrono::seconds grace);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_HTTP_GATEWAY_H_
