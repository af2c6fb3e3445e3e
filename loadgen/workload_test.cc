#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

WorkloadOptions Small() {
  WorkloadOptions o;
  o.kind = "shared-prefix";
  o.num_prompts = 2000;
  o.rate = 10;
  o.groups = 3;
  o.prefix_len = 40;
  o.input_len = 7;
  o.output_len = 5;
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
  o.input_len = 47;
  auto w = *MakeWorkload(o);
  EXPECT_EQ(w[0].group, -1);
  EXPECT_EQ(w[0].prompt.size(), 47u);
  EXPECT_NE(std::vector<int32_t>(w[0].prompt.begin(), w[0].prompt.begin() + 40),
            std::vector<int32_t>(w[1].prompt.begin(), w[1].prompt.begin() + 40));
}

TEST(WorkloadTest, RangeRatioSpreadsLengthsUniformly) {
  WorkloadOptions o = Small();
  o.kind = "random";
  o.input_len = 100;
  o.output_len = 20;
  o.range_ratio = 0.5;
  std::set<size_t> inputs;
  int64_t min_in = 1 << 30, max_in = 0, min_out = 1 << 30, max_out = 0;
  double sum_in = 0;
  const std::vector<BenchRequest> w = *MakeWorkload(o);
  for (const BenchRequest& r : w) {
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    min_in = std::min(min_in, n);
    max_in = std::max(max_in, n);
    min_out = std::min(min_out, r.output_tokens);
    max_out = std::max(max_out, r.output_tokens);
    sum_in += n;
    inputs.insert(r.prompt.size());
  }
  EXPECT_EQ(min_in, 50);
  EXPECT_EQ(max_in, 150);
  EXPECT_EQ(min_out, 10);
  EXPECT_EQ(max_out, 30);
  EXPECT_NEAR(sum_in / 2000, 100, 2);
  EXPECT_EQ(inputs.size(), 101u);
  o.range_ratio = 0;  // Exact lengths.
  const std::vector<BenchRequest> exact = *MakeWorkload(o);
  for (const BenchRequest& r : exact) {
    ASSERT_EQ(r.prompt.size(), 100u);
    ASSERT_EQ(r.output_tokens, 20);
  }
}

// Gamma gaps with shape k at rate r: mean 1/r, coefficient of variation 1/sqrt(k).
TEST(WorkloadTest, BurstinessShapesTheGapsAndKeepsTheRate) {
  for (double k : {0.25, 1.0, 4.0}) {
    WorkloadOptions o = Small();
    o.num_prompts = 20000;
    o.burstiness = k;
    auto w = *MakeWorkload(o);
    double sum = 0, sum_sq = 0;
    for (size_t i = 1; i < w.size(); ++i) {
      const double gap = w[i].arrival_seconds - w[i - 1].arrival_seconds;
      sum += gap;
      sum_sq += gap * gap;
    }
    const double n = static_cast<double>(w.size() - 1);
    const double mean = sum / n;
    const double cv = std::sqrt(sum_sq / n - mean * mean) / mean;
    EXPECT_NEAR(mean, 0.1, 0.005) << k;
    EXPECT_NEAR(cv, 1 / std::sqrt(k), 0.06 / std::sqrt(k)) << k;
  }
}

TEST(WorkloadTest, InfiniteRateSendsEverythingAtOnce) {
  WorkloadOptions o = Small();
  o.rate = std::numeric_limits<double>::infinity();
  const std::vector<BenchRequest> w = *MakeWorkload(o);
  for (const BenchRequest& r : w) ASSERT_EQ(r.arrival_seconds, 0);
}

// Every later turn of a conversation extends its previous prompt by the reply's length plus a
// new user turn; lengths are right-skewed like chat (mean above median, a long p99).
TEST(WorkloadTest, SyntheticChatTurnsExtendTheirHistory) {
  WorkloadOptions o = Small();
  o.kind = "synthetic-chat";
  o.num_prompts = 3000;
  o.input_len = 50;
  o.output_len = 40;
  o.max_prompt_len = 100000;
  auto w = *MakeWorkload(o);
  std::map<int64_t, const BenchRequest*> last;
  int64_t continued = 0;
  std::vector<double> outputs;
  for (const BenchRequest& r : w) {
    ASSERT_GE(r.group, 0);
    ASSERT_GE(r.output_tokens, 1);
    ASSERT_LE(r.output_tokens, 8 * 40);
    outputs.push_back(static_cast<double>(r.output_tokens));
    auto it = last.find(r.group);
    if (it != last.end()) {
      const BenchRequest& prev = *it->second;
      ASSERT_GT(r.prompt.size(), prev.prompt.size() + prev.output_tokens);
      EXPECT_TRUE(std::equal(prev.prompt.begin(), prev.prompt.end(), r.prompt.begin()));
      ++continued;
    }
    last[r.group] = &r;
  }
  EXPECT_GT(continued, 1000);  // Multi-turn: most conversations have more than one turn.
  std::sort(outputs.begin(), outputs.end());
  double mean = 0;
  for (double x : outputs) mean += x / outputs.size();
  EXPECT_NEAR(outputs[outputs.size() / 2], 40, 3);  // Median as asked.
  EXPECT_GT(mean, 1.2 * 40);                          // Right tail.
  // The cap holds: prompts never exceed max_prompt_len.
  o.max_prompt_len = 120;
  const std::vector<BenchRequest> capped = *MakeWorkload(o);
  for (const BenchRequest& r : capped) ASSERT_LE(r.prompt.size(), 120u);
}

TEST(WorkloadTest, BadOptionsNameTheFlag) {
  WorkloadOptions o = Small();
  o.kind = "zipf";
  EXPECT_NE(MakeWorkload(o).status().message().find("--workload"), std::string::npos);
  o = Small();
  o.groups = 0;
  EXPECT_NE(MakeWorkload(o).status().message().find("--groups"), std::string::npos);
  o = Small();
  o.range_ratio = 1;
  EXPECT_NE(MakeWorkload(o).status().message().find("--range-ratio"), std::string::npos);
  o = Small();
  o.burstiness = 0;
  EXPECT_NE(MakeWorkload(o).status().message().find("--burstiness"), std::string::npos);
  o = Small();
  o.rate = 0;
  EXPECT_NE(MakeWorkload(o).status().message().find("--request-rate"), std::string::npos);
  o = Small();
  o.kind = "synthetic-chat";
  o.max_prompt_len = 3;  // Shorter than the shortest user turn.
  EXPECT_NE(MakeWorkload(o).status().message().find("--max-prompt-len"), std::string::npos);
  o = Small();
  o.num_prompts = 0;
  EXPECT_NE(MakeWorkload(o).status().message().find("--num-prompts"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
