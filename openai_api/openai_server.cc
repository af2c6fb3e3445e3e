#include "openai_api/openai_server.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <thread>

#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/chat/chat_template.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "common/model/gguf_model.h"
#include "common/model/gguf_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "openai_api/generate_call.h"
#include "openai_api/openai_request.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::openai {
namespace {

// Insertion order: fields as OpenAI orders them, top_logprobs by rank.
using Json = nlohmann::ordered_json;

int HttpStatus(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION: return 400;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS: return 400;  // vLLM: an adapter loaded twice.
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::CANCELLED: return 499;
    default: return 500;
  }
}

// OpenAI's error type for a status.
std::string ErrorType(int status) {
  return status == 401   ? "authentication_error"
         : status == 429 ? "rate_limit_error"
         : status >= 500 ? "server_error"
                         : "invalid_request_error";
}

// Tests only: PDSERVE_FAULT_HTTP_DELAY_END_MS=N holds each response's last bytes back N ms after
// its generation ended, so a test can stop the process while responses are still being
// finished, deterministically.
std::chrono::milliseconds FaultDelayEnd() {
  static const std::chrono::milliseconds delay = [] {
    const char* v = std::getenv("PDSERVE_FAULT_HTTP_DELAY_END_MS");
    return std::chrono::milliseconds(v == nullptr ? 0 : std::atoll(v));
  }();
  return delay;
}

constexpr std::string_view kShuttingDown = "the server is shutting down; retry on another replica";

// The router's message names the field first ("sampling.max_tokens: ..."): that is the param.
ApiError FromGrpc(const grpc::Status& s) {
  ApiError e;
  e.http_status = HttpStatus(s.error_code());
  e.message = s.error_message();
  e.type = ErrorType(e.http_status);
  const size_t colon = e.message.find(':');
  if (e.http_status == 400 && colon != std::string::npos && colon < 40 &&
      e.message.find(' ') > colon) {
    std::string field = e.message.substr(0, colon);
    if (field.rfind("sampling.", 0) == 0) field = field.substr(9);
    e.param = field;
  }
  // A model name that is neither the served model nor a LoRA adapter a worker serves.
  constexpr std::string_view kUnknownAdapter = "sampling.lora_name: ";
  if (e.http_status == 404 && e.message.rfind(kUnknownAdapter, 0) == 0) {
    e.message = e.message.substr(kUnknownAdapter.size());
    e.param = "model";
    e.code = "model_not_found";
  }
  return e;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The X-Request-Id response header (none when `id` is empty).
http::Headers IdHeader(const std::string& id) {
  return id.empty() ? http::Headers{} : http::Headers{{"X-Request-Id", id}};
}

// `extra`: headers besides the error's own (X-Request-Id).
void SendError(http::HttpResponder& res, const ApiError& e, http::Headers extra = {}) {
  if (e.http_status == 429) extra.emplace_back("Retry-After", "1");
  res.Send(e.http_status, "application/json", Dump(e.ToJson()), extra);
}

void SendJson(http::HttpResponder& res, const Json& j, const http::Headers& extra = {}) {
  res.Send(200, "application/json", Dump(j), extra);
}

// Everything one choice accumulated.
struct Choice {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<v1::TokenLogprobs> top;
  std::string finish_reason;
  v1::Usage usage;
};

class Gateway;

// One OpenAI request: its choices' Generate calls, all at once (prompts x n, each a generation of
// its own), and its HTTP response. Their messages arrive on gRPC's threads, concurrently across
// choices; the client's departure (the HTTP server's thread) cancels every call.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(Gateway* gateway, std::shared_ptr<http::HttpResponder> res, ParsedRequest request,
           std::vector<std::pair<std::string, std::string>> metadata);
  ~Exchange();
  void Begin();

 private:
  void Cancel();
  void CancelAll(std::unique_lock<std::mutex>& lock);
  // A choice's call ended (or was never started): the last one answers.
  void EndOne(std::unique_lock<std::mutex>& lock);
  void OnMessage(size_t choice, const v1::GenerateResponse& r);
  void OnEnd(size_t choice, const grpc::Status& s);
  // One SSE event: these choices, and `usage` when the client asked for it (else no field).
  void SendEvent(Json choices, Json usage);
  void SendChunk(Json choice);  // A choice's event (usage null when asked for).
  void Finish();
  // Finish, or with the fault hook, Finish later on a thread of its own.
  void FinishMaybeDelayed();
  // Counts a choice's usage: its completion tokens; its prompt's tokens once (from sample 0).
  void AddChoiceUsage(size_t choice, const v1::Usage& u);

  Gateway* const gateway_;
  const std::shared_ptr<http::HttpResponder> res_;
  const ParsedRequest p_;
  const std::vector<std::pair<std::string, std::string>> metadata_;  // Forwarded headers.

  std::mutex mu_;  // Everything below: the calls' callbacks run concurrently.
  std::vector<std::weak_ptr<GenerateCall>> calls_;
  bool cancelled_ = false;
  size_t running_ = 0;    // Calls not yet ended.
  bool started_ = false;  // A first message came: the response has begun (streams: headers sent).
  bool failed_ = false;   // A call failed: the others are cancelled, the error is the answer.
  grpc::Status error_;
  std::string request_id_;  // The router's (the client's X-Request-Id, or one it assigned).
  std::string id_;
  int64_t created_ = 0;
  std::vector<Choice> choices_;        // Whole responses.
  std::vector<size_t> text_offset_;    // Streams: per choice.
  std::vector<ToolCallStream> tools_;  // Streamed chat with tool parsing: per choice.
  std::vector<int> tool_calls_sent_;   // Per choice: the next tool call's index.
  bool draining_at_start_ = false;     // The server was stopping when the calls began.
  v1::Usage total_;
};

class Gateway {
 public:
  Gateway(const OpenAiServerOptions& o, std::unique_ptr<Tokenizer> tokenizer,
          std::unique_ptr<ChatTemplate> tmpl, int64_t max_model_len)
      : options_(o),
        tokenizer_(std::move(tokenizer)),
        template_(std::move(tmpl)),
        max_model_len_(max_model_len),
        channel_(o.grpc_channel ? o.grpc_channel
                                : grpc::CreateChannel(o.grpc_target, grpc::InsecureChannelCredentials())),
        stub_(v1::Generation::NewStub(channel_)),
        admin_(internal::v1::RouterAdmin::NewStub(channel_)) {
    parse_.served_model_name = o.served_model_name;
    parse_.chat_template = template_.get();
    parse_.tool_parser = ParseToolParserName(o.tool_call_parser).value_or(ToolParser::kNone);
    parse_.max_inflight = o.max_inflight;
  }

  // Waits for every exchange to end (the HTTP server has stopped: their calls are cancelled).
  ~Gateway() {
    std::unique_lock<std::mutex> lock(live_mu_);
    live_cv_.wait(lock, [this] { return live_ == 0; });
  }

  void Handle(http::HttpRequest req, std::shared_ptr<http::HttpResponder> res) {
    const std::string& path = req.path;
    const bool get = req.method == "GET" || req.method == "HEAD";
    const bool post = req.method == "POST";
    const bool draining = draining_.load();
    if (path == "/health" && get) {
      return draining ? res->Send(503, "text/plain", std::string(kShuttingDown))
                      : res->Send(200, "", "");
    }
    constexpr std::string_view kModels = "/v1/models/";
    if (path == "/v1/models" && get) {
      Json data = Json::array({ModelCard()});
      for (const v1::LoraAdapterInfo& a : LoraAdapters(req)) data.push_back(LoraCard(a));
      return SendJson(*res, {{"object", "list"}, {"data", std::move(data)}});
    }
    if (path.rfind(kModels, 0) == 0 && path.size() > kModels.size() && get) {
      // models.retrieve: the model or a LoRA adapter, by the name clients send.
      const std::string_view name = std::string_view(path).substr(kModels.size());
      if (name == options_.served_model_name) return SendJson(*res, ModelCard());
      for (const v1::LoraAdapterInfo& a : LoraAdapters(req)) {
        if (a.name() == name) return SendJson(*res, LoraCard(a));
      }
      ApiError e;
      e.http_status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message = Str("The model `", path.substr(kModels.size()), "` does not exist.");
      return SendError(*res, e);
    }
    const bool generate = (path == "/v1/completions" || path == "/v1/chat/completions") && post;
    if (generate && draining) {
      ApiError e;
      e.http_status = 503;
      e.type = ErrorType(503);
      e.message = std::string(kShuttingDown);
      return SendError(*res, e);
    }
    if (path == "/v1/completions" && post) return Generate(req, std::move(res), false);
    if (path == "/v1/chat/completions" && post) return Generate(req, std::move(res), true);
    if (path == "/tokenize" && post) return Tokenize(req, *res);
    if (path == "/detokenize" && post) return Detokenize(req, *res);
    const bool lora_route = options_.lora_runtime_updates &&
                            (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter");
    if (lora_route && post) return LoraChange(req, std::move(res), path == "/v1/load_lora_adapter");
    ApiError e;
    const bool known = path == "/health" || path == "/v1/models" || path == "/v1/completions" ||
                       path == "/v1/chat/completions" || path == "/tokenize" ||
                       path == "/detokenize" || path.rfind(kModels, 0) == 0 || lora_route;
    e.http_status = known ? 405 : 404;
    e.message = known ? Str("Method ", req.method, " is not allowed for ", path)
                      : Str("No route for ", req.method, " ", path);
    SendError(*res, e);
  }

  // Before the body is read (the HTTP server's check_head): the API key, on every route but
  // /health, so an unauthenticated client can neither tokenize nor make the server parse a body.
  std::optional<std::pair<int, std::string>> CheckHead(const http::HttpRequest& head) const {
    if (!options_.api_keys.enabled() || head.path == "/health") return std::nullopt;
    const std::string* a = head.Header("authorization");
    const std::string_view value = a == nullptr ? std::string_view() : std::string_view(*a);
    absl::Status s = options_.api_keys.CheckAuthorization(a == nullptr ? nullptr : &value);
    if (s.ok()) return std::nullopt;
    return std::make_pair(401, std::string(s.message()));
  }

  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  const std::string& system_fingerprint() const { return options_.system_fingerprint; }

  // The body of the HTTP server's own refusals, OpenAI-shaped.
  static std::pair<std::string, std::string> ErrorBody(int status, std::string_view message) {
    ApiError e;
    e.http_status = status;
    e.message = status == 413 ? Str(message, " (--max-request-bytes)") : std::string(message);
    e.type = ErrorType(status);
    return {Dump(e.ToJson()), "application/json"};
  }

  v1::Generation::Stub* stub() const { return stub_.get(); }

  std::string TokenText(int32_t id) const {
    auto s = tokenizer_->Decode({id}, false);
    return s.ok() ? *s : "";
  }

  void Live(int delta) {
    std::lock_guard<std::mutex> lock(live_mu_);
    live_ += delta;
    if (live_ == 0) live_cv_.notify_all();
  }

 private:
  // The LoRA adapters the router's decode workers serve now (GetModelInfo; none if it fails).
  // A blocking call on the HTTP thread: the router answers from memory, in-process.
  std::vector<v1::LoraAdapterInfo> LoraAdapters(const http::HttpRequest& req) const {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    for (const auto& [k, v] : Forwarded(req)) ctx.AddMetadata(k, v);
    v1::ModelInfo info;
    if (!stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok()) return {};
    return {info.lora_adapters().begin(), info.lora_adapters().end()};
  }

  // As vLLM lists an adapter: its parent is the base model.
  Json LoraCard(const v1::LoraAdapterInfo& a) const {
    return {{"id", a.name()},           {"object", "model"},
            {"created", std::time(nullptr)}, {"owned_by", "pdserve"},
            {"root", a.name()},         {"parent", options_.served_model_name},
            {"max_model_len", max_model_len_}};
  }

  Json ModelCard() const {
    return {{"id", options_.served_model_name},   {"object", "model"},
            {"created", std::time(nullptr)},      {"owned_by", "pdserve"},
            {"root", options_.served_model_name}, {"max_model_len", max_model_len_}};
  }

  // The headers the router reads: the API key, and the W3C trace context (the request's spans
  // join the client's trace).
  static std::vector<std::pair<std::string, std::string>> Forwarded(const http::HttpRequest& req) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const char* name : {"authorization", "traceparent", "tracestate"}) {
      const std::string* v = req.Header(name);
      if (v != nullptr && !v->empty()) out.emplace_back(name, *v);
    }
    return out;
  }

  void Generate(const http::HttpRequest& req, std::shared_ptr<http::HttpResponder> res, bool chat) {
    ParsedRequest parsed;
    ApiError error;
    const bool ok = chat ? ParseChatRequest(req.body, parse_, &parsed, &error)
                         : ParseCompletionRequest(req.body, parse_, &parsed, &error);
    // X-Request-Id (as vLLM takes it): the request's id, so the client's trace id reaches the
    // router's logs and the response's id ("cmpl-<id>"); echoed in the response's headers.
    const std::string* request_id = req.Header("x-request-id");
    if (request_id != nullptr) {
      for (v1::GenerateRequest& g : parsed.prompts) g.set_request_id(*request_id);
    }
    if (!ok) return SendError(*res, error, IdHeader(request_id == nullptr ? "" : *request_id));
    auto exchange =
        std::make_shared<Exchange>(this, std::move(res), std::move(parsed), Forwarded(req));
    exchange->Begin();
  }

  // vLLM's runtime adapter endpoints: {"lora_name", "lora_path"} (load) or {"lora_name"}
  // (unload); plain-text "Success: ..." or an OpenAI error. Answered when every worker has.
  void LoraChange(const http::HttpRequest& req, std::shared_ptr<http::HttpResponder> res, bool load) {
    ApiError e;
    nlohmann::ordered_json j;
    if (!ParseJsonObject(req.body, &j, &e)) return SendError(*res, e);
    std::string name, path;
    for (auto [key, out] : {std::pair{"lora_name", &name}, std::pair{"lora_path", &path}}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      if (!j[key].is_string()) {
        e.param = key;
        e.message = Str("'", key, "' must be a string");
        return SendError(*res, e);
      }
      *out = j[key].get<std::string>();
    }
    if (load && (name.empty() || path.empty())) {
      e.param = name.empty() ? "lora_name" : "lora_path";
      e.message = "Both 'lora_name' and 'lora_path' must be provided.";
      return SendError(*res, e);
    }
    if (!load && name.empty()) {
      e.param = "lora_name";
      e.message = "'lora_name' needs to be provided to unload a LoRA adapter.";
      return SendError(*res, e);
    }
    struct Call {
      grpc::ClientContext context;
      internal::v1::LoadLoraAdapterRequest load;
      internal::v1::UnloadLoraAdapterRequest unload;
      internal::v1::LoraAdapterChange response;
    };
    auto call = std::make_shared<Call>();
    for (const auto& [k, v] : Forwarded(req)) call->context.AddMetadata(k, v);
    // Loading reads the adapter on every worker: seconds for a large one.
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    Live(1);
    auto done = [this, call, res, name, load](grpc::Status s) {
      if (s.ok()) {
        res->Send(200, "text/plain; charset=utf-8",
                  Str("Success: LoRA adapter '", name, "' ", load ? "added" : "removed", " successfully."));
      } else {
        ApiError err = FromGrpc(s);
        if (err.param.empty() && err.http_status < 500) err.param = "lora_name";
        SendError(*res, err);
      }
      Live(-1);
    };
    if (load) {
      call->load.set_lora_name(name);
      call->load.set_lora_path(path);
      admin_->async()->LoadLoraAdapter(&call->context, &call->load, &call->response, std::move(done));
    } else {
      call->unload.set_lora_name(name);
      admin_->async()->UnloadLoraAdapter(&call->context, &call->unload, &call->response, std::move(done));
    }
  }

  void Tokenize(const http::HttpRequest& req, http::HttpResponder& res) {
    ApiError e;
    nlohmann::ordered_json j;
    if (!ParseJsonObject(req.body, &j, &e)) return SendError(res, e);
    std::string text;
    bool add_special = true, token_strs = false;
    if (!JsonBoolField(j, "add_special_tokens", &add_special, &e) ||
        !JsonBoolField(j, "return_token_strs", &token_strs, &e)) {
      return SendError(res, e);
    }
    if (j.contains("prompt") && j["prompt"].is_string()) {
      text = j["prompt"].get<std::string>();
    } else if (j.contains("messages")) {
      // As a chat request would render it.
      ParsedRequest p;
      if (!ParseChatRequest(req.body, parse_, &p, &e)) return SendError(res, e);
      text = p.prompts[0].text();
      add_special = false;
    } else {
      e.param = "prompt";
      e.message = "'prompt' (a string) or 'messages' is required";
      return SendError(res, e);
    }
    auto ids = tokenizer_->Encode(text, add_special);
    if (!ids.ok()) {
      e.param = "prompt";
      e.message = std::string(ids.status().message());
      return SendError(res, e);
    }
    Json out = {{"count", ids->size()}, {"max_model_len", max_model_len_}, {"tokens", *ids}};
    if (token_strs) {
      // vLLM's field: each token's string as the vocabulary stores it.
      Json strs = Json::array();
      for (int32_t id : *ids) strs.push_back(tokenizer_->IdToToken(id).value_or(""));
      out["token_strs"] = std::move(strs);
    }
    SendJson(res, out);
  }

  void Detokenize(const http::HttpRequest& req, http::HttpResponder& res) {
    ApiError e;
    nlohmann::ordered_json j;
    if (!ParseJsonObject(req.body, &j, &e)) return SendError(res, e);
    e.param = "tokens";
    if (!j.contains("tokens") || !j["tokens"].is_array()) {
      e.message = "'tokens' (a list of token ids) is required";
      return SendError(res, e);
    }
    std::vector<int32_t> ids;
    for (const auto& t : j["tokens"]) {
      int64_t v = -1;
      if (!JsonInt64(t, &v) || v < 0 || v >= tokenizer_->vocab_size()) {
        e.message = Str("'tokens' must be token ids in [0, ", tokenizer_->vocab_size(), "); got ",
                        t.dump());
        return SendError(res, e);
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    auto text = tokenizer_->Decode(ids, false);
    if (!text.ok()) {
      e.message = std::string(text.status().message());
      return SendError(res, e);
    }
    SendJson(res, {{"prompt", *text}});
  }

  OpenAiServerOptions options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  int64_t max_model_len_;
  std::shared_ptr<grpc::Channel> channel_;  // To the router.
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<internal::v1::RouterAdmin::Stub> admin_;
  ParseOptions parse_;
  std::mutex live_mu_;
  std::condition_variable live_cv_;
  int live_ = 0;  // Exchanges not yet ended.
  std::atomic<bool> draining_{false};
};

void AddUsage(const v1::Usage& u, v1::Usage* total) {
  total->set_prompt_tokens(total->prompt_tokens() + u.prompt_tokens());
  total->set_completion_tokens(total->completion_tokens() + u.completion_tokens());
  total->set_cached_tokens(total->cached_tokens() + u.cached_tokens());
}

void Accumulate(const v1::GenerateResponse& r, Choice* c) {
  c->text += r.text();
  c->ids.insert(c->ids.end(), r.token_ids().begin(), r.token_ids().end());
  c->logprobs.insert(c->logprobs.end(), r.logprobs().begin(), r.logprobs().end());
  c->top.insert(c->top.end(), r.top_logprobs().begin(), r.top_logprobs().end());
  if (!r.finish_reason().empty()) {
    c->finish_reason = r.finish_reason();
    c->usage = r.usage();
  }
}

Json Bytes(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// OpenAI's logprobs object of a choice (or of one streamed message).
Json Logprobs(const Gateway& g, const ParsedRequest& p, const std::vector<int32_t>& ids,
              const std::vector<float>& lps, const std::vector<v1::TokenLogprobs>& top,
              size_t text_offset) {
  if (p.chat) {
    if (!p.chat_logprobs) return nullptr;
    Json content = Json::array();
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string t = g.TokenText(ids[i]);
      Json alts = Json::array();
      if (i < top.size()) {
        for (const auto& a : top[i].top()) {
          const std::string at = g.TokenText(a.token_id());
          alts.push_back({{"token", at}, {"logprob", a.logprob()}, {"bytes", Bytes(at)}});
        }
      }
      content.push_back({{"token", t},
                         {"logprob", i < lps.size() ? lps[i] : 0.0f},
                         {"bytes", Bytes(t)},
                         {"top_logprobs", alts}});
    }
    return {{"content", content}};
  }
  if (p.logprobs < 0) return nullptr;
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(),
       offsets = Json::array();
  size_t offset = text_offset;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string t = g.TokenText(ids[i]);
    tokens.push_back(t);
    token_lps.push_back(i < lps.size() ? lps[i] : 0.0f);
    // By rank, then the sampled token when it is not among them (OpenAI: up to N+1 entries).
    Json alts = Json::object();
    if (i < top.size()) {
      for (const auto& a : top[i].top()) {
        const std::string at = g.TokenText(a.token_id());
        if (!alts.contains(at)) alts[at] = a.logprob();
      }
    }
    if (!alts.contains(t)) alts[t] = i < lps.size() ? lps[i] : 0.0f;
    tops.push_back(alts);
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

Json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

Exchange::Exchange(Gateway* gateway, std::shared_ptr<http::HttpResponder> res,
                   ParsedRequest request,
                   std::vector<std::pair<std::string, std::string>> metadata)
    : gateway_(gateway),
      res_(std::move(res)),
      p_(std::move(request)),
      metadata_(std::move(metadata)) {
  gateway_->Live(1);
  const size_t n = p_.prompts.size() * static_cast<size_t>(p_.n);
  choices_.resize(n);
  text_offset_.resize(n);
  calls_.resize(n);
  tools_.assign(n, ToolCallStream(p_.tool_parser));
  tool_calls_sent_.assign(n, 0);
}

Exchange::~Exchange() { gateway_->Live(-1); }

void Exchange::Begin() {
  std::weak_ptr<Exchange> weak = weak_from_this();
  // The client going away cancels the calls: the router aborts the requests and the tiers free
  // their KV blocks (also for a whole response, which nobody would read).
  res_->OnCancel([weak] {
    if (auto self = weak.lock()) self->Cancel();
  });
  auto self = shared_from_this();
  std::unique_lock<std::mutex> lock(mu_);
  running_ = choices_.size();
  for (size_t c = 0; c < choices_.size(); ++c) {
    if (cancelled_ || failed_) {  // No point starting the rest.
      if (!failed_) {
        failed_ = true;
        error_ = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
      EndOne(lock);
      continue;
    }
    v1::GenerateRequest request = p_.prompts[c / p_.n];
    const uint64_t sample = c % p_.n;
    if (sample > 0 && request.sampling().has_seed()) {
      // Sample j of a seeded request: seed + j (wrapping, as uint64).
      request.mutable_sampling()->set_seed(request.sampling().seed() + sample);
    }
    lock.unlock();  // A call may end (and call OnEnd) before Start returns.
    auto call = GenerateCall::Start(
        gateway_->stub(), metadata_, request,
        [self, c](const v1::GenerateResponse& r) { self->OnMessage(c, r); },
        [self, c](const grpc::Status& s) { self->OnEnd(c, s); });
    lock.lock();
    calls_[c] = call;
    if (cancelled_ || failed_) {
      lock.unlock();
      call->Cancel();
      lock.lock();
    }
  }
}

void Exchange::Cancel() {
  std::unique_lock<std::mutex> lock(mu_);
  cancelled_ = true;
  CancelAll(lock);
}

void Exchange::CancelAll(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<GenerateCall>> calls;
  for (const auto& weak : calls_) {
    if (auto call = weak.lock()) calls.push_back(std::move(call));
  }
  lock.unlock();  // Outside the lock: a cancelled call may end at once.
  for (const auto& call : calls) call->Cancel();
  lock.lock();
}

void Exchange::SendEvent(Json choices, Json usage) {
  Json j = {{"id", id_},
            {"object", p_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", p_.model},
            {"system_fingerprint", gateway_->system_fingerprint()},
            {"choices", std::move(choices)}};
  if (p_.include_usage) j["usage"] = std::move(usage);
  res_->Write(Str("data: ", Dump(j), "\n\n"));
}

void Exchange::SendChunk(Json choice) { SendEvent(Json::array({std::move(choice)}), nullptr); }

void Exchange::AddChoiceUsage(size_t choice, const v1::Usage& u) {
  v1::Usage counted = u;
  if (choice % p_.n != 0) {  // The prompt was counted with its first sample.
    counted.set_prompt_tokens(0);
    counted.set_cached_tokens(0);
  }
  AddUsage(counted, &total_);
}

void Exchange::OnMessage(size_t c, const v1::GenerateResponse& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) return;
  if (!started_) {
    // The first message: the request was accepted (a refusal before it is an HTTP error).
    started_ = true;
    request_id_ = r.request_id();
    id_ = Str(p_.chat ? "chatcmpl-" : "cmpl-", r.request_id());
    created_ = std::time(nullptr);
    if (p_.stream) {
      http::Headers headers = IdHeader(request_id_);
      headers.emplace_back("Cache-Control", "no-cache");
      res_->StartStream(200, "text/event-stream", headers);
      for (size_t i = 0; p_.chat && i < choices_.size(); ++i) {
        SendChunk({{"index", i},
                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}});
      }
    }
  }
  if (!p_.stream) return Accumulate(r, &choices_[c]);
  if (!r.finish_reason().empty()) AddChoiceUsage(c, r.usage());
  if (r.token_ids().empty() && r.text().empty() && r.finish_reason().empty()) return;
  std::vector<int32_t> ids(r.token_ids().begin(), r.token_ids().end());
  std::vector<float> lps(r.logprobs().begin(), r.logprobs().end());
  std::vector<v1::TokenLogprobs> top(r.top_logprobs().begin(), r.top_logprobs().end());
  Json choice = {{"index", c}};
  std::string finish = r.finish_reason();
  if (p_.chat && p_.tool_parser != ToolParser::kNone) {
    // Content that cannot begin a call goes now; a call once its end has arrived.
    ToolCallStream::Delta d = tools_[c].Feed(r.text());
    if (!finish.empty()) {
      ToolCallStream::Delta last = tools_[c].Finish();
      d.content += last.content;
      for (auto& call : last.calls) d.calls.push_back(std::move(call));
      // "tool_calls" where the model stopped; an output cut short keeps "length" (and the
      // calls it completed).
      if (tools_[c].called() && finish == "stop") finish = "tool_calls";
    }
    Json delta = Json::object();
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.calls.empty()) {
      Json calls = Json::array();
      for (const ToolCall& call : d.calls) {
        if (!p_.parallel_tool_calls && tool_calls_sent_[c] > 0) break;  // The first call only.
        calls.push_back({{"index", tool_calls_sent_[c]++},
                         {"id", call.id},
                         {"type", "function"},
                         {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    }
    if (delta.empty() && finish.empty() && !p_.chat_logprobs) return;  // Held back: none yet.
    choice["delta"] = std::move(delta);
  } else if (p_.chat) {
    choice["delta"] = r.text().empty() && !r.finish_reason().empty() ? Json::object()
                                                                     : Json{{"content", r.text()}};
  } else {
    choice["text"] = r.text();
  }
  choice["logprobs"] = Logprobs(*gateway_, p_, ids, lps, top, text_offset_[c]);
  text_offset_[c] += r.text().size();
  choice["finish_reason"] = finish.empty() ? Json(nullptr) : Json(finish);
  SendChunk(std::move(choice));
}

void Exchange::OnEnd(size_t c, const grpc::Status& s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (s.ok() && !p_.stream) AddChoiceUsage(c, choices_[c].usage);
  if (!s.ok() && !failed_) {
    // The first failure answers for the request (a refusal, a cancel, a lost router); the other
    // choices would be an incomplete answer: they are cancelled.
    failed_ = true;
    error_ = s;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && gateway_->draining()) {
      // The router's gRPC port stopped taking calls: say why, not how the connect failed.
      error_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(kShuttingDown));
    }
    CancelAll(lock);
  }
  EndOne(lock);
}

void Exchange::EndOne(std::unique_lock<std::mutex>& lock) {
  if (--running_ > 0) return;
  if (!failed_ && !started_) {
    failed_ = true;
    error_ = grpc::Status(grpc::StatusCode::INTERNAL, "empty response");
  }
  if (failed_) {
    const ApiError e = FromGrpc(error_);
    if (!p_.stream || !started_) {
      return SendError(*res_, e, IdHeader(started_ ? request_id_ : p_.prompts[0].request_id()));
    }
    // A stream's headers are gone: the error travels as an event, then the stream ends.
    res_->Write(Str("data: ", Dump(e.ToJson()), "\n\ndata: [DONE]\n\n"));
    return res_->End();
  }
  FinishMaybeDelayed();
}

void Exchange::FinishMaybeDelayed() {
  const std::chrono::milliseconds delay = FaultDelayEnd();
  if (delay.count() <= 0) return Finish();
  std::thread([self = shared_from_this(), delay] {
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(self->mu_);
    self->Finish();
  }).detach();
}

void Exchange::Finish() {
  if (p_.stream) {
    if (p_.include_usage) SendEvent(Json::array(), UsageJson(total_));
    res_->Write("data: [DONE]\n\n");
    return res_->End();
  }
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    Json choice = {{"index", i}};
    std::string finish = c.finish_reason;
    if (p_.chat && p_.tool_parser != ToolParser::kNone) {
      ExtractedTools t = ExtractToolCalls(p_.tool_parser, c.text);
      if (!p_.parallel_tool_calls && t.calls.size() > 1) t.calls.resize(1);
      Json message = {{"role", "assistant"},
                      {"content", t.content ? Json(*t.content) : Json(nullptr)},
                      {"refusal", nullptr}};
      if (!t.calls.empty()) {
        Json calls = Json::array();
        for (const ToolCall& call : t.calls) {
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
        if (finish == "stop") finish = "tool_calls";
      }
      choice["message"] = std::move(message);
    } else if (p_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = Logprobs(*gateway_, p_, c.ids, c.logprobs, c.top, 0);
    choice["finish_reason"] = finish;
    choices.push_back(std::move(choice));
  }
  SendJson(*res_, {{"id", id_},
                   {"object", p_.chat ? "chat.completion" : "text_completion"},
                   {"created", created_},
                   {"model", p_.model},
                   {"system_fingerprint", gateway_->system_fingerprint()},
                   {"choices", choices},
                   {"usage", UsageJson(total_)}},
           IdHeader(request_id_));
}

}  // namespace

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& path, const std::string& file) {
  if (!file.empty() || !IsGgufPath(path)) return ChatTemplate::Load(path, file);
  auto g = GgufFile::Open(path);
  if (!g.ok()) return g.status();
  auto source = GgufChatTemplate(**g);
  if (!source.ok()) return source.status();
  auto files = TokenizerFilesFromGguf(**g);
  if (!files.ok()) return files.status();
  const nlohmann::json config = nlohmann::json::parse(files->config_json);
  return ChatTemplate::FromSource(*source, config.value("bos_token", ""),
                                  config.value("eos_token", ""));
}

struct OpenAiServer::Impl {
  std::unique_ptr<Gateway> gateway;
  std::unique_ptr<http::HttpServer> server;
  metrics::CollectorHandle collector;  // Reads `server`: goes first.
};

namespace {

// The HTTP server's stats as metrics, copied at each scrape.
metrics::CollectorHandle HttpMetrics(metrics::Registry* registry, const std::string& model_name,
                                     const http::HttpServer* server) {
  auto& open = registry
                   ->AddGauge("pdserve_http_connections",
                              "Open connections to the OpenAI HTTP API.", {"model_name", "role"})
                   .With({model_name, "router"});
  auto& accepted = registry
                       ->AddCounter("pdserve_http_connections_total",
                                    "Connections the OpenAI HTTP API accepted (those refused at "
                                    "--http-max-connections included).",
                                    {"model_name", "role"})
                       .With({model_name, "router"});
  auto& responses = registry->AddCounter("pdserve_http_responses_total",
                                         "Responses of the OpenAI HTTP API by status code (its own "
                                         "refusals included: 408, 413, 431, 503, ...).",
                                         {"model_name", "role", "code"});
  return metrics::CollectorHandle(registry, [&open, &accepted, &responses, model_name, server] {
    const http::HttpStats st = server->stats();
    open.Set(static_cast<double>(st.connections));
    accepted.SetTotal(static_cast<double>(st.accepted));
    for (const auto& [code, n] : st.responses) {
      responses.With({model_name, "router", std::to_string(code)}).SetTotal(static_cast<double>(n));
    }
  });
}

}  // namespace

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiServer::~OpenAiServer() {
  impl_->collector.Reset();
  impl_->server.reset();   // Closes every connection: the exchanges' calls are cancelled.
  impl_->gateway.reset();  // Waits for them to end.
}

const std::string& OpenAiServer::address() const { return impl_->server->address(); }

void OpenAiServer::BeginDrain() {
  impl_->gateway->BeginDrain();
  impl_->server->BeginDrain();
}

bool OpenAiServer::WaitDrained(std::chrono::steady_clock::time_point deadline) {
  BeginDrain();
  return impl_->server->WaitDrained(deadline);
}

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(const OpenAiServerOptions& options) {
  if (auto parser = ParseToolParserName(options.tool_call_parser); !parser.ok()) {
    return parser.status();
  }
  const std::string& tokenizer_path =
      options.tokenizer.empty() ? options.model_dir : options.tokenizer;
  auto tokenizer = LoadModelTokenizer(tokenizer_path);
  if (!tokenizer.ok()) return tokenizer.status();
  std::unique_ptr<ChatTemplate> tmpl;
  auto loaded = LoadChatTemplate(tokenizer_path, options.chat_template);
  if (loaded.ok()) {
    tmpl = std::make_unique<ChatTemplate>(std::move(*loaded));
  } else if (loaded.status().code() != absl::StatusCode::kNotFound || !options.chat_template.empty()) {
    return loaded.status();  // A template that does not parse fails here, at start-up.
  } else {
    PD_LOG(Warning) << "--http-listen: " << loaded.status().message()
                    << "; /v1/chat/completions will refuse requests";
  }
  auto impl = std::make_unique<Impl>();
  impl->gateway = std::make_unique<Gateway>(options, std::move(*tokenizer), std::move(tmpl), options.max_model_len);
  http::HttpServerOptions o;
  o.listen = options.listen;
  o.flag = "--http-listen";
  o.max_connections = options.max_connections;
  o.limits.max_body_bytes = options.max_request_bytes;
  o.request_timeout = options.request_timeout;
  o.tls_cert = options.tls_cert;
  o.tls_key = options.tls_key;
  o.error_body = &Gateway::ErrorBody;
  o.idle_timeout = options.keep_alive;
  Gateway* gateway = impl->gateway.get();
  o.check_head = [gateway](const http::HttpRequest& head) { return gateway->CheckHead(head); };
  auto server = http::HttpServer::Start(
      o, [gateway](http::HttpRequest req, std::shared_ptr<http::HttpResponder> res) {
        gateway->Handle(std::move(req), std::move(res));
      });
  if (!server.ok()) return server.status();
  impl->server = std::move(*server);
  if (options.metrics != nullptr) {
    impl->collector = HttpMetrics(options.metrics, options.served_model_name, impl->server.get());
  }
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

}  // namespace pdserve::openai
