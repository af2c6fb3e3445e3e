#include "common/metrics/metrics.h"

#include <httplib.h>

#include <sys/resource.h>
#include <sys/time.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>
#include <thread>

#include "common/metrics/buckets.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/process_metrics.h"
#include "common/metrics/request_metrics.h"
#include "gtest/gtest.h"

namespace pdserve::metrics {
namespace {

TEST(MetricsTest, RendersTheTextFormat) {
  Registry r;
  r.AddCounter("pdserve_prompt_tokens_total", "Prompt tokens.", {"model_name", "role"})
      .With({"m", "decode"})
      .Inc(42);
  r.AddGauge("pdserve_kv_cache_usage_perc", "KV usage, 0-1.", {"role"}).With({"decode"}).Set(0.25);
  Histogram& h = r.AddHistogram("pdserve_ttft_seconds", "TTFT.", {"role"}, {0.1, 1.0})
                     .With({"router"});
  h.Observe(0.1);   // le is inclusive: the 0.1 bucket.
  h.Observe(0.5);
  h.Observe(30.0);  // Only +Inf.
  EXPECT_EQ(r.Render(),
            "# HELP pdserve_kv_cache_usage_perc KV usage, 0-1.\n"
            "# TYPE pdserve_kv_cache_usage_perc gauge\n"
            "pdserve_kv_cache_usage_perc{role=\"decode\"} 0.25\n"
            "# HELP pdserve_prompt_tokens_total Prompt tokens.\n"
            "# TYPE pdserve_prompt_tokens_total counter\n"
            "pdserve_prompt_tokens_total{model_name=\"m\",role=\"decode\"} 42\n"
            "# HELP pdserve_ttft_seconds TTFT.\n"
            "# TYPE pdserve_ttft_seconds histogram\n"
            "pdserve_ttft_seconds_bucket{role=\"router\",le=\"0.1\"} 1\n"
            "pdserve_ttft_seconds_bucket{role=\"router\",le=\"1\"} 2\n"
            "pdserve_ttft_seconds_bucket{role=\"router\",le=\"+Inf\"} 3\n"
            "pdserve_ttft_seconds_sum{role=\"router\"} 30.6\n"
            "pdserve_ttft_seconds_count{role=\"router\"} 3\n");
}

TEST(MetricsTest, EscapesLabelValuesAndFormatsSpecialValues) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3)), 1.0 / 3);  // Round-trips.
  Registry r;
  r.AddGauge("g", "help with \\ and\nnewline", {"worker"}).With({"w\"1"}).Set(1);
  EXPECT_EQ(r.Render(), "# HELP g help with \\\\ and\\nnewline\n# TYPE g gauge\ng{worker=\"w\\\"1\"} 1\n");
}

TEST(MetricsTest, CountersNeverGoBackwards) {
  Counter c;
  c.Inc(2);
  c.Inc(-5);  // Ignored.
  EXPECT_EQ(c.value(), 2);
  c.SetTotal(10);
  c.SetTotal(7);  // A stale total does not move it back.
  EXPECT_EQ(c.value(), 10);
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  Registry r;
  auto& family = r.AddCounter("c_total", "c", {"t"});
  auto& hist = r.AddHistogram("h", "h", {}, {0.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Counter& c = family.With({t % 2 ? "odd" : "even"});
      Histogram& h = hist.With({});
      for (int i = 0; i < 20000; ++i) {
        c.Inc();
        h.Observe(i % 2 ? 1.0 : 0.25);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(family.With({"odd"}).value(), 40000);
  EXPECT_EQ(family.With({"even"}).value(), 40000);
  const Histogram::Snapshot s = hist.With({}).snapshot();
  EXPECT_EQ(s.count, 80000u);
  EXPECT_EQ(s.cumulative[0], 40000u);
  EXPECT_DOUBLE_EQ(s.sum, 40000 * 1.0 + 40000 * 0.25);
}

TEST(MetricsTest, CollectorsRunBeforeEachRenderAndVllmNamesAreOptional) {
  Registry r;
  Gauge& g = r.AddGauge("pdserve_num_requests_running", "Running.", {}, "vllm:num_requests_running")
                 .With({});
  int calls = 0;
  {
    CollectorHandle handle(&r, [&] { g.Set(++calls); });
    EXPECT_NE(r.Render().find("pdserve_num_requests_running 1\n"), std::string::npos);
    const std::string compat = r.Render({.vllm_compat = true});
    EXPECT_NE(compat.find("pdserve_num_requests_running 2\n"), std::string::npos);
    EXPECT_NE(compat.find("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"),
              std::string::npos);
  }
  r.Render();  // The handle is gone: its collector no longer runs.
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(r.Render().find("vllm:"), std::string::npos);
}

TEST(MetricsTest, SameNameSameFamily) {
  Registry r;
  auto& a = r.AddCounter("x_total", "x", {"role"});
  auto& b = r.AddCounter("x_total", "x", {"role"});
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(&a.With({"decode"}), &b.With({"decode"}));
  EXPECT_DEATH(r.AddGauge("x_total", "x", {"role"}), "x_total");
}

TEST(MetricsTest, RemovedChildrenEndTheirSeries) {
  Registry r;
  auto& up = r.AddGauge("pdserve_worker_up", "u", {"worker"});
  up.With({"a:1"}).Set(1);
  up.With({"b:2"}).Set(0);
  up.Remove({"a:1"});
  EXPECT_EQ(r.Render(), "# HELP pdserve_worker_up u\n# TYPE pdserve_worker_up gauge\n"
                        "pdserve_worker_up{worker=\"b:2\"} 0\n");
  up.Remove({"b:2"});
  // No series: the family is still declared.
  EXPECT_EQ(r.Render(), "# HELP pdserve_worker_up u\n# TYPE pdserve_worker_up gauge\n");
}

TEST(RequestMetricsTest, ObservesWhatEachEventMeans) {
  Registry r;
  RequestMetrics m(&r, "llama", "decode");
  m.FirstToken(0.25, 100);
  m.NextToken(0.01);
  m.NextToken(0.03);
  // Workers: time per output token is the decode phase over the tokens after the first.
  m.Finished({"length", 3, 0.5, 0.25, true, 0.05, 0.2, 0.04});
  // The router has no phases: (e2e - ttft) over the tokens after the first.
  RequestMetrics router(&r, "llama", "router");
  router.Finished({"stop", 5, 1.0, 0.2, false, 0, 0, 0});
  router.Finished({"abort", 1, 0.3, 0.3, false, 0, 0, 0});
  const std::string text = r.Render();
  auto has = [&](const std::string& line) {
    return text.find(line + "\n") != std::string::npos;
  };
  const std::string d = "{model_name=\"llama\",role=\"decode\"}";
  const std::string rt = "{model_name=\"llama\",role=\"router\"}";
  EXPECT_TRUE(has("pdserve_time_to_first_token_seconds_sum" + d + " 0.25")) << text;
  EXPECT_TRUE(has("pdserve_inter_token_latency_seconds_count" + d + " 2"));
  EXPECT_TRUE(has("pdserve_inter_token_latency_seconds_sum" + d + " 0.04"));
  EXPECT_TRUE(has("pdserve_prompt_tokens_total" + d + " 100"));
  EXPECT_TRUE(has("pdserve_generation_tokens_total" + d + " 3"));
  EXPECT_TRUE(has("pdserve_request_time_per_output_token_seconds_sum" + d + " 0.02"));
  EXPECT_TRUE(has("pdserve_request_time_per_output_token_seconds_sum" + rt + " 0.2"));
  EXPECT_TRUE(has("pdserve_request_time_per_output_token_seconds_count" + rt + " 1"));  // Not the 1-token one.
  EXPECT_TRUE(has("pdserve_request_queue_time_seconds_sum" + d + " 0.05"));
  EXPECT_TRUE(has("pdserve_request_queue_time_seconds_count" + rt + " 0"));
  EXPECT_TRUE(has("pdserve_request_success_total{model_name=\"llama\",role=\"router\",finished_reason=\"abort\"} 1"));
  EXPECT_TRUE(has("pdserve_request_success_total{model_name=\"llama\",role=\"decode\",finished_reason=\"length\"} 1"));
  // Families whose children come with their first event are declared from the start.
  Registry fresh;
  RequestMetrics unused(&fresh, "llama", "decode");
  EXPECT_NE(fresh.Render().find("# TYPE pdserve_request_success_total counter\n"), std::string::npos);
  // The vLLM names only with the compat option.
  EXPECT_EQ(text.find("vllm:"), std::string::npos);
  RenderOptions compat;
  compat.vllm_compat = true;
  EXPECT_NE(r.Render(compat).find("vllm:time_to_first_token_seconds_count" + d + " 1\n"), std::string::npos);
}

TEST(MetricsTest, BucketsSpanTheQuantities) {
  for (const auto* b : {&TtftBuckets(), &TokenLatencyBuckets(), &RequestLatencyBuckets(),
                        &TransferBuckets()}) {
    EXPECT_TRUE(std::is_sorted(b->begin(), b->end()));
    EXPECT_EQ(std::adjacent_find(b->begin(), b->end()), b->end());
  }
  EXPECT_LE(TokenLatencyBuckets().front(), 0.0001);  // Sub-millisecond ITL.
  EXPECT_GE(RequestLatencyBuckets().back(), 600);    // Minutes of E2E.
  EXPECT_LE(TtftBuckets().front(), 0.001);
}

// The sample of an unlabelled family in an exposition.
double Sample(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

TEST(ProcessMetricsTest, CpuMemoryAndStartAgreeWithTheKernelsOtherAccounts) {
  Registry registry;
  AddProcessMetrics(&registry);
  volatile double sink = 0;  // Some CPU time to count.
  for (int i = 0; i < 20000000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const std::string text = registry.Render();
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  auto seconds = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
  };
  const double cpu = Sample(text, "process_cpu_seconds_total");
  // /proc counts in clock ticks (10 ms); getrusage in microseconds.
  EXPECT_GE(cpu, seconds(before) - 0.02) << text;
  EXPECT_LE(cpu, seconds(after) + 0.02) << text;
  EXPECT_GT(cpu, 0);
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
  // ru_maxrss (KiB) is the peak: the resident size now is at most that.
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 0);
  EXPECT_LE(Sample(text, "process_resident_memory_bytes"), static_cast<double>(after.ru_maxrss) * 1024.0);
  EXPECT_GE(Sample(text, "process_virtual_memory_bytes"), Sample(text, "process_resident_memory_bytes"));
  EXPECT_GE(Sample(text, "process_open_fds"), 3);  // stdin, stdout, stderr.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  EXPECT_EQ(Sample(text, "process_max_fds"), static_cast<double>(limit.rlim_cur));
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double start = Sample(text, "process_start_time_seconds");
  EXPECT_LE(start, now + 1);
  EXPECT_GE(start, now - 3600) << "this test started within the hour";
}

TEST(HttpExporterTest, ServesMetricsOverHttp) {
  Registry r;
  r.AddCounter("pdserve_requests_total", "r", {}).With({}).Inc(3);
  auto e = HttpExporter::Start("127.0.0.1:0", &r, {});
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string address = (*e)->address();
  httplib::Client client("127.0.0.1", std::stoi(address.substr(address.rfind(':') + 1)));
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, "# HELP pdserve_requests_total r\n# TYPE pdserve_requests_total counter\n"
                       "pdserve_requests_total 3\n");
  EXPECT_EQ(client.Get("/other")->status, 404);
  EXPECT_FALSE(HttpExporter::Start("127.0.0.1:notaport", &r, {}).ok());
  EXPECT_FALSE(HttpExporter::Start(address, &r, {}).ok());  // Taken.
}

}  // namespace
}  // namespace pdserve::metrics
