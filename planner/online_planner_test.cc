#include "planner/online_planner.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

// A step costs 5 ms + 0.2 ms per token.
OnlinePlannerOptions Options() {
  OnlinePlannerOptions o;
  o.profile.step = StepTimeModel{0.005, 0.0002, 0, 0, 0};
  o.profile.transfer_latency_seconds = 0.0005;
  o.profile.transfer_bytes_per_second = 1e10;
  o.profile.kv_bytes_per_token = 1000;
  o.profile.vocab_size = 1000;
  o.cluster.worker.num_blocks = 4096;
  o.cluster.worker.block_size = 16;
  o.cluster.worker.max_model_len = 4096;
  o.slo_ttft_ms = 500;
  o.slo_tpot_ms = 40;
  o.max_workers = 12;
  o.sample_requests = 150;
  return o;
}

TEST(OnlinePlannerTest, MoreTrafficMoreWorkers) {
  const OnlinePlannerOptions o = Options();
  auto idle = SizeDeployment(o, Observation{0, 0, 0});
  ASSERT_TRUE(idle.ok());
  EXPECT_EQ(idle->prefill + idle->decode, 1) << "no traffic: the minimum";
  int64_t previous = 0;
  int64_t first = 0;
  for (double rate : {1.0, 4.0, 12.0}) {
    auto s = SizeDeployment(o, Observation{rate, 600, 60});
    ASSERT_TRUE(s.ok()) << s.status();
    const int64_t k = s->prefill + s->decode;
    EXPECT_GE(k, previous) << "at " << rate << " req/s";
    EXPECT_FALSE(s->saturated) << "at " << rate << " req/s";
    EXPECT_GE(s->attainment, 0.9);
    if (first == 0) first = k;
    previous = k;
  }
  EXPECT_GT(previous, first) << "12 req/s of 600-token prompts need more workers than 1 req/s";
  // Far beyond what 12 workers serve: the best split at the maximum, flagged.
  auto over = SizeDeployment(o, Observation{500, 2000, 60});
  ASSERT_TRUE(over.ok());
  EXPECT_TRUE(over->saturated);
  EXPECT_EQ(over->prefill + over->decode, 12);
}

TEST(OnlinePlannerTest, ScaleDownWaitsForTheDelay) {
  ScaleDownDelay delay(10);
  auto s = [](int64_t p, int64_t d) {
    Sizing x;
    x.prefill = p;
    x.decode = d;
    return x;
  };
  EXPECT_EQ(delay.Update(0, s(1, 1)).decode, 1);
  EXPECT_EQ(delay.Update(5, s(2, 3)).decode, 3) << "up at once";
  EXPECT_EQ(delay.Update(8, s(1, 1)).decode, 3) << "down waits";
  EXPECT_EQ(delay.Update(14, s(1, 1)).decode, 3);
  const Sizing later = delay.Update(15.5, s(1, 1));
  EXPECT_EQ(later.decode, 1) << "the 3 is more than 10 s old";
  EXPECT_EQ(later.prefill, 1);
}

TEST(OnlinePlannerTest, BadOptionsAreRefused) {
  OnlinePlannerOptions o = Options();
  o.slo_tpot_ms = 0;
  EXPECT_FALSE(CheckOnlinePlannerOptions(o).ok());
  o = Options();
  o.min_prefill = 8;
  o.min_decode = 8;
  EXPECT_FALSE(CheckOnlinePlannerOptions(o).ok());
  o = Options();
  o.headroom = 0.5;
  EXPECT_FALSE(CheckOnlinePlannerOptions(o).ok());
}

// The loop against counters that rise fast, then stop: the desired count goes up, then back
// down once the delay has passed.
TEST(OnlinePlannerTest, TheLoopFollowsTrafficUpAndDown) {
  OnlinePlannerOptions o = Options();
  o.interval_seconds = 0.05;
  o.scale_down_delay_seconds = 0.3;
  std::atomic<bool> busy{true};
  std::atomic<double> requests{0};
  const auto start = std::chrono::steady_clock::now();
  auto sample = [&] {
    // 20 req/s of 600-token prompts and 60-token outputs while busy.
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (busy) requests = 20 * t;
    TrafficCounters c;
    c.requests = c.first_tokens = requests;
    c.prompt_tokens = 600 * requests;
    c.generation_tokens = 60 * requests;
    return c;
  };
  metrics::Registry registry;
  // Both tiers' desired workers, from the rendered metrics (as Prometheus would read them).
  auto desired = [&] {
    const std::string out = registry.Render();
    double total = 0;
    for (const char* tier : {"prefill", "decode"}) {
      const std::string key = std::string("pdserve_planner_desired_workers{model_name=\"m\",role=\"router\",tier=\"") +
                              tier + "\"} ";
      const size_t at = out.find(key);
      if (at == std::string::npos) return -1.0;
      total += std::stod(out.substr(at + key.size()));
    }
    return total;
  };
  PlannerLoop loop(o, sample, &registry, "m");
  double peak = 0;
  for (int i = 0; i < 200 && peak <= 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    peak = std::max(peak, desired());
  }
  EXPECT_GT(peak, 1) << "20 req/s of 600-token prompts must want more than one worker";
  busy = false;
  double now = peak;
  for (int i = 0; i < 400 && now > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    now = desired();
  }
  EXPECT_EQ(now, 1) << "back to the minimum after the delay";
}

}  // namespace
}  // namespace pdserve
