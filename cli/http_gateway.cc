#include "cli/http_gateway.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "cli/tier_lifetime.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve::cli {

absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> StartHttp(
    const RouterFlags& rf, const std::string& model, const HttpGatewayTarget& target,
    const SecurityFlags& security, const ApiKeys& keys, const Router& router,
    metrics::Registry* registry) {
  if (rf.http_listen.empty()) return std::unique_ptr<openai::OpenAiServer>();
  openai::OpenAiServerOptions o;
  o.listen = rf.http_listen;
  o.grpc_target = target.address;
  o.grpc_channel = target.channel;
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
  o.lora_runtime_updates = router.options().lora_runtime_updates;
  // OpenAI's system_fingerprint: the serving configuration (model, context, KV layout), so a
  // client sees when it changes.
  const v1::ModelInfo& info = router.model_info();
  o.system_fingerprint =
      Str("fp_", absl::Hex(std::hash<std::string>()(info.SerializeAsString()) & 0xffffffffffULL,
                           absl::kZeroPad10));
  return openai::OpenAiServer::Start(o);
}

absl::StatusOr<std::unique_ptr<HttpGatewayTarget>> GatewayTarget(const RouterFlags& rf, Router* router,
                                                                   const SecurityFlags& security) {
  auto t = std::make_unique<HttpGatewayTarget>();
  if (rf.http_listen.empty()) return t;
  // Not the public server: its Shutdown (the drain) would end in-process calls at once, where a
  // connection's calls may finish. This one is never shut down; the HTTP drain ends its calls.
  t->service = std::make_unique<GenerationService>(router);
  t->admin = std::make_unique<RouterAdminService>(router);
  ServerOptions o;
  o.max_receive_bytes = static_cast<int>(security.max_request_bytes);
  o.flag = "--http-listen";
  PD_ASSIGN_OR_RETURN(t->server, StartGrpcServer("127.0.0.1:0", {t->service.get(), t->admin.get()}, o));
  t->address = t->server.address;
  t->channel = InProcessChannel(*t->server.server);
  return t;
}

std::string HttpReadyField(const openai::OpenAiServer* http) {
  return http == nullptr ? "" : Str(" http=", http->address());
}

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

}  // namespace pdserve::cli
