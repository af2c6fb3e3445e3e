#include "common/rpc/stream_coalesce.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

internal::v1::DecodeResponse Step(std::vector<int32_t> ids, const std::string& finish = "") {
  internal::v1::DecodeResponse r;
  for (int32_t id : ids) {
    r.add_token_ids(id);
    r.add_logprobs(-0.25f * static_cast<float>(id));
    pdserve::v1::TopLogprob* top = r.add_top_logprobs()->add_top();
    top->set_token_id(id);
    top->set_logprob(-0.5f);
  }
  if (!finish.empty()) {
    r.set_finish_reason(finish);
    r.mutable_usage()->set_prompt_tokens(7);
    r.mutable_usage()->set_completion_tokens(6);
  }
  return r;
}

TEST(StreamCoalesce, FoldedDecodeMessagesSplitBackIntoTheWorkersSteps) {
  // One token a step, a speculative step of three, then the last step with the finish reason.
  const std::vector<internal::v1::DecodeResponse> sent = {Step({5}), Step({9, 2, 4}), Step({1}),
                                                          Step({3}, "length")};
  internal::v1::DecodeResponse folded = sent[0];
  for (size_t i = 1; i < sent.size(); ++i) ASSERT_TRUE(CoalesceDecodeResponse(folded, sent[i]));
  EXPECT_EQ(folded.token_ids_size(), 6);
  EXPECT_EQ(std::vector<int32_t>(folded.step_tokens().begin(), folded.step_tokens().end()),
            (std::vector<int32_t>{1, 3, 1, 1}));
  EXPECT_EQ(folded.finish_reason(), "length");
  const std::vector<internal::v1::DecodeResponse> split = SplitDecodeResponse(folded);
  ASSERT_EQ(split.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(split[i].SerializeAsString(), sent[i].SerializeAsString()) << "step " << i;
  }
  // Nothing folds into the stream's last message.
  const std::string before = folded.SerializeAsString();
  EXPECT_FALSE(CoalesceDecodeResponse(folded, Step({8})));
  EXPECT_EQ(folded.SerializeAsString(), before);
}

TEST(StreamCoalesce, FoldingAlreadyFoldedMessagesKeepsEveryStep) {
  internal::v1::DecodeResponse a = Step({1});
  ASSERT_TRUE(CoalesceDecodeResponse(a, Step({2, 3})));
  internal::v1::DecodeResponse b = Step({4});
  ASSERT_TRUE(CoalesceDecodeResponse(b, Step({5}, "stop")));
  ASSERT_TRUE(CoalesceDecodeResponse(a, b));
  const auto split = SplitDecodeResponse(a);
  ASSERT_EQ(split.size(), 4u);
  EXPECT_EQ(split[1].token_ids_size(), 2);
  EXPECT_EQ(split[3].finish_reason(), "stop");
  EXPECT_EQ(split[3].usage().completion_tokens(), 6);
  EXPECT_TRUE(split[2].finish_reason().empty());
  EXPECT_FALSE(split[2].has_usage());
}

TEST(StreamCoalesce, AMessageNotFoldedOrInconsistentIsRelayedWhole) {
  const internal::v1::DecodeResponse one = Step({4, 5});
  ASSERT_EQ(SplitDecodeResponse(one).size(), 1u);
  EXPECT_EQ(SplitDecodeResponse(one)[0].SerializeAsString(), one.SerializeAsString());
  internal::v1::DecodeResponse bad = Step({4, 5, 6});
  bad.add_step_tokens(1);
  bad.add_step_tokens(1);  // Adds up to 2 of 3 tokens: not split.
  ASSERT_EQ(SplitDecodeResponse(bad).size(), 1u);
  bad.set_step_tokens(1, -1);
  bad.add_step_tokens(3);  // A negative count: not split.
  ASSERT_EQ(SplitDecodeResponse(bad).size(), 1u);
}

TEST(StreamCoalesce, AnEmptyStepOnlySurvivesAsTheLast) {
  internal::v1::DecodeResponse a = Step({1});
  ASSERT_TRUE(CoalesceDecodeResponse(a, Step({})));
  ASSERT_TRUE(CoalesceDecodeResponse(a, Step({2})));
  ASSERT_TRUE(CoalesceDecodeResponse(a, Step({}, "abort")));
  const auto split = SplitDecodeResponse(a);
  ASSERT_EQ(split.size(), 3u);
  EXPECT_EQ(split[1].token_ids(0), 2);
  EXPECT_EQ(split[2].token_ids_size(), 0);
  EXPECT_EQ(split[2].finish_reason(), "abort");
}

TEST(StreamCoalesce, AFullMessageTakesNoMore) {
  // One step short of the cap: the next step still folds in; then nothing does.
  std::vector<int32_t> ids(kMaxFoldedTokens - 1, 7);
  internal::v1::DecodeResponse a = Step(ids);
  ASSERT_TRUE(CoalesceDecodeResponse(a, Step({8})));
  EXPECT_EQ(a.token_ids_size(), kMaxFoldedTokens);
  EXPECT_FALSE(CoalesceDecodeResponse(a, Step({9})));
  EXPECT_EQ(a.token_ids_size(), kMaxFoldedTokens);
  v1::GenerateResponse g;
  for (int i = 0; i < kMaxFoldedTokens; ++i) g.add_token_ids(i);
  v1::GenerateResponse h;
  h.add_token_ids(1);
  h.set_text("x");
  EXPECT_FALSE(CoalesceGenerateResponse(g, h));
  EXPECT_TRUE(g.text().empty());
}

TEST(StreamCoalesce, PublicMessagesConcatenateTheirText) {
  v1::GenerateResponse a;
  a.set_request_id("r");
  a.add_token_ids(1);
  a.add_logprobs(-1.0f);
  a.add_top_logprobs();
  a.set_text("Hel");
  v1::GenerateResponse b;
  b.set_request_id("r");
  b.add_token_ids(2);
  b.add_logprobs(-2.0f);
  b.add_top_logprobs();
  b.set_text("lo");
  b.set_finish_reason("stop");
  b.mutable_usage()->set_completion_tokens(2);
  ASSERT_TRUE(CoalesceGenerateResponse(a, b));
  EXPECT_EQ(a.text(), "Hello");
  EXPECT_EQ(a.request_id(), "r");
  EXPECT_EQ(a.token_ids_size(), 2);
  EXPECT_EQ(a.logprobs(1), -2.0f);
  EXPECT_EQ(a.top_logprobs_size(), 2);
  EXPECT_EQ(a.finish_reason(), "stop");
  EXPECT_EQ(a.usage().completion_tokens(), 2);
  EXPECT_FALSE(CoalesceGenerateResponse(a, b));
  EXPECT_EQ(a.text(), "Hello");
}

}  // namespace
}  // namespace pdserve
