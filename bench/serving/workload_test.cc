#include "bench/serving/workload.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

WorkloadOptions Small() {
  WorkloadOptions o;
  o.requests = 2000;
  o.rate = 10;
  o.groups = 3;
  o.system_tokens = 40;
  o.suffix_tokens = 7;
  o.vocab_size = 500;
  o.first_token = 3;
  return o;
}

TEST(WorkloadTest, SharedPrefixGroupsShareExactlyTheirSystemPrompt) {
  auto w = MakeWorkload(Small());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->size(), 2000u);
  std::vector<const BenchRequest*> first(3, nullptr);
  std::vector<int> count(3, 0);
  std::set<std::vector<int32_t>> suffixes;
  for (const BenchRequest& r : *w) {
    ASSERT_EQ(r.prompt.size(), 47u);
    ASSERT_GE(r.group, 0);
    ASSERT_LT(r.group, 3);
    ++count[r.group];
    for (int32_t t : r.prompt) {
      ASSERT_GE(t, 3);
      ASSERT_LT(t, 500);
    }
    if (first[r.group] == nullptr) first[r.group] = &r;
    EXPECT_TRUE(std::equal(r.prompt.begin(), r.prompt.begin() + 40, first[r.group]->prompt.begin()));
    suffixes.emplace(r.prompt.begin() + 40, r.prompt.end());
  }
  EXPECT_EQ(suffixes.size(), 2000u);  // Distinct user parts.
  // Different groups, different system prompts.
  EXPECT_NE(std::vector<int32_t>(first[0]->prompt.begin(), first[0]->prompt.begin() + 40),
            std::vector<int32_t>(first[1]->prompt.begin(), first[1]->prompt.begin() + 40));
  for (int c : count) EXPECT_NEAR(c, 2000 / 3, 100);  // Uniform choice of group.
}

TEST(WorkloadTest, ArrivalsArePoissonAtTheRate) {
  auto w = *MakeWorkload(Small());
  EXPECT_EQ(w[0].arrival_seconds, 0);
  double sum = 0, sum_sq = 0;
  for (size_t i = 1; i < w.size(); ++i) {
    const double gap = w[i].arrival_seconds - w[i - 1].arrival_seconds;
    ASSERT_GE(gap, 0);
    sum += gap;
    sum_sq += gap * gap;
  }
  const double n = static_cast<double>(w.size() - 1);
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Exponential gaps: mean 1/rate and standard deviation equal to the mean.
  EXPECT_NEAR(mean, 0.1, 0.01);
  EXPECT_NEAR(std::sqrt(var), 0.1, 0.015);
}

TEST(WorkloadTest, SameSeedSameStreamAndRandomPromptsDiffer) {
  WorkloadOptions o = Small();
  EXPECT_EQ((*MakeWorkload(o))[17].prompt, (*MakeWorkload(o))[17].prompt);
  o.kind = "random";
  auto w = *MakeWorkload(o);
  EXPECT_EQ(w[0].group, -1);
  EXPECT_EQ(w[0].prompt.size(), 47u);
  EXPECT_NE(std::vector<int32_t>(w[0].prompt.begin(), w[0].prompt.begin() + 40),
            std::vector<int32_t>(w[1].prompt.begin(), w[1].prompt.begin() + 40));
}

TEST(WorkloadTest, BadOptionsNameTheFlag) {
  WorkloadOptions o = Small();
  o.kind = "zipf";
  EXPECT_NE(MakeWorkload(o).status().message().find("--workload"), std::string::npos);
  o = Small();
  o.groups = 0;
  EXPECT_NE(MakeWorkload(o).status().message().find("--groups"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
