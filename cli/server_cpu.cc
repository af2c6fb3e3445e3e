#include "cli/server_cpu.h"

#include <httplib.h>

#include <cstdlib>
#include <string_view>

#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve::cli {

absl::StatusOr<std::vector<CpuEndpoint>> ParseCpuEndpoints(absl::string_view text) {
  std::vector<CpuEndpoint> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    CpuEndpoint e;
    const size_t eq = item.find('=');
    const absl::string_view address = eq == absl::string_view::npos ? item : item.substr(eq + 1);
    e.name = std::string(eq == absl::string_view::npos ? item : item.substr(0, eq));
    if (e.name.empty()) {
      return absl::InvalidArgumentError(Str("--cpu-metrics: '", item, "' has an empty name"));
    }
    PD_ASSIGN_OR_RETURN(e.address,
                        ParseHostPort(std::string_view(address.data(), address.size()), "--cpu-metrics", PortUse::kPeer));
    for (const CpuEndpoint& seen : out) {
      if (seen.name == e.name) return absl::InvalidArgumentError(Str("--cpu-metrics: '", e.name, "' is named twice"));
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) return absl::InvalidArgumentError("--cpu-metrics: no endpoint");
  return out;
}

absl::StatusOr<double> SumOfSeries(absl::string_view exposition, absl::string_view name) {
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.size() <= name.size() || line.substr(0, name.size()) != name) continue;
    if (line[name.size()] != ' ' && line[name.size()] != '{') continue;
    const size_t space = line.rfind(' ');
    const std::string value(line.substr(space + 1));
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) continue;
    sum += v;
    found = true;
  }
  if (!found) return absl::NotFoundError(Str("no ", name, " in the exposition"));
  return sum;
}

absl::StatusOr<std::map<std::string, ProcessTimes>> ScrapeProcessTimes(const std::vector<CpuEndpoint>& endpoints) {
  std::map<std::string, ProcessTimes> out;
  for (const CpuEndpoint& e : endpoints) {
    httplib::Client client(e.address.host, e.address.port);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    const httplib::Result res = client.Get("/metrics");
    if (!res || res->status != 200) {
      return absl::UnavailableError(Str("--cpu-metrics: ", e.name, " (http://", e.address.ToString(), "/metrics) did not answer: ",
                                        res ? Str("HTTP ", res->status) : httplib::to_string(res.error())));
    }
    absl::StatusOr<double> cpu = SumOfSeries(res->body, "process_cpu_seconds_total");
    if (!cpu.ok()) return absl::NotFoundError(Str("--cpu-metrics: ", e.name, ": ", cpu.status().message()));
    ProcessTimes& t = out[e.name];
    t.cpu_seconds = *cpu;
    if (absl::StatusOr<double> step = SumOfSeries(res->body, "pdserve_engine_step_seconds_total"); step.ok()) {
      t.engine_step_seconds = *step;
    }
  }
  return out;
}

}  // namespace pdserve::cli
