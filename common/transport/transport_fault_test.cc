// Fault injection (a stand-in for a flaky link): the sender flips one byte of a page in flight
// after taking its checksum; the receiver must refuse the transfer, on every backend, and take
// the next intact transfer. Each case arms the fault itself, so the cases do not depend on order.
#include <chrono>
#include <thread>
#include <vector>

#include "common/transport/kv_transport.h"
#include "common/transport/receive_tracker.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

class FaultTest : public ::testing::TestWithParam<std::string> {};

TransferPoll Send(KvTransport& sender, KvTransport& receiver, uint64_t tag) {
  EXPECT_TRUE(receiver.Expect(tag, {{0, 8192}}).ok());
  const std::vector<PageCopy> pages = {{0, 0, 1024}, {1024, 1024, 1024}, {2048, 2048, 1024}};
  EXPECT_TRUE(sender.Submit(receiver.endpoint(), tag, pages).ok());
  sender.Finish(receiver.endpoint(), tag, [](absl::StatusOr<TransferStats>) {});
  TransferPoll p;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    p = receiver.Poll(tag);
    if (p.state != TransferState::kPending) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return p;
}

TEST_P(FaultTest, CorruptedPageIsRefusedAndTheNextTransferIsTaken) {
  std::vector<uint8_t> src(8192), dst(8192, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  KvTransportOptions o;
  o.layout = "model=m";
  auto sender = *CreateKvTransport(GetParam(), o);
  auto receiver = *CreateKvTransport(GetParam(), o);
  ASSERT_TRUE(sender->RegisterPool(src.data(), src.size()).ok());
  ASSERT_TRUE(receiver->RegisterPool(dst.data(), dst.size()).ok());

  SetCorruptKvPageForTesting(2);  // The 2nd page of the first transfer.
  const TransferPoll bad = Send(*sender, *receiver, 1);
  ASSERT_EQ(bad.state, TransferState::kFailed) << GetParam();
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kDataLoss) << bad.status;
  EXPECT_NE(bad.status.message().find("checksum"), absl::string_view::npos) << bad.status;
  receiver->Release(1);

  SetCorruptKvPageForTesting(0);
  std::fill(dst.begin(), dst.end(), 0);
  const TransferPoll good = Send(*sender, *receiver, 2);
  ASSERT_EQ(good.state, TransferState::kDone) << good.status;
  EXPECT_EQ(good.stats.pages, 3);
  EXPECT_EQ(good.stats.bytes, 3072);
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + 3072, dst.begin()));
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::Values("local", "tcp"));

}  // namespace
}  // namespace pdserve
