#include "bench/serving/load_client.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(LoadClientTest, NearestRankPercentile) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({7}, 90), 7);
  // 1..10: p50 is the 5th value, p90 the 9th, p100 the largest, p0 the smallest.
  const std::vector<double> v = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_EQ(Percentile(v, 50), 5);
  EXPECT_EQ(Percentile(v, 90), 9);
  EXPECT_EQ(Percentile(v, 91), 10);
  EXPECT_EQ(Percentile(v, 100), 10);
  EXPECT_EQ(Percentile(v, 0), 1);
}

TEST(LoadClientTest, SummaryWeighsHitRateByTokensAndSkipsFailures) {
  LoadRun run;
  run.wall_seconds = 2;
  RequestResult a;
  a.ttft_seconds = 0.1;
  a.tpot_seconds = 0.01;
  a.prompt_tokens = 100;
  a.cached_tokens = 80;
  a.completion_tokens = 4;
  RequestResult b = a;
  b.ttft_seconds = 0.3;
  b.tpot_seconds = 0.03;
  b.prompt_tokens = 300;
  b.cached_tokens = 0;
  RequestResult failed;
  failed.status = absl::UnavailableError("no decode worker");
  failed.prompt_tokens = 1000;
  run.results = {a, b, failed};
  const LoadSummary s = Summarize(run);
  EXPECT_EQ(s.ok, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_NE(s.first_error.find("no decode worker"), std::string::npos);
  EXPECT_DOUBLE_EQ(s.hit_rate, 80.0 / 400.0);
  EXPECT_DOUBLE_EQ(s.ttft_p50, 0.1);
  EXPECT_DOUBLE_EQ(s.ttft_p90, 0.3);
  EXPECT_DOUBLE_EQ(s.tpot_p90, 0.03);
  EXPECT_DOUBLE_EQ(s.requests_per_second, 1.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_second, 4.0);
}

}  // namespace
}  // namespace pdserve
