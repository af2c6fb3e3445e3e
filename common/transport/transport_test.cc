#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/transport/kv_transport.h"
#include "gtest/gtest.h"

#include <cstdlib>

namespace pdserve {
namespace {

constexpr char kLayout[] = "model=m1;block_size=16;kv_dtype=f32;layout=layer,block,kv,head,slot,dim";

TransferPoll WaitDone(KvTransport& t, uint64_t tag) {
  for (int i = 0; i < 2000; ++i) {
    TransferPoll p = t.Poll(tag);
    if (p.state != TransferState::kPending) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return t.Poll(tag);
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // "ucx-sm" / "ucx-tcp": the ucx backend over UCX's shared-memory or TCP transports.
    std::string backend = GetParam();
    if (backend.rfind("ucx-", 0) == 0) {
      setenv("UCX_TLS", backend == "ucx-sm" ? "sm,self" : "tcp,self", 1);
      backend = "ucx";
    }
    backend_ = backend;
    src_pool_.resize(1 << 16);
    dst_pool_.assign(1 << 16, 0);
    for (size_t i = 0; i < src_pool_.size(); ++i) src_pool_[i] = static_cast<uint8_t>(i * 7 + 3);
    KvTransportOptions o;
    o.layout = kLayout;
    auto sender = CreateKvTransport(backend_, o);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
    receiver_ = *CreateKvTransport(backend_, o);
    ASSERT_TRUE(sender_->RegisterPool(src_pool_.data(), src_pool_.size()).ok());
    ASSERT_TRUE(receiver_->RegisterPool(dst_pool_.data(), dst_pool_.size()).ok());
  }

  std::string backend_;
  std::vector<uint8_t> src_pool_, dst_pool_;
  std::unique_ptr<KvTransport> sender_, receiver_;
};

TEST_P(TransportTest, PagesLandWhereTheReceiverReserved) {
  ASSERT_TRUE(receiver_->Expect(7, {{4096, 8192}, {16384, 20480}}).ok());
  std::vector<PageCopy> pages = {{0, 4096, 1024}, {1024, 5120, 1024}, {30000, 16384, 4096}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 7, {pages.data(), 2}).ok());
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 7, {pages.data() + 2, 1}).ok());
  std::atomic<bool> finished{false};
  TransferStats sent;
  sender_->Finish(receiver_->endpoint(), 7, [&](absl::StatusOr<TransferStats> s) {
    ASSERT_TRUE(s.ok()) << s.status();
    sent = *s;
    finished = true;
  });
  const TransferPoll p = WaitDone(*receiver_, 7);
  ASSERT_EQ(p.state, TransferState::kDone) << p.status;
  EXPECT_EQ(p.stats.pages, 3);
  EXPECT_EQ(p.stats.bytes, 6144);
  // Finish's callback runs on a transport thread; a lost callback fails here, not at ctest's limit.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(finished) << "Finish's callback never ran";
  EXPECT_EQ(sent.checksum, p.stats.checksum);
  EXPECT_EQ(std::memcmp(&dst_pool_[4096], &src_pool_[0], 2048), 0);
  EXPECT_EQ(std::memcmp(&dst_pool_[16384], &src_pool_[30000], 4096), 0);
  EXPECT_EQ(dst_pool_[8192], 0);  // Nothing outside the pages.
  receiver_->Release(7);
}

TEST_P(TransportTest, PageOutsideTheReservationFailsTheTransfer) {
  ASSERT_TRUE(receiver_->Expect(9, {{0, 1024}}).ok());
  std::vector<PageCopy> pages = {{0, 2048, 512}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 9, pages).ok());
  sender_->Finish(receiver_->endpoint(), 9, [](absl::StatusOr<TransferStats>) {});
  const TransferPoll p = WaitDone(*receiver_, 9);
  EXPECT_EQ(p.state, TransferState::kFailed);
  EXPECT_EQ(p.status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(dst_pool_[2048], 0);
}

TEST_P(TransportTest, AbortReachesTheReceiver) {
  ASSERT_TRUE(receiver_->Expect(11, {{0, 4096}}).ok());
  std::vector<PageCopy> pages = {{0, 0, 512}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 11, pages).ok());
  sender_->Abort(receiver_->endpoint(), 11);
  const TransferPoll p = WaitDone(*receiver_, 11);
  EXPECT_EQ(p.state, TransferState::kFailed);
  EXPECT_EQ(p.status.code(), absl::StatusCode::kAborted);
}

TEST_P(TransportTest, LayoutMismatchIsRefusedNamingTheField) {
  KvTransportOptions other;
  other.layout = "model=m1;block_size=32;kv_dtype=f32;layout=layer,block,kv,head,slot,dim";
  auto odd = *CreateKvTransport(backend_, other);
  ASSERT_TRUE(odd->RegisterPool(src_pool_.data(), src_pool_.size()).ok());
  ASSERT_TRUE(receiver_->Expect(13, {{0, 4096}}).ok());
  std::vector<PageCopy> pages = {{0, 0, 512}};
  const absl::Status s = odd->Submit(receiver_->endpoint(), 13, pages);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("block_size"), absl::string_view::npos) << s;
}

TEST_P(TransportTest, UnknownPeerIsRefused) {
  std::vector<PageCopy> pages = {{0, 0, 16}};
  if (backend_ == "ucx") {
    // A ucx endpoint carries the peer's address and key: a malformed one is refused at once.
    EXPECT_EQ(sender_->Submit("ucx:00ff", 1, pages).code(), absl::StatusCode::kInvalidArgument);
    return;
  }
  const std::string nowhere = backend_ == "tcp" ? "tcp://127.0.0.1:1" : "local://999999";
  EXPECT_EQ(sender_->Submit(nowhere, 1, pages).code(), absl::StatusCode::kUnavailable);
}

#ifdef PDSERVE_HAVE_UCX
INSTANTIATE_TEST_SUITE_P(Backends, TransportTest,
                         ::testing::Values("local", "tcp", "ucx-sm", "ucx-tcp"));
#else
INSTANTIATE_TEST_SUITE_P(Backends, TransportTest, ::testing::Values("local", "tcp"));
#endif

TEST(TcpTransportTest, LostPeerFailsTheTransfer) {
  std::vector<uint8_t> src(8192, 1), dst(8192, 0);
  KvTransportOptions o;
  o.layout = kLayout;
  auto receiver = *CreateKvTransport("tcp", o);
  ASSERT_TRUE(receiver->RegisterPool(dst.data(), dst.size()).ok());
  ASSERT_TRUE(receiver->Expect(5, {{0, 8192}}).ok());
  {
    auto sender = *CreateKvTransport("tcp", o);
    ASSERT_TRUE(sender->RegisterPool(src.data(), src.size()).ok());
    std::vector<PageCopy> pages = {{0, 0, 1024}};
    ASSERT_TRUE(sender->Submit(receiver->endpoint(), 5, pages).ok());
    for (int i = 0; i < 1000 && receiver->Poll(5).stats.pages == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }  // The sender dies before finishing.
  const TransferPoll p = WaitDone(*receiver, 5);
  EXPECT_EQ(p.state, TransferState::kFailed);
  EXPECT_EQ(p.status.code(), absl::StatusCode::kUnavailable);
}

TEST(TransportRegistryTest, UnknownBackend) {
  EXPECT_EQ(CreateKvTransport("rdma", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransportRegistryTest, GpuPoolsStageTcpAndUcxThroughHostMemory) {
  // Where each backend's pages travel (the KV layout's device: who can pair with whom).
  EXPECT_EQ(KvPagesDevice("tcp", "cuda"), "cpu");
  EXPECT_EQ(KvPagesDevice("ucx", "cuda"), "cpu");
  EXPECT_EQ(KvPagesDevice("tcp", "cpu"), "cpu");
  EXPECT_EQ(KvPagesDevice("cuda_ipc", "cuda"), "cuda");
  EXPECT_EQ(KvPagesDevice("nccl", "cuda"), "cuda");
  EXPECT_EQ(KvPagesDevice("local", "cuda"), "cuda");
  KvTransportOptions gpu;
  gpu.device = "cuda";
  auto t = CreateKvTransport("tcp", gpu);
  if (t.ok()) {  // A GPU here: tcp over a staged GPU pool.
    EXPECT_NE((*t)->description().find("staged through host memory"), std::string::npos);
  } else {  // No GPU, or no CUDA in this build: said so.
    EXPECT_TRUE(t.status().message().find("GPU") != std::string::npos ||
                t.status().message().find("CUDA") != std::string::npos) << t.status();
  }
  KvTransportOptions cpu;
  for (const char* name : {"cuda_ipc", "nccl"}) {
    auto ipc = CreateKvTransport(name, cpu);
    ASSERT_FALSE(ipc.ok());
    EXPECT_NE(ipc.status().message().find("needs --device cuda"), std::string::npos) << ipc.status();
  }
  gpu.device = "tpu";
  EXPECT_EQ(CreateKvTransport("tcp", gpu).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
