// pdserve generate: one request on the local engine, or through a router with --server.
// Both paths print the same JSON, so their outputs can be compared field by field.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include "cli/address_flags.h"
#include "cli/cli_util.h"
#include "cli/client_channel.h"
#include "cli/commands.h"
#include "cli/npy_writer.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/llm_engine.h"
#include "common/model/gguf_model.h"
#include "common/model/gguf_tokenizer.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/sampling_proto.h"
#include "common/rpc/server_builder.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"
#include "pdserve/internal/v1/lenient.pb.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct GenerateFlags {
  std::string model;
  std::string server;
  std::string server_ca;  // Verify the router's TLS certificate with this CA.
  std::string api_key;
  std::string tokenizer;  // Instead of the model's.
  std::string prompt;
  std::string prompt_ids;
  int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  int64_t seed = -1;
  bool ignore_eos = false;
  std::string lora_name;  // A LoRA adapter of --lora-modules (local) or the server's.
  int64_t logprobs = 0;
  std::string stop_token_ids;
  std::string stop;
  // Structured outputs (at most one); text, or @FILE for the file's.
  std::string json_schema, regex, choice, grammar, json_whitespace;
  bool json_object = false;
  bool add_special_tokens = true;
  std::string format = "text";
  std::string dump_logits;
  double timeout_seconds = 600;
  EngineFlags engine;
};

struct Completion {
  std::vector<TokenOutput> tokens;
  std::string text;
  std::string finish_reason;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  double ttft_ms = 0;
  double tpot_ms = 0;
};

// Receives text as it is generated (text mode prints it).
using TextSink = std::function<void(const std::string&)>;

// --json-schema, --json-object, --regex, --choice or --grammar (null: none); text or @FILE.
absl::StatusOr<std::shared_ptr<const structured::OutputConstraint>> ToConstraint(const GenerateFlags& f) {
  using Kind = structured::OutputConstraint::Kind;
  auto c = std::make_shared<structured::OutputConstraint>();
  int given = f.json_object ? 1 : 0;
  const std::pair<const std::string*, Kind> texts[] = {
      {&f.json_schema, Kind::kJsonSchema}, {&f.regex, Kind::kRegex}, {&f.choice, Kind::kChoice},
      {&f.grammar, Kind::kGrammar}};
  if (f.json_object) c->kind = Kind::kJsonObject;
  for (const auto& [text, kind] : texts) {
    if (text->empty()) continue;
    ++given;
    c->kind = kind;
    c->value = *text;
    if ((*text)[0] == '@') {
      PD_ASSIGN_OR_RETURN(c->value, ReadFileToString(text->substr(1)));
    }
  }
  if (given == 0) {
    if (!f.json_whitespace.empty()) {
      return absl::InvalidArgumentError("--json-whitespace: goes with --json-schema or --json-object");
    }
    return nullptr;
  }
  c->whitespace = f.json_whitespace;
  if (given > 1) {
    return absl::InvalidArgumentError(
        "give at most one of --json-schema, --json-object, --regex, --choice, --grammar");
  }
  if (c->kind == Kind::kChoice) {
    auto j = nlohmann::json::parse(c->value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array() || j.empty()) return absl::InvalidArgumentError("--choice: a JSON array of strings");
    for (const auto& x : j) {
      if (!x.is_string()) return absl::InvalidArgumentError("--choice: a JSON array of strings");
      c->choices.push_back(x.get<std::string>());
    }
    c->value.clear();
  }
  return std::shared_ptr<const structured::OutputConstraint>(std::move(c));
}

absl::StatusOr<SamplingParams> ToSampling(const GenerateFlags& f) {
  SamplingParams p;
  if (f.max_tokens < 1 || f.max_tokens > INT32_MAX) {
    return absl::InvalidArgumentError("--max-tokens: must be >= 1");
  }
  p.max_tokens = static_cast<int32_t>(f.max_tokens);
  p.temperature = static_cast<float>(f.temperature);
  p.top_p = static_cast<float>(f.top_p);
  p.top_k = static_cast<int32_t>(f.top_k);
  p.min_p = static_cast<float>(f.min_p);
  p.repetition_penalty = static_cast<float>(f.repetition_penalty);
  p.frequency_penalty = static_cast<float>(f.frequency_penalty);
  p.presence_penalty = static_cast<float>(f.presence_penalty);
  if (f.seed >= 0) p.seed = static_cast<uint64_t>(f.seed);
  p.ignore_eos = f.ignore_eos;
  p.lora_name = f.lora_name;
  p.logprobs = static_cast<int32_t>(f.logprobs);
  PD_RETURN_IF_ERROR(ParseIntList(f.stop_token_ids, "--stop-token-ids", &p.stop_token_ids));
  PD_ASSIGN_OR_RETURN(p.constraint, ToConstraint(f));
  // The ranges (the vocabulary is checked once the model or server is known): a usage error.
  if (absl::Status s = p.Validate(INT32_MAX); !s.ok()) {
    std::string m(s.message());  // "top_p: ..." names the flag --top-p.
    for (size_t i = 0; i < m.size() && m[i] != ':'; ++i) {
      if (m[i] == '_') m[i] = '-';
    }
    return absl::InvalidArgumentError(Str("--", m));
  }
  return p;
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

absl::StatusOr<Completion> RunLocal(const GenerateFlags& f, const FlagSet& flags,
                                    const SamplingParams& sampling, const TextSink& sink) {
  EngineOptions options;
  PD_RETURN_IF_ERROR(f.engine.ToOptions(&options));
  PD_RETURN_IF_ERROR(f.engine.LoraToOptions(f.model, &options));
  options.tokenizer = f.tokenizer;
  // The tokenizer is needed for --prompt; for --prompt-ids it only turns output into text.
  std::unique_ptr<Tokenizer> tokenizer;
  absl::Status tokenizer_status = absl::NotFoundError("no tokenizer.json");
  const std::string tokenizer_path = f.tokenizer.empty() ? f.model : f.tokenizer;
  if (!f.tokenizer.empty() || IsGgufPath(f.model) ||
      FileExists(JoinPath(f.model, "tokenizer.json"))) {
    auto t = LoadModelTokenizer(tokenizer_path);
    tokenizer_status = t.status();
    if (t.ok()) tokenizer = std::move(*t);
  }
  std::vector<int32_t> prompt;
  if (flags.WasSet("prompt")) {
    if (!tokenizer) {
      return absl::FailedPreconditionError(Str("--prompt needs the model's tokenizer: ",
                                               tokenizer_status.message(), " (use --prompt-ids)"));
    }
    PD_ASSIGN_OR_RETURN(prompt, tokenizer->Encode(f.prompt, f.add_special_tokens));
  } else {
    PD_RETURN_IF_ERROR(ParseIntList(f.prompt_ids, "--prompt-ids", &prompt));
  }
  if (!tokenizer && tokenizer_status.code() != absl::StatusCode::kNotFound) {
    PD_LOG(Warning) << "output will have no text: " << tokenizer_status.message();
  }
  const std::vector<std::string> stops = [&] {
    std::vector<std::string> v;
    if (!f.stop.empty()) v.push_back(f.stop);
    return v;
  }();

  PD_ASSIGN_OR_RETURN(std::unique_ptr<LLMEngine> engine, LLMEngine::Create(f.model, options));
  const int64_t vocab = engine->config().vocab_size;
  std::vector<float> dumped;
  if (!f.dump_logits.empty()) {
    engine->SetLogitsObserver([&](const std::string&, const float* l, int64_t v) {
      dumped.insert(dumped.end(), l, l + v);
    });
  }
  PD_RETURN_IF_ERROR(engine->AddRequest("generate-0", prompt, sampling));
  Completion c;
  c.prompt_tokens = static_cast<int64_t>(prompt.size());
  // Text through the streaming detokenizer, with the prompt as context: exactly what a router
  // streams, so local and served outputs compare equal.
  std::unique_ptr<IncrementalDetokenizer> detok;
  if (tokenizer) detok = std::make_unique<IncrementalDetokenizer>(tokenizer.get(), true, prompt);
  const auto start = Clock::now();
  Clock::time_point first_token;
  bool stopped = false;
  while (engine->HasUnfinished() && !stopped) {
    std::vector<RequestOutput> outs;
    PD_RETURN_IF_ERROR(engine->Step(&outs));
    // Stop strings are looked for after each token, as the router does: tokens that came with
    // it (accepted speculative drafts) past the one completing a stop string are not output.
    const auto find_stop = [&] {
      for (const std::string& s : stops) {
        const size_t at = c.text.find(s);
        if (at != std::string::npos) {
          c.text.resize(at);
          c.finish_reason = "stop";
          stopped = true;
          engine->Abort("generate-0", nullptr);
          return;
        }
      }
    };
    for (RequestOutput& o : outs) {
      for (TokenOutput& t : o.tokens) {
        if (stopped) break;
        if (c.tokens.empty()) first_token = Clock::now();
        if (detok) {
          auto delta = detok->Next(t.token);
          if (delta.ok()) {
            c.text += *delta;
            if (stops.empty()) sink(*delta);  // With stop strings the text is shown at the end.
          }
        }
        c.tokens.push_back(std::move(t));
        find_stop();
      }
      if (o.finished && !stopped) {
        c.finish_reason = o.finish_reason;
        c.cached_tokens = o.cached_tokens;
        if (detok) {
          const std::string rest = detok->Finish();
          c.text += rest;
          if (stops.empty()) sink(rest);
        }
        find_stop();
      }
    }
  }
  if (!stops.empty()) sink(c.text);
  c.ttft_ms = Ms(first_token - start);
  if (c.tokens.size() > 1) c.tpot_ms = Ms(Clock::now() - first_token) / (c.tokens.size() - 1);
  engine->FlushKvOffload();  // --kv-offload-disk: what this run published is stored before it exits.
  if (!f.dump_logits.empty()) {
    const int64_t rows = static_cast<int64_t>(dumped.size()) / vocab;
    PD_RETURN_IF_ERROR(WriteNpyFloat32(f.dump_logits, dumped, {rows, vocab}));
  }
  return c;
}

absl::StatusOr<Completion> RunRemote(const GenerateFlags& f, const FlagSet& flags,
                                     const SamplingParams& sampling, const TextSink& sink) {
  PD_ASSIGN_OR_RETURN(auto channel, PublicChannel(f.server, f.server_ca));
  v1::GenerateRequest req;
  if (flags.WasSet("prompt")) {
    req.set_text(f.prompt);
  } else {
    std::vector<int32_t> ids;
    PD_RETURN_IF_ERROR(ParseIntList(f.prompt_ids, "--prompt-ids", &ids));
    req.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  }
  req.set_add_special_tokens(f.add_special_tokens);
  v1::SamplingParams* p = req.mutable_sampling();
  p->set_temperature(sampling.temperature);
  p->set_top_p(sampling.top_p);
  p->set_top_k(sampling.top_k);
  p->set_min_p(sampling.min_p);
  p->set_repetition_penalty(sampling.repetition_penalty);
  p->set_frequency_penalty(sampling.frequency_penalty);
  p->set_presence_penalty(sampling.presence_penalty);
  if (sampling.seed) p->set_seed(*sampling.seed);
  p->set_max_tokens(sampling.max_tokens);
  p->mutable_stop_token_ids()->Assign(sampling.stop_token_ids.begin(), sampling.stop_token_ids.end());
  if (!f.stop.empty()) p->add_stop(f.stop);
  p->set_ignore_eos(sampling.ignore_eos);
  p->set_logprobs(sampling.logprobs);
  if (sampling.constraint != nullptr) ToProto(*sampling.constraint, p->mutable_constraint());
  grpc::ClientContext ctx;
  AddApiKey(&ctx, f.api_key);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(f.timeout_seconds * 1000)));
  Completion c;
  const auto start = Clock::now();
  Clock::time_point first_token;
  // The public method, read as LenientGenerateResponse (text as bytes): with the generated stub a
  // message whose text is not UTF-8 fails to parse, gRPC drops it, Read() ends the stream early
  // and the call can still end OK. This is how the generated stub makes the call (gRPC 1.51).
  static const grpc::internal::RpcMethod kGenerate("/pdserve.v1.Generation/Generate",
                                                   grpc::internal::RpcMethod::SERVER_STREAMING,
                                                   channel);
  std::unique_ptr<grpc::ClientReader<internal::v1::LenientGenerateResponse>> reader(
      grpc::internal::ClientReaderFactory<internal::v1::LenientGenerateResponse>::Create(
          channel.get(), kGenerate, &ctx, req));
  internal::v1::LenientGenerateResponse r;
  int messages = 0;
  absl::Status malformed;
  while (reader->Read(&r)) {
    ++messages;
    // A server speaking the protocol sends a logprob per token, valid UTF-8 text and nothing
    // after the message that carries finish_reason; anything else is a broken stream, which must
    // not pass for a short completion.
    if (malformed.ok() && !c.finish_reason.empty()) {
      malformed = absl::DataLossError(Str("message ", messages, " arrived after the one that "
                                          "carried finish_reason"));
    }
    if (malformed.ok() && (r.logprobs_size() != r.token_ids_size() ||
                           (r.top_logprobs_size() != 0 &&
                            r.top_logprobs_size() != r.token_ids_size()))) {
      malformed = absl::DataLossError(
          Str("message ", messages, " has ", r.token_ids_size(), " token ids, ",
              r.logprobs_size(), " logprobs and ", r.top_logprobs_size(), " top_logprobs"));
    }
    if (size_t at = 0; malformed.ok() && !IsValidUtf8(r.text(), &at)) {
      malformed = absl::DataLossError(Str("message ", messages, "'s text is not valid UTF-8 at "
                                          "byte ", at));
    }
    if (!malformed.ok()) continue;  // Read to the end; the error is reported after Finish.
    for (int i = 0; i < r.token_ids_size(); ++i) {
      if (c.tokens.empty()) first_token = Clock::now();
      TokenOutput t{r.token_ids(i), r.logprobs(i), {}};
      if (i < r.top_logprobs_size()) {
        for (const auto& top : r.top_logprobs(i).top()) {
          t.top_logprobs.emplace_back(top.token_id(), top.logprob());
        }
      }
      c.tokens.push_back(std::move(t));
    }
    c.text += r.text();
    sink(r.text());
    if (!r.finish_reason().empty()) {
      c.finish_reason = r.finish_reason();
      c.prompt_tokens = r.usage().prompt_tokens();
      c.cached_tokens = r.usage().cached_tokens();
    }
  }
  PD_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  PD_RETURN_IF_ERROR(malformed);
  if (c.finish_reason.empty()) {
    return absl::DataLossError(Str("the server's stream ended after ", messages, " message",
                                   messages == 1 ? "" : "s", " and ", c.tokens.size(),
                                   " tokens without a finish_reason"));
  }
  c.ttft_ms = Ms(first_token - start);
  if (c.tokens.size() > 1) c.tpot_ms = Ms(Clock::now() - first_token) / (c.tokens.size() - 1);
  return c;
}

void Print(const Completion& c, const GenerateFlags& f) {
  std::vector<int32_t> ids;
  for (const TokenOutput& t : c.tokens) ids.push_back(t.token);
  if (f.format == "json") {
    nlohmann::ordered_json j;
    j["token_ids"] = ids;
    j["text"] = c.text;
    nlohmann::json lp = nlohmann::json::array();
    for (const TokenOutput& t : c.tokens) lp.push_back(t.logprob);
    j["logprobs"] = lp;
    if (f.logprobs > 0) {
      nlohmann::json top = nlohmann::json::array();
      for (const TokenOutput& t : c.tokens) {
        nlohmann::json step = nlohmann::json::array();
        for (const auto& [id, logprob] : t.top_logprobs) {
          step.push_back({{"token_id", id}, {"logprob", logprob}});
        }
        top.push_back(step);
      }
      j["top_logprobs"] = top;
    }
    j["finish_reason"] = c.finish_reason;
    j["usage"] = {{"prompt_tokens", c.prompt_tokens},
                  {"completion_tokens", static_cast<int64_t>(ids.size())},
                  {"cached_tokens", c.cached_tokens}};
    j["timing"] = {{"ttft_ms", c.ttft_ms}, {"tpot_ms", c.tpot_ms}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  if (c.text.empty() && !ids.empty()) {
    std::string line;
    for (int32_t id : ids) StrAppendTo(&line, line.empty() ? "" : " ", id);
    std::printf("%s", line.c_str());
  }
  std::printf("\n");
  std::fprintf(stderr, "[%zu tokens, finish_reason=%s, ttft %.1f ms, tpot %.2f ms]\n", ids.size(),
               c.finish_reason.c_str(), c.ttft_ms, c.tpot_ms);
}

}  // namespace

int GenerateCommand(int argc, char** argv) {
  const char* cmd = "generate";
  GenerateFlags f;
  FlagSet flags("generate", "Generates a completion on the local CPU engine, or through a "
                            "router with --server.");
  flags.String("model", &f.model, "Hugging Face model directory or GGUF file (local engine)");
  flags.String("tokenizer", &f.tokenizer,
               "a tokenizer directory instead of the model's (a GGUF file without a vocabulary)");
  flags.String("server", &f.server, "host:port of a router or `pdserve serve` instead of --model");
  flags.String("server-ca", &f.server_ca, "with --server: PEM CA to verify the router's TLS certificate");
  flags.String("api-key", &f.api_key, "with --server: API key (better: PDSERVE_API_KEY in the environment)");
  flags.String("prompt", &f.prompt, "prompt text (needs the model's tokenizer)");
  flags.String("prompt-ids", &f.prompt_ids, "prompt as token ids, e.g. 1,2,3");
  flags.Int("max-tokens", &f.max_tokens, "tokens to generate");
  flags.Double("temperature", &f.temperature, "0 for greedy");
  flags.Double("top-p", &f.top_p, "nucleus sampling mass");
  flags.Int("top-k", &f.top_k, "keep the k most likely tokens (0: off)");
  flags.Double("min-p", &f.min_p, "keep tokens with p >= min_p * p_max");
  flags.Double("repetition-penalty", &f.repetition_penalty, "penalise prompt and output tokens");
  flags.Double("frequency-penalty", &f.frequency_penalty, "penalise by output count");
  flags.Double("presence-penalty", &f.presence_penalty, "penalise output tokens once");
  flags.Int("seed", &f.seed, "sampling seed (-1: random)");
  flags.Bool("ignore-eos", &f.ignore_eos, "keep generating after EOS");
  flags.String("lora-name", &f.lora_name,
               "run with this LoRA adapter (one of --lora-modules, or the server's)");
  flags.Int("logprobs", &f.logprobs, "also report the top N alternatives per token");
  flags.String("stop-token-ids", &f.stop_token_ids, "extra stop token ids, e.g. 13,29");
  flags.String("stop", &f.stop, "a stop string (not included in the text)");
  flags.Bool("add-special-tokens", &f.add_special_tokens, "add BOS etc. when encoding --prompt");
  flags.String("json-schema", &f.json_schema, "constrain the output to this JSON Schema (text or @FILE)");
  flags.Bool("json-object", &f.json_object, "constrain the output to a JSON object");
  flags.String("json-whitespace", &f.json_whitespace,
               "with --json-schema/--json-object: whitespace allowed between JSON tokens, a regex "
               "(default none: compact)");
  flags.String("regex", &f.regex, "constrain the output to this regex (Python syntax; text or @FILE)");
  flags.String("choice", &f.choice, "constrain the output to one of a JSON array of strings");
  flags.String("grammar", &f.grammar, "constrain the output to this grammar (pdserve EBNF; text or @FILE)");
  flags.String("format", &f.format, "text or json");
  flags.String("dump-logits", &f.dump_logits, "write each step's raw logits to this .npy file");
  flags.Double("timeout-seconds", &f.timeout_seconds, "deadline of a --server request");
  f.engine.Register(flags);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (f.model.empty() == f.server.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("give exactly one of --model or --server"),
                       kExitUsage);
  }
  if (flags.WasSet("prompt") == flags.WasSet("prompt-ids")) {
    return ReportError(cmd, absl::InvalidArgumentError("give exactly one of --prompt or --prompt-ids"),
                       kExitUsage);
  }
  if (f.format != "text" && f.format != "json") {
    return ReportError(cmd, absl::InvalidArgumentError("--format: text or json"), kExitUsage);
  }
  if (!f.server.empty()) {
    if (absl::Status s = AddressFlags().Peer(f.server, "--server").Check(); !s.ok()) {
      return ReportError(cmd, s, kExitUsage);
    }
  }
  if (!(f.timeout_seconds > 0)) {
    return ReportError(cmd, absl::InvalidArgumentError("--timeout-seconds: must be > 0"),
                       kExitUsage);
  }
  if (!f.server.empty() && !f.dump_logits.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("--dump-logits needs the local engine (--model)"),
                       kExitUsage);
  }
  auto sampling = ToSampling(f);
  if (!sampling.ok()) return ReportError(cmd, sampling.status(), kExitUsage);
  // Text mode shows the completion as it streams.
  const TextSink sink = [&f](const std::string& text) {
    if (f.format == "text" && !text.empty()) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  auto completion = f.server.empty() ? RunLocal(f, flags, *sampling, sink)
                                     : RunRemote(f, flags, *sampling, sink);
  if (!completion.ok()) return ReportError(cmd, completion.status());
  Print(*completion, f);
  return kExitOk;
}

}  // namespace pdserve::cli
