// Fault injection (a stand-in for a flaky link): the sender flips one byte of its 2nd page in
// flight; the receiver's checksum must refuse the transfer.
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/transport/kv_transport.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

const bool kFaultSet = [] { return setenv("PDSERVE_FAULT_CORRUPT_KV_PAGE", "2", 1) == 0; }();

class FaultTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultTest, CorruptedPageIsRefused) {
  ASSERT_TRUE(kFaultSet);
  std::vector<uint8_t> src(8192, 3), dst(8192, 0);
  KvTransportOptions o;
  o.layout = "model=m";
  auto sender = *CreateKvTransport(GetParam(), o);
  auto receiver = *CreateKvTransport(GetParam(), o);
  ASSERT_TRUE(sender->RegisterPool(src.data(), src.size()).ok());
  ASSERT_TRUE(receiver->RegisterPool(dst.data(), dst.size()).ok());
  // The process-wide page counter runs across both instantiations: the "local" case sends pages
  // 1-2 (the 2nd is corrupted), the "tcp" case runs second and must see an intact transfer.
  ASSERT_TRUE(receiver->Expect(1, {{0, 8192}}).ok());
  std::vector<PageCopy> pages = {{0, 0, 1024}, {1024, 1024, 1024}};
  ASSERT_TRUE(sender->Submit(receiver->endpoint(), 1, pages).ok());
  sender->Finish(receiver->endpoint(), 1, [](absl::StatusOr<TransferStats>) {});
  TransferPoll p;
  for (int i = 0; i < 2000; ++i) {
    p = receiver->Poll(1);
    if (p.state != TransferState::kPending) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (GetParam() == "local") {
    ASSERT_EQ(p.state, TransferState::kFailed);
    EXPECT_EQ(p.status.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(p.status.message().find("checksum"), absl::string_view::npos);
  } else {
    EXPECT_EQ(p.state, TransferState::kDone) << p.status;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::Values("local", "tcp"));

}  // namespace
}  // namespace pdserve
