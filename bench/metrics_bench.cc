// Cost of the metrics on the hot paths: what a decode worker pays per token (a histogram
// observation and a counter increment) and per scrape (collect + render).
//   build/bench/metrics_bench
#include <benchmark/benchmark.h>

#include "common/metrics/buckets.h"
#include "common/metrics/metrics.h"
#include "common/metrics/request_metrics.h"

namespace pdserve::metrics {
namespace {

void BM_CounterInc(benchmark::State& state) {
  static Registry r;
  Counter& c = r.AddCounter("pdserve_bench_total", "b", {}).With({});
  for (auto _ : state) c.Inc();
}
BENCHMARK(BM_CounterInc)->Threads(1)->Threads(2);

void BM_HistogramObserve(benchmark::State& state) {
  static Registry r;
  Histogram& h = r.AddHistogram("pdserve_bench_seconds", "b", {}, TokenLatencyBuckets()).With({});
  double v = 0.0001;
  for (auto _ : state) {
    h.Observe(v);
    v = v < 10 ? v * 1.7 : 0.0001;
  }
}
BENCHMARK(BM_HistogramObserve)->Threads(1)->Threads(2);

// What the decode worker does per generated token.
void BM_NextToken(benchmark::State& state) {
  static Registry r;
  static RequestMetrics m(&r, "model", "decode");
  for (auto _ : state) m.NextToken(0.004);
}
BENCHMARK(BM_NextToken);

// A scrape of a process with the router's, a prefill's and a decode worker's series.
void BM_RenderServe(benchmark::State& state) {
  Registry r;
  for (const char* role : {"router", "prefill", "decode"}) {
    RequestMetrics m(&r, "model", role);
    m.FirstToken(0.05, 100);
    m.NextToken(0.004);
    m.Finished({"length", 2, 0.1, 0.05, true, 0.001, 0.05, 0.004});
    for (const char* g : {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"}) {
      r.AddGauge(std::string("pdserve_") + g, "g", {"model_name", "role"}).With({"model", role}).Set(1);
    }
  }
  size_t bytes = 0;
  for (auto _ : state) bytes = r.Render().size();
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderServe);

}  // namespace
}  // namespace pdserve::metrics

BENCHMARK_MAIN();
