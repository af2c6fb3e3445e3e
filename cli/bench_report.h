// What `pdserve bench` (a real cluster) and `pdserve simulate` / `plan` (the simulated one) share,
// so the two compare line by line: the workload generator's flags, and the figures of a serving
// run (loadgen/load_client's LoadSummary), printed and named the same way.
#ifndef PDSERVE_CLI_BENCH_REPORT_H_
#define PDSERVE_CLI_BENCH_REPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loadgen/load_client.h"
#include "loadgen/workload.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {

// The generated workload's shape: --num-prompts, --input-len, --output-len, --range-ratio,
// --groups, --prefix-len, --max-prompt-len, --burstiness (not --workload or the rate: each
// command words and parses those its own way).
void RegisterWorkloadShapeFlags(FlagSet& flags, WorkloadOptions* w);

// "inf", the number, or "trace" for NaN (a trace's own arrival times).
std::string RateText(double rate);
// A --request-rate value: requests per second > 0, or "inf" (all at once).
absl::StatusOr<double> ParseRate(absl::string_view text, const char* flag);

// Every figure by name: the json keys and the csv columns (counts as integers, the rate as a
// number or "inf").
std::vector<std::pair<std::string, nlohmann::json>> SummaryFigures(double rate, const LoadSummary& s);

// The block `vllm bench serve` prints: the header and the figures; the caller adds its own lines,
// then PrintSummaryEnd (the first error, if any, and the closing rule).
void PrintSummaryFigures(const std::string& label, double rate, const LoadSummary& s, const Slo& slo);
void PrintSummaryEnd(const LoadSummary& s);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_BENCH_REPORT_H_
