// pdserve generate: one request through the engine, printed as text or JSON.
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/npy_writer.h"
#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/llm_engine.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {
namespace {

struct GenerateFlags {
  std::string model;
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
  int64_t logprobs = 0;
  std::string stop_token_ids;
  bool add_special_tokens = true;
  std::string format = "text";
  std::string dump_logits;
  EngineFlags engine;
};

absl::StatusOr<SamplingParams> ToSampling(const GenerateFlags& f) {
  SamplingParams p;
  p.max_tokens = static_cast<int32_t>(std::min<int64_t>(f.max_tokens, INT32_MAX));
  if (f.max_tokens < 1) return absl::InvalidArgumentError("--max-tokens: must be >= 1");
  p.temperature = static_cast<float>(f.temperature);
  p.top_p = static_cast<float>(f.top_p);
  p.top_k = static_cast<int32_t>(f.top_k);
  p.min_p = static_cast<float>(f.min_p);
  p.repetition_penalty = static_cast<float>(f.repetition_penalty);
  p.frequency_penalty = static_cast<float>(f.frequency_penalty);
  p.presence_penalty = static_cast<float>(f.presence_penalty);
  if (f.seed >= 0) p.seed = static_cast<uint64_t>(f.seed);
  p.ignore_eos = f.ignore_eos;
  p.logprobs = static_cast<int32_t>(f.logprobs);
  PD_RETURN_IF_ERROR(ParseIntList(f.stop_token_ids, "--stop-token-ids", &p.stop_token_ids));
  return p;
}

int Run(const GenerateFlags& f, const FlagSet& flags) {
  const char* cmd = "generate";
  if (f.model.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("--model DIR is required"), kExitUsage);
  }
  if (flags.WasSet("prompt") == flags.WasSet("prompt-ids")) {
    return ReportError(cmd, absl::InvalidArgumentError("give exactly one of --prompt or "
                                                       "--prompt-ids"), kExitUsage);
  }
  if (f.format != "text" && f.format != "json") {
    return ReportError(cmd, absl::InvalidArgumentError("--format: text or json"), kExitUsage);
  }
  auto sampling = ToSampling(f);
  if (!sampling.ok()) return ReportError(cmd, sampling.status(), kExitUsage);
  EngineOptions options;
  if (absl::Status s = f.engine.ToOptions(&options); !s.ok()) {
    return ReportError(cmd, s, kExitUsage);
  }

  // The tokenizer is needed for --prompt; for --prompt-ids it only turns output into text.
  std::unique_ptr<Tokenizer> tokenizer;
  absl::Status tokenizer_status = absl::NotFoundError("no tokenizer.json");
  if (FileExists(JoinPath(f.model, "tokenizer.json"))) {
    auto t = Tokenizer::Load(f.model);
    tokenizer_status = t.status();
    if (t.ok()) tokenizer = std::move(*t);
  }
  std::vector<int32_t> prompt;
  if (flags.WasSet("prompt")) {
    if (!tokenizer) {
      return ReportError(cmd, absl::FailedPreconditionError(
                                  Str("--prompt needs the model's tokenizer: ",
                                      tokenizer_status.message(), " (use --prompt-ids)")));
    }
    auto ids = tokenizer->Encode(f.prompt, f.add_special_tokens);
    if (!ids.ok()) return ReportError(cmd, ids.status());
    prompt = std::move(*ids);
  } else {
    if (absl::Status s = ParseIntList(f.prompt_ids, "--prompt-ids", &prompt); !s.ok()) {
      return ReportError(cmd, s, kExitUsage);
    }
  }
  if (!tokenizer && tokenizer_status.code() != absl::StatusCode::kNotFound) {
    PD_LOG(Warning) << "output will have no text: " << tokenizer_status.message();
  }

  auto engine = LLMEngine::Create(f.model, options);
  if (!engine.ok()) return ReportError(cmd, engine.status());
  const int64_t vocab = (*engine)->config().vocab_size;
  std::vector<float> dumped;
  if (!f.dump_logits.empty()) {
    (*engine)->SetLogitsObserver([&](const std::string&, const float* l, int64_t v) {
      dumped.insert(dumped.end(), l, l + v);
    });
  }
  if (absl::Status s = (*engine)->AddRequest("generate-0", prompt, *sampling); !s.ok()) {
    return ReportError(cmd, s);
  }
  std::vector<TokenOutput> tokens;
  RequestOutput last;
  // Text mode prints as tokens arrive, through the streaming detokenizer (never a broken
  // character), with the prompt as context so the first token decodes as it would in place.
  std::unique_ptr<IncrementalDetokenizer> stream;
  if (f.format == "text" && tokenizer) {
    stream = std::make_unique<IncrementalDetokenizer>(tokenizer.get(), true, prompt);
  }
  while ((*engine)->HasUnfinished()) {
    std::vector<RequestOutput> outs;
    if (absl::Status s = (*engine)->Step(&outs); !s.ok()) return ReportError(cmd, s);
    for (RequestOutput& o : outs) {
      for (TokenOutput& t : o.tokens) {
        if (stream) {
          auto delta = stream->Next(t.token);
          if (delta.ok() && !delta->empty()) {
            std::fputs(delta->c_str(), stdout);
            std::fflush(stdout);
          }
        }
        tokens.push_back(std::move(t));
      }
      last = std::move(o);
    }
  }
  if (stream) {
    std::fputs(stream->Finish().c_str(), stdout);
    std::fputs("\n", stdout);
  }
  if (!f.dump_logits.empty()) {
    const int64_t rows = static_cast<int64_t>(dumped.size()) / vocab;
    if (absl::Status s = WriteNpyFloat32(f.dump_logits, dumped, {rows, vocab}); !s.ok()) {
      return ReportError(cmd, s);
    }
  }

  std::vector<int32_t> ids;
  for (const TokenOutput& t : tokens) ids.push_back(t.token);
  std::string text;
  if (tokenizer) {
    auto decoded = tokenizer->Decode(ids, /*skip_special_tokens=*/true);
    if (decoded.ok()) text = *decoded;
  }
  const double ttft_ms = last.ttft_seconds * 1e3;
  const double tpot_ms = ids.size() > 1 ? (last.e2e_seconds - last.ttft_seconds) * 1e3 /
                                              static_cast<double>(ids.size() - 1)
                                        : 0.0;
  if (f.format == "json") {
    nlohmann::ordered_json j;
    j["token_ids"] = ids;
    j["text"] = text;
    nlohmann::json lp = nlohmann::json::array();
    for (const TokenOutput& t : tokens) lp.push_back(t.logprob);
    j["logprobs"] = lp;
    if (f.logprobs > 0) {
      nlohmann::json top = nlohmann::json::array();
      for (const TokenOutput& t : tokens) {
        nlohmann::json step = nlohmann::json::array();
        for (const auto& [id, logprob] : t.top_logprobs) {
          step.push_back({{"token_id", id}, {"logprob", logprob}});
        }
        top.push_back(step);
      }
      j["top_logprobs"] = top;
    }
    j["finish_reason"] = last.finish_reason;
    j["usage"] = {{"prompt_tokens", last.prompt_tokens},
                  {"completion_tokens", static_cast<int64_t>(ids.size())},
                  {"cached_tokens", last.cached_tokens}};
    j["timing"] = {{"ttft_ms", ttft_ms}, {"tpot_ms", tpot_ms}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    if (!tokenizer) {
      std::string line;
      for (int32_t id : ids) StrAppendTo(&line, line.empty() ? "" : " ", id);
      std::printf("%s\n", line.c_str());
    }
    std::fprintf(stderr, "[%zu tokens, finish_reason=%s, ttft %.1f ms, tpot %.2f ms]\n",
                 ids.size(), last.finish_reason.c_str(), ttft_ms, tpot_ms);
  }
  return kExitOk;
}

}  // namespace

int GenerateCommand(int argc, char** argv) {
  GenerateFlags f;
  FlagSet flags("generate", "Generates a completion for one prompt on the local CPU engine.");
  flags.String("model", &f.model, "Hugging Face model directory");
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
  flags.Int("logprobs", &f.logprobs, "also report the top N alternatives per token");
  flags.String("stop-token-ids", &f.stop_token_ids, "extra stop token ids, e.g. 13,29");
  flags.Bool("add-special-tokens", &f.add_special_tokens, "add BOS etc. when encoding --prompt");
  flags.String("format", &f.format, "text or json");
  flags.String("dump-logits", &f.dump_logits, "write each step's raw logits to this .npy file");
  f.engine.Register(flags);
  int code;
  if (!ParseFlagsOrExit(flags, "generate", argc, argv, &code)) return code;
  if (!flags.positional().empty()) {
    return ReportError("generate", absl::InvalidArgumentError(
                                       Str("unexpected argument '", flags.positional()[0], "'")),
                       kExitUsage);
  }
  return Run(f, flags);
}

}  // namespace pdserve::cli
