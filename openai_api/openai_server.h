// The OpenAI-compatible HTTP API (`--http-listen` on router and serve): POST /v1/completions and
// /v1/chat/completions (JSON or Server-Sent Events), GET /v1/models, GET /health, POST /tokenize
// and /detokenize as vLLM has them.
//
// On the event-driven HTTP server (common/http/http_server.h) and gRPC's callback API: no thread
// is held per connection or per stream, and the server's bounds (connections, request deadline,
// idle and slow-reader timeouts) keep a hostile client from holding the API.
//
// A gateway in front of the router's own public gRPC port: each request is checked and turned
// into a pdserve.v1 GenerateRequest (openai_request.h) and sent over loopback, so it takes the
// gRPC path's validation, admission (429 with Retry-After), routing, stop strings, resumption,
// API keys (the Authorization header is passed on) and metrics. A client that disconnects
// before its response ends (streamed or not) cancels its gRPC call, which frees its KV blocks on
// every tier.
#ifndef PDSERVE_OPENAI_API_OPENAI_SERVER_H_
#define PDSERVE_OPENAI_API_OPENAI_SERVER_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/rpc/api_keys.h"

namespace pdserve::metrics {
class Registry;
}

namespace grpc {
class Channel;
}  // namespace grpc

namespace pdserve::openai {

// The chat template: the file `file` when given, else a directory's tokenizer_config.json, or a
// GGUF file's tokenizer.chat_template (with its BOS and EOS strings).
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& path, const std::string& file);

struct OpenAiServerOptions {
  std::string listen;             // host:port (port 0: any).
  std::string grpc_target;        // The router's public gRPC address.
  // When set, the channel to use instead of connecting to grpc_target (router and serve: an
  // in-process channel to a Generation server that is never shut down, see cli/http_gateway.h).
  std::shared_ptr<grpc::Channel> grpc_channel;
  std::string model_dir;          // Tokenizer, tokenizer_config.json (chat template); or a GGUF file.
  std::string tokenizer;          // A tokenizer directory instead of the model's (empty: none).
  std::string served_model_name;  // The `model` clients send and see.
  std::string chat_template;      // A Jinja file instead of the model's (empty: the model's).
  size_t max_request_bytes = 16 << 20;
  int64_t max_model_len = 0;      // Reported by /v1/models and /tokenize.
  std::string tls_cert, tls_key;  // PEM files: HTTPS (empty: plain HTTP).
  size_t max_connections = 1024;  // Open HTTP connections; the next is answered 503.
  // A request's head and body must arrive within this (408 otherwise).
  std::chrono::milliseconds request_timeout{30000};
  // When set: pdserve_http_connections, pdserve_http_connections_total and
  // pdserve_http_responses_total{code}, labelled with served_model_name and role "router".
  metrics::Registry* metrics = nullptr;
  std::string tool_call_parser;  // --tool-call-parser: hermes, llama3_json, or empty (none).
  // Checked on every route but /health when the request's head arrives, before its body is
  // read (the gRPC port checks them again for generation).
  ApiKeys api_keys;
  // An idle keep-alive connection closes after this (--http-keep-alive-seconds).
  std::chrono::milliseconds keep_alive{75000};
  int64_t max_inflight = 0;        // --max-inflight-requests: more choices are a 400.
  std::string system_fingerprint;  // In every completion (OpenAI's field); empty: none.
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's), through the router's
  // RouterAdmin (--enable-lora-runtime-updates); absent (404) otherwise.
  bool lora_runtime_updates = false;
};

class OpenAiServer {
 public:
  // Fails (naming the flag) when the address cannot be bound or the model's chat template does
  // not parse; a model without a chat template serves completions only.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(const OpenAiServerOptions& options);
  ~OpenAiServer();
  const std::string& address() const;
  // The process is stopping: from now on /health answers 503 and new requests get a 503 that
  // says so; responses in flight go on, and each connection closes once its response ends.
  void BeginDrain();
  // Waits until every response in flight has ended and been written, or `deadline` (false).
  bool WaitDrained(std::chrono::steady_clock::time_point deadline);

 private:
  struct Impl;
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::openai

#endif  // PDSERVE_OPENAI_API_OPENAI_SERVER_H_
