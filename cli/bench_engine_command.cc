// pdserve bench-engine: prefill and decode throughput of the engine alone, judged against this
// machine's memory read bandwidth and sgemm rate measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "bench/machine_limits.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/rng.h"
#include "common/base/strings.h"
#include "common/base/thread_pool.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "common/base/file_util.h"
#include "common/engine/llm_engine.h"
#include "common/model/gguf_model.h"
#include "common/model/lora_registry.h"
#include "common/model/model_shapes.h"
#include "common/model/random_lora.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/linear_bf16.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int BenchEngineCommand(int argc, char** argv) {
  const char* cmd = "bench-engine";
  std::string model, random_weights, format = "text", prompts = "random";
  int64_t batch = 1, input_len = 128, output_len = 64, sgemm_n = 1536, prefill_rounds = 3, requests = 0;
  int64_t bw_every = 0, lora_adapters = 0, lora_rank = 16;
  double bw_gib = 2.0, temperature = 0;
  EngineFlags ef;
  FlagSet flags("bench-engine", "Measures engine prefill/decode throughput against this "
                                "machine's read bandwidth and sgemm rate.");
  flags.String("model", &model, "model directory");
  static const std::string random_help =
      Str("instead of --model: synthetic bf16 weights of this shape (",
          absl::StrJoin(ModelShapeNames(), ", "),
          ", or a config.json), made in the device's memory with --device cuda");
  flags.String("random-weights", &random_weights, random_help.c_str());
  flags.Int("batch", &batch, "concurrent sequences");
  flags.Int("input-len", &input_len, "prompt tokens per sequence");
  flags.Int("output-len", &output_len, "generated tokens per sequence");
  flags.Int("requests", &requests,
            "requests decoded in all (0: --batch): more than --batch queue for the batch's slots, "
            "each starting as one finishes, as a server's continuous batching runs them (decode "
            "tok/s then counts every token generated, the queued prompts' prefills in the time; "
            "the read-bandwidth figures, which assume a static batch, are left out)");
  flags.Int("prefill-rounds", &prefill_rounds,
            "prefills of --batch fresh prompts; the fastest is reported (the first is also reported: "
            "it touches the buffers and KV pages for the first time)");
  flags.String("prompts", &prompts,
               "random (uniform token ids), repeat (a random 32-token phrase repeated to "
               "--input-len), or a file of prompts, one per line as comma-separated token ids "
               "(--input-len is then each line's own; the lines are used in turn)");
  flags.Double("temperature", &temperature,
               "decode sampling temperature (0 greedy; otherwise seeded per sequence)");
  flags.String("format", &format, "text or json");
  flags.Double("bw-gib", &bw_gib, "buffer for the read-bandwidth measurement (>> last-level cache)");
  flags.Int("sgemm-n", &sgemm_n, "matrix size for the sgemm-rate measurement");
  flags.Int("bw-every", &bw_every,
            "also read a buffer (--bw-gib, at most 0.5) after every N decode steps (0: never), "
            "and report decode against these reads, each window of N steps against the read "
            "after it: on a shared host the memory's rate moves within seconds (the reads' time "
            "is not counted as decode time)");
  flags.Int("lora-adapters", &lora_adapters,
            "run the requests with N random LoRA adapters (all seven projections, made in a "
            "temporary directory and loaded from it, the loads timed): request i with adapter "
            "i mod N (0: the base model)");
  flags.Int("lora-rank", &lora_rank, "--lora-adapters: their rank");
  ef.Register(flags);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (model.empty() == random_weights.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("give one of --model and --random-weights"),
                       kExitUsage);
  }
  std::optional<ModelConfig> shape;
  if (!random_weights.empty()) {
    auto c = ModelShape(random_weights);
    if (!c.ok()) {
      return ReportError(cmd, absl::InvalidArgumentError(Str("--random-weights: ", c.status().message())),
                         kExitUsage);
    }
    shape = *c;
  }
  std::vector<std::vector<int32_t>> prompt_lines;
  if (prompts != "random" && prompts != "repeat") {
    auto text = ReadFileToString(prompts);
    if (!text.ok()) {
      return ReportError(cmd, absl::InvalidArgumentError(Str("--prompts: '", prompts,
                                                             "' is not random, repeat or a file")),
                         kExitUsage);
    }
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
      std::vector<int32_t> ids;
      if (absl::Status s = ParseIntList(std::string(line), "--prompts", &ids); !s.ok()) {
        return ReportError(cmd, s, kExitUsage);
      }
      if (!prompt_lines.empty() && ids.size() != prompt_lines[0].size()) {
        return ReportError(cmd, absl::InvalidArgumentError(Str(
                                    "--prompts: line ", prompt_lines.size() + 1, " holds ", ids.size(),
                                    " tokens, the first ", prompt_lines[0].size(), "; give prompts of one length")),
                           kExitUsage);
      }
      prompt_lines.push_back(std::move(ids));
    }
    if (prompt_lines.empty()) {
      return ReportError(cmd, absl::InvalidArgumentError("--prompts: the file holds no prompt"), kExitUsage);
    }
    input_len = static_cast<int64_t>(prompt_lines[0].size());
  }
  if (!(temperature >= 0)) {
    return ReportError(cmd, absl::InvalidArgumentError("--temperature: must be >= 0"), kExitUsage);
  }
  if (batch < 1 || input_len < 1 || output_len < 2 || bw_gib <= 0 || sgemm_n < 64 ||
      prefill_rounds < 1) {
    return ReportError(cmd, absl::InvalidArgumentError(
                                "--batch, --input-len, --prefill-rounds >= 1, --output-len >= 2, "
                                "--bw-gib > 0, --sgemm-n >= 64"), kExitUsage);
  }
  if (bw_every < 0) {
    return ReportError(cmd, absl::InvalidArgumentError("--bw-every: must be >= 0"), kExitUsage);
  }
  if (requests == 0) requests = batch;
  if (requests < batch) {
    return ReportError(cmd, absl::InvalidArgumentError(Str("--requests: ", requests, " is fewer than --batch (",
                                                           batch, "); give 0 or at least --batch")),
                       kExitUsage);
  }
  const bool queued = requests > batch;
  if (queued && bw_every > 0) {
    return ReportError(cmd, absl::InvalidArgumentError(
                                "--bw-every: decode's bytes are counted for a static batch; give "
                                "--requests 0 (or --batch) with it"), kExitUsage);
  }
  EngineOptions options;
  if (absl::Status s = ef.ToOptions(&options); !s.ok()) return ReportError(cmd, s, kExitUsage);
  // One prefill step for the whole batch, and room for every sequence.
  options.max_num_batched_tokens = std::max(options.max_num_batched_tokens, batch * input_len);
  // --requests above --batch: the batch's slots are all there is, as a server's max-num-seqs.
  options.max_num_seqs = queued ? batch : std::max(options.max_num_seqs, batch);
  options.enable_prefix_caching = false;  // Random prompts; measure compute, not reuse.
  // --lora-adapters: written to a temporary directory, then loaded as a server loads them.
  double lora_load_s = 0;
  size_t lora_bytes = 0;
  if (lora_adapters < 0 || lora_rank < 1 || lora_rank > kMaxLoraRankLimit) {
    return ReportError(cmd, absl::InvalidArgumentError(
                                Str("--lora-adapters must be >= 0 and --lora-rank in [1, ", kMaxLoraRankLimit, "]")),
                       kExitUsage);
  }
  if (lora_adapters > 0) {
    auto config = shape ? absl::StatusOr<ModelConfig>(*shape) : LoadModelConfig(model);
    if (!config.ok()) return ReportError(cmd, config.status());
    std::string dir = (std::filesystem::temp_directory_path() / "pdserve_bench_lora_XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) return ReportError(cmd, absl::InternalError("mkdtemp failed"));
    auto registry = std::make_shared<LoraRegistry>(*config, LoraRegistryOptions{.max_rank = lora_rank});
    for (int64_t i = 0; i < lora_adapters; ++i) {
      RandomLoraSpec spec;
      spec.rank = lora_rank;
      spec.seed = static_cast<uint64_t>(i);
      const std::string path = JoinPath(dir, Str("lora", i));
      absl::Status s = WriteRandomLora(spec, *config, path);
      const auto t = Clock::now();
      if (s.ok()) s = registry->Add(Str("lora", i), path);
      lora_load_s += SecondsSince(t);
      if (!s.ok()) {
        std::filesystem::remove_all(dir);
        return ReportError(cmd, s);
      }
    }
    lora_bytes = (*registry->Acquire("lora0"))->bytes();
    std::filesystem::remove_all(dir);  // Loaded: the files are no longer read.
    options.lora = std::move(registry);
  }
  auto engine_or = shape ? LLMEngine::CreateSynthetic(*shape, options, /*seed=*/1)
                         : LLMEngine::Create(model, options);
  if (!engine_or.ok()) return ReportError(cmd, engine_or.status());
  LLMEngine& engine = **engine_or;
  const ModelConfig& c = engine.config();
  const int threads = ef.threads > 0 ? static_cast<int>(ef.threads)
                                     : static_cast<int>(std::thread::hardware_concurrency());

  // Each prefill round adds `batch` fresh prompts and runs the one step that prefills them; the
  // earlier rounds' requests end there (max_tokens 1), the last round's decode on.
  SplitMix64 rng(1);
  // Request `index`'s prompt and sampling (the prefill rounds' first, then the queued ones).
  const auto add_request = [&](int64_t index, int32_t max_tokens) {
    std::vector<int32_t> prompt(input_len);
    const size_t period = prompts == "repeat" ? 32 : prompt.size();
    for (size_t i = 0; i < prompt.size(); ++i) {
      prompt[i] = i < period ? static_cast<int32_t>(rng.Next() % c.vocab_size) : prompt[i - period];
    }
    if (!prompt_lines.empty()) prompt = prompt_lines[static_cast<size_t>(index) % prompt_lines.size()];
    SamplingParams p;
    p.temperature = static_cast<float>(temperature);
    p.seed = static_cast<uint64_t>(index);
    p.ignore_eos = true;
    p.max_tokens = max_tokens;
    if (lora_adapters > 0) p.lora_name = Str("lora", index % lora_adapters);
    return engine.AddRequest(Str("bench-", index), std::move(prompt), p);
  };
  std::vector<RequestOutput> outs;
  double prefill_s = 0, prefill_first_s = 0;
  for (int64_t round = 0; round < prefill_rounds; ++round) {
    const bool last = round == prefill_rounds - 1;
    for (int64_t b = 0; b < batch; ++b) {
      if (absl::Status s = add_request(round * batch + b, last ? static_cast<int32_t>(output_len) : 1);
          !s.ok()) {
        return ReportError(cmd, s);
      }
    }
    outs.clear();
    const auto t0 = Clock::now();
    if (absl::Status s = engine.Step(&outs); !s.ok()) return ReportError(cmd, s);
    const double secs = SecondsSince(t0);
    if (static_cast<int64_t>(outs.size()) != batch || engine.HasUnfinished() != last) {
      return ReportError(cmd, absl::InternalError("prefill did not finish in one step"));
    }
    prefill_s = round == 0 ? secs : std::min(prefill_s, secs);
    if (round == 0) prefill_first_s = secs;
  }
  const EngineStats before = engine.Stats();  // After the prefills, before decode.
  // Each step's time, for the median step beside the mean: on a shared machine a few steps the
  // host took away move the mean, not the median.
  std::vector<double> step_s_each;
  int64_t issued = batch;  // Of --requests: the last prefill round's batch is decoding.
  // --bw-every: the reads' own pool and buffer, and each read's rate (the faster of a plain and a
  // prefetching pass); the pauses let the other pool's threads stop spinning first.
  std::optional<ThreadPool> probe_pool;
  std::optional<bench::ReadProbe> probe;
  if (bw_every > 0) {
    probe_pool.emplace(threads);
    const size_t bytes = static_cast<size_t>(bw_gib * (1ull << 30));
    probe.emplace(&*probe_pool, std::min(bytes, size_t{512} << 20));
  }
  std::vector<double> reads_between;
  // And a read of the weights' own memory (bench::ReadRegions), where the runner reads them.
  const std::vector<absl::Span<const std::byte>> weight_memory = engine.decode_weight_memory();
  std::vector<double> weight_reads_between;
  double probe_s = 0;
  auto t0 = Clock::now();
  while (engine.HasUnfinished()) {
    if (probe && !step_s_each.empty() && step_s_each.size() % bw_every == 0) {
      const auto tp = Clock::now();
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      const bool plain_first = reads_between.size() % 2 == 0;
      const double a = probe->Pass(!plain_first), b = probe->Pass(plain_first);
      reads_between.push_back(std::max(a, b));
      if (!weight_memory.empty()) {
        const double wa = bench::ReadRegions(&*probe_pool, weight_memory, !plain_first);
        const double wb = bench::ReadRegions(&*probe_pool, weight_memory, plain_first);
        weight_reads_between.push_back(std::max(wa, wb));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      probe_s += SecondsSince(tp);
    }
    outs.clear();
    const auto ts = Clock::now();
    if (absl::Status s = engine.Step(&outs); !s.ok()) return ReportError(cmd, s);
    step_s_each.push_back(SecondsSince(ts));
    for (const RequestOutput& o : outs) {  // A slot freed: the next queued request takes it.
      if (!o.finished || issued >= requests) continue;
      if (absl::Status s = add_request((prefill_rounds - 1) * batch + issued, static_cast<int32_t>(output_len));
          !s.ok()) {
        return ReportError(cmd, s);
      }
      ++issued;
    }
  }
  const int64_t decode_steps = static_cast<int64_t>(step_s_each.size());
  const double decode_s = SecondsSince(t0) - probe_s;
  const EngineStats after = engine.Stats();
  const double step_s = after.step_seconds - before.step_seconds;
  const double forward_share = (after.forward_seconds - before.forward_seconds) / step_s;
  const double sample_share = (after.sample_seconds - before.sample_seconds) / step_s;
  const double schedule_share = (after.schedule_seconds - before.schedule_seconds) / step_s;
  // Each phase's share of the forward passes' phase time: the prefill rounds, then decode.
  const auto phase_shares = [](const ForwardPhaseSeconds& from, const ForwardPhaseSeconds& to) {
    nlohmann::ordered_json shares = nlohmann::ordered_json::object();
    double total = 0;
    for (int i = 0; i < kNumForwardPhases; ++i) total += to[i] - from[i];
    if (total <= 0) return shares;  // A backend that does not time its phases.
    for (int i = 0; i < kNumForwardPhases; ++i) {
      shares[std::string(ForwardPhaseName(static_cast<ForwardPhase>(i)))] = (to[i] - from[i]) / total;
    }
    return shares;
  };
  const nlohmann::ordered_json prefill_phases =
      phase_shares(ForwardPhaseSeconds{}, before.forward_phase_seconds);
  const nlohmann::ordered_json decode_phases =
      phase_shares(before.forward_phase_seconds, after.forward_phase_seconds);

  // What the runs moved and computed. Computing in bf16 from a checkpoint in another dtype reads
  // the runner's bf16 copies.
  const bool bf16_compute = engine.compute_dtype() == ComputeDType::kBF16;
  double weight_bytes = static_cast<double>(engine.weights().DecodeWeightBytes());
  if (bf16_compute) weight_bytes *= 2.0 / static_cast<double>(DTypeSize(engine.weights().dtype()));
  const double kv_token_bytes = static_cast<double>(engine.kv_spec().BytesPerToken());
  // Decode step s (from 1) reads the weights and every sequence's whole context of K and V.
  const auto step_bytes = [&](int64_t s) {
    return weight_bytes + batch * (input_len + s) * kv_token_bytes;
  };
  double decode_bytes = 0;
  for (int64_t s = 1; s <= decode_steps; ++s) decode_bytes += step_bytes(s);
  const double proj_params = static_cast<double>(c.NumParameters() - c.vocab_size * c.hidden_size *
                                                 (c.tie_word_embeddings ? 1 : 2));
  const double attn_flops = 4.0 * c.head_dim * c.num_heads * c.num_layers * batch *
                            (input_len * (input_len + 1) / 2.0);
  const double prefill_flops = 2.0 * proj_params * batch * input_len + attn_flops +
                               2.0 * batch * c.vocab_size * c.hidden_size;
  // Tokens, not steps: a step that accepted speculative drafts produced more than one.
  const int64_t decode_tokens = after.generated_tokens - before.generated_tokens;
  const double decode_tok_s = static_cast<double>(decode_tokens) / decode_s;
  const double prefill_tok_s = batch * input_len / prefill_s;
  const double effective_bw = decode_bytes / decode_s;
  std::vector<double> step_bw(decode_steps);  // Each step's bytes over its time.
  for (int64_t s = 1; s <= decode_steps; ++s) {
    step_bw[s - 1] = step_bytes(s) / step_s_each[s - 1];
  }
  std::vector<double> sorted_steps = step_s_each;
  std::sort(sorted_steps.begin(), sorted_steps.end());
  std::sort(step_bw.begin(), step_bw.end());
  const double median_step_s = sorted_steps[decode_steps / 2];
  const double median_bw = step_bw[decode_steps / 2];
  // --bw-every: window w (steps [w N, w N + N)) against the read that followed it.
  // Each window's rate over a read after it, and those ratios and reads sorted.
  const auto windows_over = [&](const std::vector<double>& reads, std::vector<double>* ratios,
                                std::vector<double>* sorted) {
    for (size_t w = 0; w < reads.size(); ++w) {
      double bytes = 0, secs = 0;
      const int64_t first = static_cast<int64_t>(w) * bw_every + 1;
      for (int64_t s = first; s < first + bw_every; ++s) {
        bytes += step_bytes(s);
        secs += step_s_each[s - 1];
      }
      ratios->push_back(bytes / secs / reads[w]);
    }
    *sorted = reads;
    std::sort(ratios->begin(), ratios->end());
    std::sort(sorted->begin(), sorted->end());
  };
  std::vector<double> window_ratios, reads_sorted, weight_ratios, weight_reads_sorted;
  windows_over(reads_between, &window_ratios, &reads_sorted);
  windows_over(weight_reads_between, &weight_ratios, &weight_reads_sorted);

  ThreadPool pool(threads);
  // The reference is the faster of a plain read and one that prefetches as the linear kernel
  // does: against the plain read alone, f32 batch-1 decode reached 1.15x "the read bandwidth".
  const size_t bw_bytes = static_cast<size_t>(bw_gib * (1ull << 30));
  const double read_bw_plain = bench::ReadBandwidth(&pool, bw_bytes, 3, /*prefetch=*/false);
  const double read_bw_prefetch = bench::ReadBandwidth(&pool, bw_bytes, 3, /*prefetch=*/true);
  const double read_bw = std::max(read_bw_plain, read_bw_prefetch);
  const double sgemm = bench::SgemmFlops(threads, sgemm_n, 3);
  // The instruction a prefill of this length spends its time in, and that instruction's peak.
  const bench::DotInstruction used =
      bf16_compute ? (kernels::AmxEnabled()       ? bench::DotInstruction::kAmxBf16
                      : kernels::Bf16DotEnabled() ? bench::DotInstruction::kDpBf16
                                                  : bench::DotInstruction::kFmaF32Avx2)
                   : (kernels::Avx512Enabled() && input_len * batch >= 8
                          ? bench::DotInstruction::kFmaF32Avx512
                          : bench::DotInstruction::kFmaF32Avx2);
  double peaks[bench::kNumDotInstructions];
  for (int i = 0; i < bench::kNumDotInstructions; ++i) {
    peaks[i] = bench::DotInstructionPeak(&pool, static_cast<bench::DotInstruction>(i), 10);
  }
  const double peak = peaks[static_cast<int>(used)];
  nlohmann::ordered_json j;
  j["model"] = shape ? Str("random-weights:", random_weights) : model;
  j["architecture"] = c.architecture;
  j["weights_dtype"] = std::string(DTypeName(engine.weights().dtype()));
  j["kv_dtype"] = std::string(KvDTypeName(engine.kv_spec().dtype));
  j["kv_bytes_per_token"] = engine.kv_spec().BytesPerToken();
  j["prefill_gemm"] = ef.prefill_gemm;
  j["compute_dtype"] = std::string(ComputeDTypeName(engine.compute_dtype()));
  j["threads"] = threads;
  j["batch"] = batch;
  j["input_len"] = input_len;
  j["output_len"] = output_len;
  j["prefill_rounds"] = prefill_rounds;
  j["prefill_tok_s"] = prefill_tok_s;
  j["prefill_first_tok_s"] = batch * input_len / prefill_first_s;
  j["decode_tok_s"] = decode_tok_s;
  j["prompts"] = prompts;
  j["temperature"] = temperature;
  j["decode_steps"] = decode_steps;
  j["speculative"] = std::string(SpeculativeMethodName(engine.speculative().method));
  if (engine.speculative().enabled()) {
    const int64_t drafts = after.spec_drafts - before.spec_drafts;
    const int64_t drafted = after.spec_draft_tokens - before.spec_draft_tokens;
    const int64_t accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
    j["spec_drafts"] = drafts;
    j["spec_draft_tokens"] = drafted;
    j["spec_accepted_tokens"] = accepted;
    j["spec_acceptance_rate"] = drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0;
    j["spec_mean_acceptance_length"] = drafts > 0 ? 1.0 + static_cast<double>(accepted) / drafts : 0.0;
  }
  j["requests"] = requests;
  j["decode_step_ms"] = decode_s / decode_steps * 1e3;
  j["decode_step_ms_median"] = median_step_s * 1e3;
  j["read_bw_gbs"] = read_bw / 1e9;
  j["read_bw_plain_gbs"] = read_bw_plain / 1e9;
  j["read_bw_prefetch_gbs"] = read_bw_prefetch / 1e9;
  if (!queued) {  // Bytes counted for a static batch: every step the batch's contexts, one longer.
    j["decode_bytes_per_step"] = decode_bytes / decode_steps;
    j["decode_effective_gbs"] = effective_bw / 1e9;
    j["decode_bw_ratio"] = effective_bw / read_bw;
    j["decode_bw_ratio_median_step"] = median_bw / read_bw;
    if (!window_ratios.empty()) {
      j["read_bw_between_gbs"] = reads_sorted[reads_sorted.size() / 2] / 1e9;
      j["decode_bw_ratio_between"] = window_ratios[window_ratios.size() / 2];
      j["decode_bw_windows"] = window_ratios.size();
    }
    if (!weight_ratios.empty()) {
      j["read_bw_weights_between_gbs"] = weight_reads_sorted[weight_reads_sorted.size() / 2] / 1e9;
      j["decode_bw_ratio_weights_between"] = weight_ratios[weight_ratios.size() / 2];
    }
  }
  j["prefill_gflops"] = prefill_flops / prefill_s / 1e9;
  j["sgemm_gflops"] = sgemm / 1e9;
  j["prefill_flops_ratio"] = prefill_flops / prefill_s / sgemm;
  j["prefill_instruction"] = bench::DotInstructionName(used);
  for (int i = 0; i < bench::kNumDotInstructions; ++i) {
    j[std::string(bench::DotInstructionName(static_cast<bench::DotInstruction>(i))) +
      "_peak_gflops"] = peaks[i] / 1e9;
  }
  j["prefill_peak_ratio"] = prefill_flops / prefill_s / peak;
  // Decode steps: the model's forward pass, sampling + outputs, and the scheduler's own work.
  j["decode_forward_share"] = forward_share;
  j["decode_sampling_share"] = sample_share;
  j["decode_scheduler_share"] = schedule_share;
  j["prefill_phase_shares"] = prefill_phases;
  j["decode_phase_shares"] = decode_phases;
  j["cpu"] = bench::CpuModel();
  j["lora_adapters"] = lora_adapters;
  if (lora_adapters > 0) {
    j["lora_rank"] = lora_rank;
    j["lora_adapter_bytes"] = lora_bytes;
    j["lora_load_ms"] = lora_load_s / static_cast<double>(lora_adapters) * 1e3;
  }
  if (format == "json") {
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("%s (%s weights, %s KV, %s compute), %d threads, batch %lld, %lld in / %lld out\n",
              c.architecture.c_str(), j["weights_dtype"].get<std::string>().c_str(),
              j["kv_dtype"].get<std::string>().c_str(),
              j["compute_dtype"].get<std::string>().c_str(), threads, static_cast<long long>(batch),
              static_cast<long long>(input_len), static_cast<long long>(output_len));
  std::printf("prefill: %9.1f tok/s  %7.1f GFLOP/s = %5.1f%% of sgemm (%.1f GFLOP/s)\n",
              prefill_tok_s, prefill_flops / prefill_s / 1e9, 100 * prefill_flops / prefill_s / sgemm,
              sgemm / 1e9);
  std::printf("         %5.1f%% of the %s peak (%.1f GFLOP/s)\n", 100 * prefill_flops / prefill_s / peak,
              bench::DotInstructionName(used), peak / 1e9);
  std::printf("         fastest of %lld rounds; the first ran at %.1f tok/s\n",
              static_cast<long long>(prefill_rounds), batch * input_len / prefill_first_s);
  if (queued) {
    std::printf("decode:  %9.1f tok/s  %lld requests through %lld slots, %lld steps, median step %.2f ms\n",
                decode_tok_s, static_cast<long long>(requests), static_cast<long long>(batch),
                static_cast<long long>(decode_steps), median_step_s * 1e3);
  } else {
    std::printf("decode:  %9.1f tok/s  %7.2f GB/s  = %5.1f%% of read bandwidth (%.2f GB/s)\n",
                decode_tok_s, effective_bw / 1e9, 100 * effective_bw / read_bw, read_bw / 1e9);
    std::printf("         median step %.2f ms: %.2f GB/s = %5.1f%% of read bandwidth\n",
                median_step_s * 1e3, median_bw / 1e9, 100 * median_bw / read_bw);
    if (!window_ratios.empty()) {
      std::printf("         %5.1f%% of the reads between its steps (median of %zu windows of "
                  "%lld steps; reads %.2f-%.2f GB/s, median %.2f)\n",
                  100 * window_ratios[window_ratios.size() / 2], window_ratios.size(),
                  static_cast<long long>(bw_every), reads_sorted.front() / 1e9,
                  reads_sorted.back() / 1e9, reads_sorted[reads_sorted.size() / 2] / 1e9);
    }
    if (!weight_ratios.empty()) {
      std::printf("         %5.1f%% of the reads of its own weights' memory between its steps "
                  "(reads %.2f-%.2f GB/s, median %.2f)\n",
                  100 * weight_ratios[weight_ratios.size() / 2], weight_reads_sorted.front() / 1e9,
                  weight_reads_sorted.back() / 1e9,
                  weight_reads_sorted[weight_reads_sorted.size() / 2] / 1e9);
    }
  }
  if (j.contains("spec_drafts")) {
    std::printf("speculative %s: %lld steps, acceptance rate %.3f, mean acceptance length %.2f\n",
                j["speculative"].get<std::string>().c_str(), static_cast<long long>(decode_steps),
                j["spec_acceptance_rate"].get<double>(), j["spec_mean_acceptance_length"].get<double>());
  }
  std::printf("decode step: %.1f%% forward, %.2f%% sampling, %.2f%% scheduler\n", 100 * forward_share,
              100 * sample_share, 100 * schedule_share);
  for (const auto& [name, phases] : {std::pair{"prefill", &prefill_phases},
                                     std::pair{"decode", &decode_phases}}) {
    if (phases->empty()) continue;
    std::printf("%s forward by phase:", name);
    for (const auto& [phase, share] : phases->items()) {
      if (share.get<double>() >= 0.005) std::printf(" %s %.1f%%", phase.c_str(), 100 * share.get<double>());
    }
    std::printf("\n");
  }
  return kExitOk;
}

}  // namespace pdserve::cli
