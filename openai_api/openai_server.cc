#include "openai_api/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "openai_api/openai_request.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::openai {
namespace {

using Json = nlohmann::json;

int HttpStatus(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION: return 400;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::CANCELLED: return 499;
    default: return 500;
  }
}

// The router's message names the field first ("sampling.max_tokens: ..."): that is the param.
ApiError FromGrpc(const grpc::Status& s) {
  ApiError e;
  e.http_status = HttpStatus(s.error_code());
  e.message = s.error_message();
  e.type = e.http_status == 401 ? "authentication_error"
           : e.http_status == 429 ? "rate_limit_error"
           : e.http_status >= 500 ? "server_error"
                                  : "invalid_request_error";
  const size_t colon = e.message.find(':');
  if (e.http_status == 400 && colon != std::string::npos && colon < 40 &&
      e.message.find(' ') > colon) {
    std::string field = e.message.substr(0, colon);
    if (field.rfind("sampling.", 0) == 0) field = field.substr(9);
    e.param = field;
  }
  return e;
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.http_status == 429) res.set_header("Retry-After", "1");
  res.set_content(e.ToJson().dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Everything one choice accumulated.
struct Choice {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<v1::TokenLogprobs> top;
  std::string finish_reason;
  v1::Usage usage;
};

class Gateway {
 public:
  Gateway(const OpenAiServerOptions& o, std::unique_ptr<Tokenizer> tokenizer,
          std::unique_ptr<ChatTemplate> tmpl, int64_t max_model_len)
      : options_(o),
        tokenizer_(std::move(tokenizer)),
        template_(std::move(tmpl)),
        max_model_len_(max_model_len),
        stub_(v1::Generation::NewStub(grpc::CreateChannel(o.grpc_target, grpc::InsecureChannelCredentials()))) {
    parse_.served_model_name = o.served_model_name;
    parse_.chat_template = template_.get();
  }

  void Register(httplib::Server& s) {
    s.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      Json model = {{"id", options_.served_model_name}, {"object", "model"}, {"created", std::time(nullptr)},
                    {"owned_by", "pdserve"}, {"root", options_.served_model_name}, {"max_model_len", max_model_len_}};
      res.set_content(Dump({{"object", "list"}, {"data", Json::array({model})}}), "application/json");
    });
    s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, false);
    });
    s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, true);
    });
    s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { Tokenize(req, res); });
    s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { Detokenize(req, res); });
  }

 private:
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  };

  // `authorization`: the client's Authorization header (empty: none), passed on to the router.
  std::unique_ptr<Call> Start(const std::string& authorization, const v1::GenerateRequest& g) {
    auto call = std::make_unique<Call>();
    if (!authorization.empty()) call->context.AddMetadata("authorization", authorization);
    call->reader = stub_->Generate(&call->context, g);
    return call;
  }

  static std::string Authorization(const httplib::Request& req) {
    return req.has_header("Authorization") ? req.get_header_value("Authorization") : "";
  }

  static void AddUsage(const v1::Usage& u, v1::Usage* total) {
    total->set_prompt_tokens(total->prompt_tokens() + u.prompt_tokens());
    total->set_completion_tokens(total->completion_tokens() + u.completion_tokens());
    total->set_cached_tokens(total->cached_tokens() + u.cached_tokens());
  }

  static void Accumulate(const v1::GenerateResponse& r, Choice* c) {
    c->text += r.text();
    c->ids.insert(c->ids.end(), r.token_ids().begin(), r.token_ids().end());
    c->logprobs.insert(c->logprobs.end(), r.logprobs().begin(), r.logprobs().end());
    c->top.insert(c->top.end(), r.top_logprobs().begin(), r.top_logprobs().end());
    if (!r.finish_reason().empty()) {
      c->finish_reason = r.finish_reason();
      c->usage = r.usage();
    }
  }

  std::string TokenText(int32_t id) const {
    auto s = tokenizer_->Decode({id}, false);
    return s.ok() ? *s : "";
  }

  static Json Bytes(const std::string& s) {
    Json b = Json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  }

  // OpenAI's logprobs object of a choice (or of one streamed message).
  Json Logprobs(const ParsedRequest& p, const std::vector<int32_t>& ids, const std::vector<float>& lps,
                const std::vector<v1::TokenLogprobs>& top, size_t text_offset) const {
    if (p.chat) {
      if (!p.chat_logprobs) return nullptr;
      Json content = Json::array();
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::string t = TokenText(ids[i]);
        Json alts = Json::array();
        if (i < top.size()) {
          for (const auto& a : top[i].top()) {
            const std::string at = TokenText(a.token_id());
            alts.push_back({{"token", at}, {"logprob", a.logprob()}, {"bytes", Bytes(at)}});
          }
        }
        content.push_back({{"token", t}, {"logprob", i < lps.size() ? lps[i] : 0.0f}, {"bytes", Bytes(t)},
                           {"top_logprobs", alts}});
      }
      return {{"content", content}};
    }
    if (p.logprobs < 0) return nullptr;
    Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
    size_t offset = text_offset;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string t = TokenText(ids[i]);
      tokens.push_back(t);
      token_lps.push_back(i < lps.size() ? lps[i] : 0.0f);
      Json alts = Json::object();
      if (i < top.size()) {
        for (const auto& a : top[i].top()) alts[TokenText(a.token_id())] = a.logprob();
      }
      tops.push_back(alts);
      offsets.push_back(offset);
      offset += t.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  static Json UsageJson(const v1::Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens()},
            {"completion_tokens", u.completion_tokens()},
            {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
  }

  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto parsed = std::make_shared<ParsedRequest>();
    ApiError error;
    const bool ok = chat ? ParseChatRequest(req.body, parse_, parsed.get(), &error)
                         : ParseCompletionRequest(req.body, parse_, parsed.get(), &error);
    if (!ok) return SendError(res, error);
    // The first prompt's call starts here, so that a refusal (validation, admission, a key) is
    // an HTTP error, not a broken stream.
    auto first = Start(Authorization(req), parsed->prompts[0]);
    auto head = std::make_shared<v1::GenerateResponse>();
    if (!first->reader->Read(head.get())) {
      const grpc::Status s = first->reader->Finish();
      return SendError(res, FromGrpc(s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "empty response") : s));
    }
    const std::string id = Str(chat ? "chatcmpl-" : "cmpl-", head->request_id());
    const int64_t created = std::time(nullptr);
    if (!parsed->stream) return Complete(req, res, *parsed, std::move(first), *head, id, created);
    Stream(req, res, parsed, std::shared_ptr<Call>(std::move(first)), head, id, created);
  }

  void Complete(const httplib::Request& req, httplib::Response& res, const ParsedRequest& p,
                std::unique_ptr<Call> call, const v1::GenerateResponse& head, const std::string& id,
                int64_t created) {
    Json choices = Json::array();
    v1::Usage total;
    for (size_t i = 0; i < p.prompts.size(); ++i) {
      Choice c;
      if (i > 0) {
        call = Start(Authorization(req), p.prompts[i]);
      } else {
        Accumulate(head, &c);
      }
      v1::GenerateResponse r;
      while (call->reader->Read(&r)) Accumulate(r, &c);
      const grpc::Status s = call->reader->Finish();
      if (!s.ok()) return SendError(res, FromGrpc(s));
      AddUsage(c.usage, &total);
      Json choice = {{"index", i}};
      if (p.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      } else {
        choice["text"] = c.text;
      }
      choice["logprobs"] = Logprobs(p, c.ids, c.logprobs, c.top, 0);
      choice["finish_reason"] = c.finish_reason;
      choices.push_back(std::move(choice));
    }
    Json body = {{"id", id}, {"object", p.chat ? "chat.completion" : "text_completion"}, {"created", created},
                 {"model", p.model}, {"choices", choices}, {"usage", UsageJson(total)}};
    res.set_content(Dump(body), "application/json");
  }

  struct StreamState {
    std::shared_ptr<ParsedRequest> request;
    std::shared_ptr<Call> call;
    std::shared_ptr<v1::GenerateResponse> pending;  // Read but not yet sent.
    size_t prompt = 0;
    bool role_sent = false;
    bool finished = false;
    size_t text_offset = 0;
    v1::Usage total;
    std::string id;
    int64_t created = 0;
    std::string authorization;  // For the calls of the later prompts.
  };

  Json Chunk(const StreamState& st, Json choice) const {
    Json j = {{"id", st.id}, {"object", st.request->chat ? "chat.completion.chunk" : "text_completion"},
              {"created", st.created}, {"model", st.request->model}, {"choices", Json::array({choice})}};
    if (st.request->include_usage) j["usage"] = nullptr;
    return j;
  }

  static bool Send(httplib::DataSink& sink, const Json& j) {
    const std::string line = "data: " + Dump(j) + "\n\n";
    return sink.write(line.data(), line.size());
  }

  void Stream(const httplib::Request& req, httplib::Response& res, std::shared_ptr<ParsedRequest> p,
              std::shared_ptr<Call> call, std::shared_ptr<v1::GenerateResponse> head, const std::string& id,
              int64_t created) {
    auto st = std::make_shared<StreamState>();
    st->request = std::move(p);
    st->call = std::move(call);
    st->pending = std::move(head);
    st->id = id;
    st->created = created;
    st->authorization = Authorization(req);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) { return Pump(st.get(), sink); },
        [st](bool) {
          // Done, or the client went away: a call still running is cancelled, which aborts the
          // request on the decode worker and frees its blocks.
          if (st->call != nullptr) st->call->context.TryCancel();
        });
  }

  // Sends what the next gRPC message brings. Returns false to end the response (client gone).
  bool Pump(StreamState* st, httplib::DataSink& sink) {
    const ParsedRequest& p = *st->request;
    if (st->finished) {
      sink.done();
      return true;
    }
    if (p.chat && !st->role_sent) {
      st->role_sent = true;
      Json choice = {{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                     {"finish_reason", nullptr}};
      return Send(sink, Chunk(*st, choice));
    }
    v1::GenerateResponse r;
    if (st->pending != nullptr) {
      r = *st->pending;
      st->pending.reset();
    } else if (!st->call->reader->Read(&r)) {
      const grpc::Status s = st->call->reader->Finish();
      st->call.reset();
      if (!s.ok()) {  // Headers are gone: the error travels as an event, then the stream ends.
        Send(sink, FromGrpc(s).ToJson());
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        st->finished = true;
        sink.done();
        return true;
      }
      if (++st->prompt < p.prompts.size()) {  // The next prompt's choice.
        st->call = Start(st->authorization, p.prompts[st->prompt]);
        st->text_offset = 0;
        return true;
      }
      if (p.include_usage) {
        Json j = {{"id", st->id}, {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", st->created}, {"model", p.model}, {"choices", Json::array()},
                  {"usage", UsageJson(st->total)}};
        if (!Send(sink, j)) return false;
      }
      const std::string done = "data: [DONE]\n\n";
      if (!sink.write(done.data(), done.size())) return false;
      st->finished = true;
      sink.done();
      return true;
    }
    if (!r.finish_reason().empty()) {
      AddUsage(r.usage(), &st->total);
    }
    if (r.token_ids().empty() && r.text().empty() && r.finish_reason().empty()) return true;
    std::vector<int32_t> ids(r.token_ids().begin(), r.token_ids().end());
    std::vector<float> lps(r.logprobs().begin(), r.logprobs().end());
    std::vector<v1::TokenLogprobs> top(r.top_logprobs().begin(), r.top_logprobs().end());
    Json choice = {{"index", st->prompt}};
    if (p.chat) {
      choice["delta"] = r.text().empty() && !r.finish_reason().empty() ? Json::object() : Json{{"content", r.text()}};
    } else {
      choice["text"] = r.text();
    }
    choice["logprobs"] = Logprobs(p, ids, lps, top, st->text_offset);
    st->text_offset += r.text().size();
    choice["finish_reason"] = r.finish_reason().empty() ? Json(nullptr) : Json(r.finish_reason());
    return Send(sink, Chunk(*st, choice));
  }

  void Tokenize(const httplib::Request& req, httplib::Response& res) {
    ApiError e;
    nlohmann::ordered_json j;
    if (!ParseJsonObject(req.body, &j, &e)) return SendError(res, e);
    std::string text;
    bool add_special = true;
    if (j.contains("add_special_tokens") && j["add_special_tokens"].is_boolean()) add_special = j["add_special_tokens"];
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
    res.set_content(Dump({{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", max_model_len_}}),
                    "application/json");
  }

  void Detokenize(const httplib::Request& req, httplib::Response& res) {
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
      if (!t.is_number_integer()) {
        e.message = "'tokens' must be a list of integers";
        return SendError(res, e);
      }
      ids.push_back(t.get<int32_t>());
    }
    auto text = tokenizer_->Decode(ids, false);
    if (!text.ok()) {
      e.message = std::string(text.status().message());
      return SendError(res, e);
    }
    res.set_content(Dump({{"prompt", *text}}), "application/json");
  }

  OpenAiServerOptions options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  int64_t max_model_len_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  ParseOptions parse_;
};

}  // namespace

struct OpenAiServer::Impl {
  std::unique_ptr<Gateway> gateway;
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
  std::string address;
};

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OpenAiServer::~OpenAiServer() {
  if (impl_->server) impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

const std::string& OpenAiServer::address() const { return impl_->address; }

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(const OpenAiServerOptions& options) {
  auto address = ParseHostPort(options.listen, "--http-listen", PortUse::kListen);
  if (!address.ok()) return address.status();
  auto tokenizer = Tokenizer::Load(options.model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  std::unique_ptr<ChatTemplate> tmpl;
  auto loaded = ChatTemplate::Load(options.model_dir, options.chat_template);
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
  if (!options.tls_cert.empty()) {
    auto tls = std::make_unique<httplib::SSLServer>(options.tls_cert.c_str(), options.tls_key.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(Str("--tls-cert/--tls-key: cannot load ", options.tls_cert, " and ",
                                            options.tls_key, " for the HTTP API"));
    }
    impl->server = std::move(tls);
  } else {
    impl->server = std::make_unique<httplib::Server>();
  }
  httplib::Server& s = *impl->server;
  s.set_socket_options([](int sock) {  // No SO_REUSEPORT (httplib's default): a taken port is an error.
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.set_payload_max_length(options.max_request_bytes);
  s.new_task_queue = [] { return new httplib::ThreadPool(64); };
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // A handler's own error (already OpenAI-shaped).
    ApiError e;
    e.http_status = res.status;
    if (res.status == 413) {
      e.message = "The request body is larger than --max-request-bytes.";
    } else if (res.status == 404) {
      e.type = "NotFoundError";
      e.message = Str("No route for ", req.method, " ", req.path);
    } else {
      e.message = Str("HTTP ", res.status);
    }
    res.set_content(e.ToJson().dump(), "application/json");
  });
  impl->gateway->Register(s);
  const int bound = address->port == 0 ? s.bind_to_any_port(address->host)
                                       : (s.bind_to_port(address->host, address->port) ? address->port : -1);
  if (bound <= 0) return absl::UnavailableError(Str("--http-listen: cannot listen on ", options.listen));
  impl->address = HostPort{address->host, bound}.ToString();
  httplib::Server* server = impl->server.get();
  impl->thread = std::thread([server] { server->listen_after_bind(); });
  while (!server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

}  // namespace pdserve::openai
