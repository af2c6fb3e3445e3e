#include "loadgen/load_client.h"

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

TEST(LoadClientTest, SummaryFollowsVllmDefinitionsAndSkipsFailures) {
  LoadRun run;
  run.wall_seconds = 2;
  RequestResult a;
  a.ttft_seconds = 0.1;
  a.e2e_seconds = 0.13;  // 4 tokens: TPOT = (0.13 - 0.1) / 3 = 0.01.
  a.itl_seconds = {0.005, 0.01, 0.015};
  a.prompt_tokens = 100;
  a.cached_tokens = 80;
  a.completion_tokens = 4;
  RequestResult b = a;
  b.ttft_seconds = 0.3;
  b.e2e_seconds = 0.39;  // TPOT 0.03.
  b.itl_seconds = {0.03, 0.03, 0.03};
  b.prompt_tokens = 300;
  b.cached_tokens = 0;
  RequestResult one = a;  // One token: no TPOT, no ITL.
  one.ttft_seconds = 0.2;
  one.e2e_seconds = 0.2;
  one.itl_seconds = {};
  one.completion_tokens = 1;
  one.prompt_tokens = 0;
  one.cached_tokens = 0;
  RequestResult failed;
  failed.status = absl::UnavailableError("no decode worker");
  failed.prompt_tokens = 1000;
  run.results = {a, b, one, failed};
  Slo slo;
  ASSERT_TRUE(ParseSlo("ttft:250,tpot:20", &slo).ok());
  const LoadSummary s = Summarize(run, slo);
  EXPECT_EQ(s.ok, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_NE(s.first_error.find("no decode worker"), std::string::npos);
  EXPECT_DOUBLE_EQ(s.hit_rate, 80.0 / 400.0);
  EXPECT_DOUBLE_EQ(s.ttft.p50, 0.2);
  EXPECT_DOUBLE_EQ(s.ttft.p90, 0.3);
  EXPECT_DOUBLE_EQ(s.ttft.mean, 0.6 / 3);
  EXPECT_NEAR(s.tpot.p50, 0.01, 1e-12);
  EXPECT_NEAR(s.tpot.p99, 0.03, 1e-12);
  EXPECT_DOUBLE_EQ(s.itl.p50, 0.015);  // Six gaps: 5, 10, 15, 30, 30, 30 ms.
  EXPECT_DOUBLE_EQ(s.itl.p99, 0.03);
  EXPECT_NEAR(s.itl.mean, 0.12 / 6, 1e-12);
  EXPECT_DOUBLE_EQ(s.e2e.p99, 0.39);
  // Good: a (TTFT 100 ms, TPOT 10 ms) and one (200 ms, no TPOT); b misses both SLOs.
  EXPECT_EQ(s.good, 2);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);
  EXPECT_DOUBLE_EQ(s.requests_per_second, 1.5);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_second, 4.5);
  EXPECT_DOUBLE_EQ(s.total_tokens_per_second, (400 + 9) / 2.0);
  // Without SLOs there is no goodput.
  EXPECT_EQ(Summarize(run).goodput, 0);
}

TEST(LoadClientTest, SloParsingNamesTheFlag) {
  Slo slo;
  ASSERT_TRUE(ParseSlo("ttft:500 tpot:50 e2el:9000", &slo).ok());
  EXPECT_EQ(slo.ttft_ms, 500);
  EXPECT_EQ(slo.tpot_ms, 50);
  EXPECT_EQ(slo.e2e_ms, 9000);
  ASSERT_TRUE(ParseSlo("", &slo).ok());
  EXPECT_FALSE(slo.any());
  for (const char* bad : {"ttft", "ttft:-1", "ttft:x", "itl:5", "tpot:inf"}) {
    const absl::Status s = ParseSlo(bad, &slo);
    EXPECT_NE(s.message().find("--goodput"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace pdserve
