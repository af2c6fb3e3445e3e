// pdserve profile: the step cost model of this machine and model for the capacity planner
// (issue 40). Measures real engine steps (prefill chunks by size and cached prefix, decode
// batches by size and context) and KV transfers through the chosen transport, fits the model of
// planner/step_time.h and the transfer's latency and bandwidth, and writes the points beside
// the fit. With --roofline-gbps/--roofline-tflops it writes instead a profile computed from the
// hardware's published figures and the model's bytes and FLOPs (for hardware this machine is
// not), marked "modelled".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/kv_transfer_timing.h"
#include "common/base/file_util.h"
#include "common/base/rng.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/llm_engine.h"
#include "common/model/model_shapes.h"
#include "common/transport/kv_transport.h"
#include "nlohmann/json.hpp"
#include "planner/step_time.h"

namespace pdserve::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A list flag (ParseIntList) of counts: non-negative, not empty; widened for the arithmetic.
absl::StatusOr<std::vector<int64_t>> ParseCounts(const std::string& text, const char* flag) {
  std::vector<int32_t> v;
  PD_RETURN_IF_ERROR(ParseIntList(text, flag, &v));
  if (v.empty()) return absl::InvalidArgumentError(Str(flag, ": empty"));
  for (int32_t x : v) {
    if (x < 0) return absl::InvalidArgumentError(Str(flag, ": ", x, " is not a count"));
  }
  return std::vector<int64_t>(v.begin(), v.end());
}

Json ModelJson(const ModelConfig& c, const std::string& name) {
  return {{"name", name},           {"architecture", c.architecture}, {"hidden_size", c.hidden_size},
          {"num_layers", c.num_layers}, {"num_heads", c.num_heads},     {"num_kv_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},     {"vocab_size", c.vocab_size},   {"parameters", c.NumParameters()},
          {"max_position_embeddings", c.max_position_embeddings}};
}

Json FitJson(const StepTimeModel& m, const std::vector<StepTimeSample>& samples) {
  Json j = {{"a_seconds", m.a},
            {"b_per_token", m.b},
            {"c_per_prefill_pair", m.c},
            {"d_per_sequence", m.d},
            {"e_per_decode_key", m.e},
            {"f_decode_only_seconds", m.f}};
  if (!samples.empty()) j["max_relative_error"] = MaxRelativeError(m, samples);
  return j;
}

std::vector<int32_t> RandomTokens(SplitMix64& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab));
  return t;
}

SamplingParams Greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  p.seed = 1;
  return p;
}

// Runs steps until no request is left (a prefix's prefill and its one token).
absl::Status RunToEnd(LLMEngine& engine) {
  std::vector<RequestOutput> outs;
  while (engine.HasUnfinished()) {
    outs.clear();
    PD_RETURN_IF_ERROR(engine.Step(&outs));
  }
  return absl::OkStatus();
}

// One prefill chunk of n new tokens after a cached prefix of `context`: the fastest of
// `repeats` steps, each a fresh suffix on the same cached prefix.
absl::StatusOr<StepTimeSample> MeasurePrefill(LLMEngine& engine, SplitMix64& rng, int64_t n,
                                          int64_t context, int64_t repeats, int64_t* next_id) {
  const int64_t vocab = engine.config().vocab_size;
  const std::vector<int32_t> prefix = RandomTokens(rng, context, vocab);
  if (context > 0) {  // Computed once, so its blocks are in the prefix cache.
    PD_RETURN_IF_ERROR(engine.AddRequest(Str("p", (*next_id)++), prefix, Greedy(1)));
    PD_RETURN_IF_ERROR(RunToEnd(engine));
  }
  double best = 0;
  for (int64_t r = 0; r < repeats; ++r) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> suffix = RandomTokens(rng, n, vocab);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    PD_RETURN_IF_ERROR(engine.AddRequest(Str("p", (*next_id)++), std::move(prompt), Greedy(1)));
    std::vector<RequestOutput> outs;
    const auto t0 = Clock::now();
    PD_RETURN_IF_ERROR(engine.Step(&outs));
    const double secs = SecondsSince(t0);
    if (outs.size() != 1 || !outs[0].finished || engine.HasUnfinished()) {
      return absl::InternalError(Str("a ", n, "-token chunk did not run in one step"));
    }
    if (outs[0].cached_tokens != context) {
      return absl::InternalError(Str("the ", context, "-token prefix was not served from the prefix cache (",
                                     outs[0].cached_tokens, " tokens were)"));
    }
    best = r == 0 ? secs : std::min(best, secs);
  }
  StepTimeSample s;
  s.shape.AddChunk(n, context);
  s.seconds = best;
  s.kind = "prefill";
  return s;
}

// `batch` sequences decoding after `context`-token prompts: the median of `steps` decode steps
// (the shared machine takes a few away: the median, not the mean), with its exact shape.
absl::StatusOr<StepTimeSample> MeasureDecode(LLMEngine& engine, SplitMix64& rng, int64_t batch,
                                         int64_t context, int64_t steps, int64_t* next_id) {
  const int64_t vocab = engine.config().vocab_size;
  std::vector<std::string> ids;
  absl::flat_hash_map<std::string, int64_t> generated;
  for (int64_t b = 0; b < batch; ++b) {
    ids.push_back(Str("d", (*next_id)++));
    // Long enough for every row to run through the timed steps: a batch whose prompts take
    // several steps to prefill has its first rows decoding meanwhile.
    const int64_t room = engine.max_model_len() - context - 1;
    PD_RETURN_IF_ERROR(engine.AddRequest(ids.back(), RandomTokens(rng, context, vocab),
                                         Greedy(static_cast<int32_t>(std::min<int64_t>(room, 1 << 20)))));
  }
  std::vector<RequestOutput> outs;
  // Prefill every prompt (each has its first token then; a chunk that did not end its prompt
  // reports no token).
  while (static_cast<int64_t>(generated.size()) < batch) {
    outs.clear();
    PD_RETURN_IF_ERROR(engine.Step(&outs));
    for (const RequestOutput& o : outs) {
      if (!o.tokens.empty()) generated[o.request_id] += static_cast<int64_t>(o.tokens.size());
    }
  }
  std::vector<std::pair<double, StepShape>> timed;
  for (int64_t k = 0; k < steps; ++k) {
    StepShape shape;
    for (const std::string& id : ids) shape.AddChunk(1, context + generated[id] - 1);
    outs.clear();
    const auto t0 = Clock::now();
    PD_RETURN_IF_ERROR(engine.Step(&outs));
    const double secs = SecondsSince(t0);
    if (static_cast<int64_t>(outs.size()) != batch) {
      const EngineStats st = engine.Stats();
      return absl::InternalError(Str("a decode step of ", batch, " sequences produced ", outs.size(),
                                     " outputs (", st.running, " running, ", st.waiting,
                                     " waiting, ", st.kv.free_blocks, " free blocks)"));
    }
    for (const RequestOutput& o : outs) generated[o.request_id] += static_cast<int64_t>(o.tokens.size());
    timed.emplace_back(secs, shape);
  }
  for (const std::string& id : ids) engine.Abort(id, nullptr);
  std::sort(timed.begin(), timed.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  StepTimeSample s;
  s.seconds = timed[timed.size() / 2].first;
  s.shape = timed[timed.size() / 2].second;
  s.kind = "decode";
  return s;
}

struct TransferFit {
  double latency = 0, bytes_per_second = 0;
};

// Least squares seconds = latency + bytes / bandwidth.
TransferFit FitTransfer(const std::vector<std::pair<double, double>>& points) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  TransferFit f;
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  f.latency = std::max(0.0, (sy - slope * sx) / n);
  f.bytes_per_second = slope > 0 ? 1.0 / slope : 0;
  return f;
}

absl::StatusOr<Json> MeasureTransport(const std::string& name, size_t page_bytes, int64_t repeats) {
  // One page (the latency), then 1 MiB and 16 MiB of pages (the bandwidth).
  const size_t mib = (size_t{1} << 20) / page_bytes + 1;
  const std::vector<size_t> page_counts = {1, mib, 16 * mib};
  const size_t pool = page_counts.back() * page_bytes;
  std::vector<uint8_t> src(pool), dst(pool, 0);
  for (size_t i = 0; i < pool; ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  KvTransportOptions o;
  o.layout = "profile=1";
  PD_ASSIGN_OR_RETURN(auto sender, CreateKvTransport(name, o));
  PD_ASSIGN_OR_RETURN(auto receiver, CreateKvTransport(name, o));
  PD_RETURN_IF_ERROR(sender->RegisterPool(src.data(), pool));
  PD_RETURN_IF_ERROR(receiver->RegisterPool(dst.data(), pool));
  std::vector<std::pair<double, double>> points;
  Json list = Json::array();
  uint64_t tag = 1;
  for (size_t pages : page_counts) {
    double best = 0;
    for (int64_t r = 0; r < repeats; ++r) {
      PD_ASSIGN_OR_RETURN(KvTransferRun run,
                          TimeKvTransfer(*sender, *receiver, tag++, pages * page_bytes, page_bytes, 64));
      best = r == 0 ? run.seconds : std::min(best, run.seconds);
    }
    points.emplace_back(static_cast<double>(pages * page_bytes), best);
    list.push_back({{"pages", pages}, {"bytes", pages * page_bytes}, {"seconds", best}});
  }
  TransferFit fit = FitTransfer(points);
  if (fit.bytes_per_second <= 0) {  // Noise swamped the slope: the largest transfer's rate.
    fit.bytes_per_second = points.back().first / points.back().second;
  }
  return Json{{"name", name},
              {"page_bytes", page_bytes},
              {"latency_seconds", fit.latency},
              {"bytes_per_second", fit.bytes_per_second},
              {"points", list}};
}

}  // namespace

int ProfileCommand(int argc, char** argv) {
  const char* cmd = "profile";
  std::string model, random_weights, out, transport = "tcp";
  std::string chunks = "16,64,256,512", contexts = "0,256,1024", batches = "1,4,16,32",
              decode_contexts = "64,512";
  int64_t repeats = 3, decode_steps = 9;
  double roofline_gbps = 0, roofline_tflops = 0, roofline_weight_bytes = 2, roofline_kv_bytes = 2,
         transport_gbps = 25, transport_latency_us = 20;
  EngineFlags ef;
  FlagSet flags("profile",
                "Measures this machine's engine steps and KV transfers for the capacity planner "
                "and fits its step cost model (or computes one from a roofline).");
  flags.String("model", &model, "model directory (with --roofline-*: only its config.json is read)");
  flags.String("random-weights", &random_weights,
               "instead of --model: synthetic bf16 weights of this shape (a name or a config.json)");
  flags.String("out", &out, "where to write the profile (JSON); default: standard output");
  flags.String("chunks", &chunks, "prefill chunk sizes to time, comma-separated");
  flags.String("contexts", &contexts, "cached prefix lengths before each prefill chunk");
  flags.String("batches", &batches, "decode batch sizes to time");
  flags.String("decode-contexts", &decode_contexts, "prompt lengths before the decode steps");
  flags.Int("repeats", &repeats, "prefill chunks and transfers timed per point (the fastest kept)");
  flags.Int("decode-steps", &decode_steps, "decode steps timed per point (the median kept)");
  flags.String("transport", &transport, "KV transport to time: tcp, ucx or local");
  flags.Double("roofline-gbps", &roofline_gbps,
               "with --roofline-tflops: no measurement; a step cost from this memory bandwidth (GB/s)");
  flags.Double("roofline-tflops", &roofline_tflops, "the dense bf16 TFLOP/s of that hardware");
  flags.Double("roofline-weight-bytes", &roofline_weight_bytes, "bytes per weight (2: bf16, 1: fp8)");
  flags.Double("roofline-kv-bytes", &roofline_kv_bytes, "bytes per KV element (2: bf16)");
  flags.Double("roofline-transport-gbps", &transport_gbps, "the KV transfer's bandwidth (GB/s)");
  flags.Double("roofline-transport-latency-us", &transport_latency_us, "and its latency (us)");
  ef.Register(flags, /*speculative=*/false);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  auto usage = [&](const std::string& m) {
    return ReportError(cmd, absl::InvalidArgumentError(m), kExitUsage);
  };
  if (model.empty() == random_weights.empty()) return usage("give one of --model and --random-weights");
  const bool roofline = roofline_gbps > 0 || roofline_tflops > 0;
  if (roofline && !(roofline_gbps > 0 && roofline_tflops > 0)) {
    return usage("--roofline-gbps and --roofline-tflops: give both, > 0");
  }
  if (roofline && !(roofline_weight_bytes > 0 && roofline_kv_bytes > 0 && transport_gbps > 0 &&
                    transport_latency_us >= 0)) {
    return usage("--roofline-weight-bytes, --roofline-kv-bytes, --roofline-transport-gbps: must be > 0");
  }
  if (repeats < 1 || decode_steps < 1) return usage("--repeats, --decode-steps: must be >= 1");
  if (transport != "tcp" && transport != "ucx" && transport != "local") {
    return usage("--transport: must be tcp, ucx or local");
  }
  auto chunk_list = ParseCounts(chunks, "--chunks");
  auto context_list = ParseCounts(contexts, "--contexts");
  auto batch_list = ParseCounts(batches, "--batches");
  auto decode_context_list = ParseCounts(decode_contexts, "--decode-contexts");
  for (const auto* l : {&chunk_list, &context_list, &batch_list, &decode_context_list}) {
    if (!l->ok()) return ReportError(cmd, l->status(), kExitUsage);
  }
  for (int64_t n : *chunk_list) {
    if (n < 2) return usage("--chunks: a prefill chunk has >= 2 tokens (1 is a decode row)");
  }
  for (int64_t b : *batch_list) {
    if (b < 1) return usage("--batches: must be >= 1");
  }
  const std::string name = model.empty() ? random_weights : BaseName(model);

  Json j;
  j["format"] = "pdserve-profile-v1";
  if (roofline) {
    auto config = ModelShape(model.empty() ? random_weights : model);
    if (!config.ok()) return ReportError(cmd, config.status(), kExitUsage);
    const ModelConfig& c = *config;
    const double bw = roofline_gbps * 1e9, flops = roofline_tflops * 1e12;
    const double params = static_cast<double>(c.NumParameters());
    StepTimeModel m;
    m.a = params * roofline_weight_bytes / bw;                // The weights, read once per step.
    m.b = 2 * params / flops;                                 // A multiply-add per weight per token.
    m.c = 4.0 * c.num_layers * c.num_heads * c.head_dim / flops;  // QK^T and PV per pair.
    m.d = 0;
    m.e = 2.0 * c.num_layers * c.num_kv_heads * c.head_dim * roofline_kv_bytes / bw;  // K and V read.
    j["modelled"] = true;
    j["model"] = ModelJson(c, name);
    j["machine"] = {{"roofline_gbps", roofline_gbps}, {"roofline_tflops", roofline_tflops},
                    {"weight_bytes", roofline_weight_bytes}, {"kv_bytes", roofline_kv_bytes}};
    j["step_cost"] = FitJson(m, {});
    j["transport"] = {{"name", "roofline"},
                      {"latency_seconds", transport_latency_us * 1e-6},
                      {"bytes_per_second", transport_gbps * 1e9}};
  } else {
    EngineOptions options;
    if (absl::Status s = ef.ToOptions(&options); !s.ok()) return ReportError(cmd, s, kExitUsage);
    options.enable_prefix_caching = true;
    options.max_num_batched_tokens =
        std::max({options.max_num_batched_tokens, *std::max_element(chunk_list->begin(), chunk_list->end()),
                  *std::max_element(batch_list->begin(), batch_list->end())});
    options.max_num_seqs = std::max(options.max_num_seqs, *std::max_element(batch_list->begin(), batch_list->end()));
    std::optional<ModelConfig> shape;
    if (!random_weights.empty()) {
      auto c = ModelShape(random_weights);
      if (!c.ok()) return ReportError(cmd, c.status(), kExitUsage);
      shape = *c;
    }
    auto engine_or = shape ? LLMEngine::CreateSynthetic(*shape, options, /*seed=*/1)
                           : LLMEngine::Create(model, options);
    if (!engine_or.ok()) return ReportError(cmd, engine_or.status());
    LLMEngine& engine = **engine_or;
    const int64_t max_len = engine.max_model_len();
    SplitMix64 rng(7);
    int64_t next_id = 0;
    std::vector<StepTimeSample> samples;
    // A first request touches the buffers and pages: not timed.
    if (absl::Status s = engine.AddRequest("warm", RandomTokens(rng, 8, engine.config().vocab_size), Greedy(2));
        !s.ok() || !RunToEnd(engine).ok()) {
      return ReportError(cmd, s.ok() ? absl::InternalError("warm-up failed") : s);
    }
    for (int64_t context : *context_list) {
      for (int64_t n : *chunk_list) {
        if (context + n + 1 > max_len) continue;
        auto s = MeasurePrefill(engine, rng, n, context, repeats, &next_id);
        if (!s.ok()) return ReportError(cmd, s.status());
        samples.push_back(*s);
      }
    }
    for (int64_t context : *decode_context_list) {
      for (int64_t b : *batch_list) {
        // Room for the rows that decode while the batch's other prompts are prefilled, too.
        if (context + decode_steps + 5 + b * context / options.max_num_batched_tokens + 1 > max_len) continue;
        auto s = MeasureDecode(engine, rng, b, context, decode_steps, &next_id);
        if (!s.ok()) return ReportError(cmd, s.status());
        samples.push_back(*s);
      }
    }
    auto fit = FitStepTime(samples);
    if (!fit.ok()) {
      return ReportError(cmd, absl::InvalidArgumentError(Str(fit.status().message(),
                                                             " (more --chunks, --contexts or --batches within the model's ",
                                                             max_len, "-token context)")),
                         kExitUsage);
    }
    j["modelled"] = false;
    j["model"] = ModelJson(engine.config(), name);
    j["machine"] = {{"device", options.backend},
                    {"threads", ef.threads > 0 ? ef.threads : static_cast<int64_t>(std::thread::hardware_concurrency())},
                    {"numerics", engine.numerics()}};
    j["engine"] = {{"block_size", engine.kv_spec().block_size},
                   {"max_model_len", max_len},
                   {"kv_bytes_per_token", engine.kv_spec().BytesPerToken()}};
    j["step_cost"] = FitJson(*fit, samples);
    Json points = Json::array();
    for (const StepTimeSample& s : samples) {
      points.push_back({{"kind", s.kind},
                        {"tokens", s.shape.tokens},
                        {"sequences", s.shape.sequences},
                        {"prefill_pairs", s.shape.prefill_pairs},
                        {"decode_context", s.shape.decode_context},
                        {"seconds", s.seconds},
                        {"predicted_seconds", fit->Predict(s.shape)}});
    }
    j["points"] = points;
    auto t = MeasureTransport(transport, engine.kv_spec().PageBytes(), repeats);
    if (!t.ok()) return ReportError(cmd, t.status());
    j["transport"] = *t;
  }
  const std::string text = j.dump(2) + "\n";
  if (out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream f(out);
    f << text;
    if (!f.good()) return ReportError(cmd, absl::InvalidArgumentError(Str("--out: cannot write '", out, "'")), kExitUsage);
    std::fprintf(stderr, "profile: wrote %s (step cost max relative error %s)\n", out.c_str(),
                 j["step_cost"].contains("max_relative_error")
                     ? Str(j["step_cost"]["max_relative_error"].get<double>()).c_str()
                     : "n/a: modelled");
  }
  return kExitOk;
}

}  // namespace pdserve::cli
