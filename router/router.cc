#include "router/router.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <random>
#include <thread>

#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/proto_convert.h"
#include "common/rpc/server_builder.h"
#include "common/tokenizer/unicode.h"

namespace pdserve {
namespace {

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

absl::StatusOr<internal::v1::WorkerInfo> FetchInfo(const std::string& address, bool prefill,
                                                   absl::Duration wait) {
  auto channel = Channel(address);
  const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(wait);
  grpc::Status last;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    internal::v1::WorkerInfo info;
    if (prefill) {
      last = internal::v1::PrefillWorker::NewStub(channel)->GetWorkerInfo(&ctx, {}, &info);
    } else {
      last = internal::v1::DecodeWorker::NewStub(channel)->GetWorkerInfo(&ctx, {}, &info);
    }
    if (last.ok()) return info;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < give_up);
  return absl::UnavailableError(Str(prefill ? "prefill" : "decode", " worker ", address,
                                    " did not answer: ", last.error_message()));
}

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(Str(field, ": ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  if (options.decode.empty()) {
    return absl::InvalidArgumentError("the router needs at least one decode worker (--decode)");
  }
  std::unique_ptr<Router> r(new Router());
  r->options_ = options;
  PD_ASSIGN_OR_RETURN(r->config_, ModelConfig::FromFile(JoinPath(options.model_dir, "config.json")));
  PD_ASSIGN_OR_RETURN(r->tokenizer_, Tokenizer::Load(options.model_dir));
  PD_ASSIGN_OR_RETURN(const std::string fingerprint, ModelFingerprint(options.model_dir));

  // Every worker must serve this model with one KV layout.
  std::string layout;
  int32_t max_len = 0;
  auto check = [&](const std::string& address, bool prefill) -> absl::Status {
    PD_ASSIGN_OR_RETURN(internal::v1::WorkerInfo info, FetchInfo(address, prefill, options.worker_wait));
    if (info.layout().model_fingerprint() != fingerprint) {
      return absl::FailedPreconditionError(Str(
          "worker ", address, " serves a different model (fingerprint ",
          info.layout().model_fingerprint(), ", the router's model is ", fingerprint, ")"));
    }
    const std::string l = LayoutString(info.layout());
    if (layout.empty()) layout = l;
    if (l != layout) {
      return absl::FailedPreconditionError(Str("worker ", address, " has KV layout '", l,
                                               "', others have '", layout, "'"));
    }
    if (!prefill) max_len = max_len == 0 ? info.max_model_len() : std::min(max_len, info.max_model_len());
    r->model_info_.set_block_size(info.layout().block_size());
    r->model_info_.set_kv_dtype(info.layout().kv_dtype());
    return absl::OkStatus();
  };
  for (const std::string& d : options.decode) {
    PD_RETURN_IF_ERROR(check(d, false));
    r->decode_.push_back(internal::v1::DecodeWorker::NewStub(Channel(d)));
  }
  for (const std::string& p : options.prefill) PD_RETURN_IF_ERROR(check(p, true));

  const ModelConfig& c = r->config_;
  const size_t slash = options.model_dir.find_last_not_of('/');
  const std::string trimmed = options.model_dir.substr(0, slash + 1);
  r->model_info_.set_name(trimmed.substr(trimmed.rfind('/') + 1));
  r->model_info_.set_architecture(c.architecture);
  r->model_info_.set_family(std::string(ModelFamilyName(c.family)));
  r->model_info_.set_context_length(max_len);
  r->model_info_.set_vocab_size(static_cast<int32_t>(c.vocab_size));
  const int64_t elem = r->model_info_.kv_dtype() == "f32" ? 4 : 2;
  r->model_info_.set_kv_bytes_per_token(2 * c.num_layers * c.num_kv_heads * c.head_dim * elem);
  return r;
}

absl::StatusOr<RoutedRequest> Router::Prepare(const v1::GenerateRequest& request,
                                              std::chrono::system_clock::time_point deadline) const {
  RoutedRequest out;
  out.request_id = request.request_id().empty()
                       ? Str("req-", const_cast<Router*>(this)->next_request_.fetch_add(1))
                       : request.request_id();
  if (out.request_id.size() > 256) return Invalid("request_id", "is longer than 256 bytes");
  const int64_t vocab = config_.vocab_size;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return Invalid("prompt.text", "is empty");
      size_t bad = 0;
      if (!IsValidUtf8(request.text(), &bad)) {
        return Invalid("prompt.text", Str("is not valid UTF-8 (first bad byte at offset ", bad, ")"));
      }
      auto ids = tokenizer_->Encode(request.text(),
                                    request.has_add_special_tokens() ? request.add_special_tokens() : true);
      if (!ids.ok()) return Invalid("prompt.text", std::string(ids.status().message()));
      out.prompt = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      out.prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      if (out.prompt.empty()) return Invalid("prompt.token_ids", "is empty");
      for (size_t i = 0; i < out.prompt.size(); ++i) {
        if (out.prompt[i] < 0 || out.prompt[i] >= vocab) {
          return Invalid("prompt.token_ids", Str("id ", out.prompt[i], " at position ", i,
                                                 " is outside the vocabulary of ", vocab));
        }
      }
      break;
    default:
      return Invalid("prompt", "is missing (set text or token_ids)");
  }
  if (out.prompt.empty()) return Invalid("prompt", "is empty");
  const int64_t context = model_info_.context_length();
  if (static_cast<int64_t>(out.prompt.size()) >= context) {
    return Invalid("prompt", Str(out.prompt.size(), " tokens do not fit the context length of ",
                                 context, " (at least one token must be generated)"));
  }
  const v1::SamplingParams& sp = request.sampling();
  if (sp.has_max_tokens() && sp.max_tokens() < 1) {
    return Invalid("sampling.max_tokens", Str("must be >= 1, got ", sp.max_tokens()));
  }
  if (sp.has_max_tokens() && static_cast<int64_t>(out.prompt.size()) + sp.max_tokens() > context) {
    return Invalid("sampling.max_tokens",
                   Str(sp.max_tokens(), " plus the ", out.prompt.size(),
                       "-token prompt exceed the context length of ", context));
  }
  std::optional<uint64_t> seed;
  if (sp.has_seed()) seed = sp.seed();
  if (!seed) seed = std::random_device{}() * 0x9e3779b97f4a7c15ull + std::random_device{}();
  out.params = FromProto(sp, seed);
  if (absl::Status s = out.params.Validate(vocab); !s.ok()) {
    return absl::InvalidArgumentError(Str("sampling.", s.message()));
  }
  if (static_cast<size_t>(sp.stop_size()) > options_.max_stop_strings) {
    return Invalid("sampling.stop", Str("has ", sp.stop_size(), " strings; at most ",
                                        options_.max_stop_strings));
  }
  for (const std::string& s : sp.stop()) {
    if (s.empty() || s.size() > options_.max_stop_string_bytes || !IsValidUtf8(s)) {
      return Invalid("sampling.stop", Str("each stop string must be 1..",
                                          options_.max_stop_string_bytes, " bytes of UTF-8"));
    }
    out.stop.push_back(s);
  }
  out.skip_special_tokens = sp.has_skip_special_tokens() ? sp.skip_special_tokens() : true;
  out.deadline = deadline;
  if (request.timeout_ms() > 0) {
    out.deadline = std::min(deadline, std::chrono::system_clock::now() +
                                          std::chrono::milliseconds(request.timeout_ms()));
  }
  return out;
}

internal::v1::DecodeWorker::Stub* Router::PickDecode() {
  return decode_[next_decode_.fetch_add(1) % decode_.size()].get();
}

std::string Router::PickPrefill() {
  if (options_.prefill.empty()) return "";
  return options_.prefill[next_prefill_.fetch_add(1) % options_.prefill.size()];
}

}  // namespace pdserve
