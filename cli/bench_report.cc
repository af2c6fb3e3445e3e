#include "cli/bench_report.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/numbers.h"

#include "common/base/strings.h"

namespace pdserve::cli {

void RegisterWorkloadShapeFlags(FlagSet& flags, WorkloadOptions* w) {
  flags.Int("num-prompts", &w->num_prompts, "requests to send");
  flags.Int("input-len", &w->input_len,
            "prompt tokens (shared-prefix: the user part; synthetic-chat: median user turn)");
  flags.Int("output-len", &w->output_len,
            "tokens generated per request, EOS ignored (synthetic-chat: median reply)");
  flags.Double("range-ratio", &w->range_ratio,
               "random, shared-prefix: lengths uniform in len x [1 - r, 1 + r]");
  flags.Int("groups", &w->groups, "shared-prefix: distinct system prompts");
  flags.Int("prefix-len", &w->prefix_len, "shared-prefix: system prompt tokens");
  flags.Int("max-prompt-len", &w->max_prompt_len,
            "synthetic-chat: longest prompt (default 16 x input-len, within the model's context)");
  flags.Double("burstiness", &w->burstiness,
               "shape of the Gamma arrival gaps: 1 Poisson, < 1 burstier, > 1 more regular");
}

std::string RateText(double rate) { return std::isnan(rate) ? "trace" : std::isinf(rate) ? "inf" : Str(rate); }

absl::StatusOr<double> ParseRate(absl::string_view text, const char* flag) {
  double rate = 0;
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (!absl::SimpleAtod(text, &rate) || !(rate > 0) || std::isinf(rate)) {
    return absl::InvalidArgumentError(
        Str(flag, ": '", text, "' is not a positive number of requests per second or inf"));
  }
  return rate;
}

std::vector<std::pair<std::string, nlohmann::json>> SummaryFigures(double rate, const LoadSummary& s) {
  std::vector<std::pair<std::string, nlohmann::json>> f = {
      {"request_rate", std::isinf(rate) ? nlohmann::json("inf") : nlohmann::json(rate)},
      {"ok", s.ok},
      {"failed", s.failed},
      {"duration_s", s.duration_seconds},
      {"prompt_tokens", s.prompt_tokens},
      {"completion_tokens", s.completion_tokens},
      {"hit_rate", s.hit_rate},
      {"requests_per_second", s.requests_per_second},
      {"output_tokens_per_second", s.output_tokens_per_second},
      {"total_tokens_per_second", s.total_tokens_per_second},
      {"goodput", s.goodput},
      {"good", s.good}};
  const std::pair<const char*, const Distribution*> dists[] = {
      {"ttft", &s.ttft}, {"tpot", &s.tpot}, {"itl", &s.itl}, {"e2el", &s.e2e}};
  for (const auto& [name, d] : dists) {
    f.emplace_back(Str(name, "_mean_ms"), d->mean * 1e3);
    f.emplace_back(Str(name, "_p50_ms"), d->p50 * 1e3);
    f.emplace_back(Str(name, "_p90_ms"), d->p90 * 1e3);
    f.emplace_back(Str(name, "_p99_ms"), d->p99 * 1e3);
  }
  return f;
}

void PrintSummaryFigures(const std::string& label, double rate, const LoadSummary& s, const Slo& slo) {
  std::printf("============ Serving Benchmark Result: %s, rate %s ============\n", label.c_str(),
              RateText(rate).c_str());
  std::printf("%-40s %lld\n", "Successful requests:", static_cast<long long>(s.ok));
  std::printf("%-40s %lld\n", "Failed requests:", static_cast<long long>(s.failed));
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", s.duration_seconds);
  std::printf("%-40s %lld\n", "Total input tokens:", static_cast<long long>(s.prompt_tokens));
  std::printf("%-40s %lld\n", "Total generated tokens:", static_cast<long long>(s.completion_tokens));
  std::printf("%-40s %.3f\n", "Prefix cache hit rate:", s.hit_rate);
  std::printf("%-40s %.2f\n", "Request throughput (req/s):", s.requests_per_second);
  if (slo.any()) std::printf("%-40s %.2f\n", "Request goodput (req/s):", s.goodput);
  std::printf("%-40s %.2f\n", "Output token throughput (tok/s):", s.output_tokens_per_second);
  std::printf("%-40s %.2f\n", "Total token throughput (tok/s):", s.total_tokens_per_second);
  const std::pair<const char*, const Distribution*> dists[] = {
      {"Time to First Token", &s.ttft}, {"Time per Output Token (excl. 1st token)", &s.tpot},
      {"Inter-token Latency", &s.itl}, {"End-to-end Latency", &s.e2e}};
  for (const auto& [title, d] : dists) {
    std::printf("---------------%s---------------\n", title);
    std::printf("%-40s %.2f\n", "Mean (ms):", d->mean * 1e3);
    std::printf("%-40s %.2f\n", "P50 (ms):", d->p50 * 1e3);
    std::printf("%-40s %.2f\n", "P90 (ms):", d->p90 * 1e3);
    std::printf("%-40s %.2f\n", "P99 (ms):", d->p99 * 1e3);
  }
}

void PrintSummaryEnd(const LoadSummary& s) {
  if (!s.first_error.empty()) std::printf("%-40s %s\n", "First error:", s.first_error.c_str());
  std::printf("==================================================\n");
}

}  // namespace pdserve::cli
