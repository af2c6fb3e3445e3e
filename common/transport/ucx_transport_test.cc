// What only the one-sided `ucx` backend has to get right, over UCX's shared-memory and TCP
// transports: pages the receiver gave up may still be put by the sender, so their blocks are
// reported quiescent only once the sender flushed (or is gone); out-of-range copies are refused by
// the sender before they are posted; large page lists; lost peers; stalled peers.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/transport/kv_transport.h"
#include "common/transport/receive_tracker.h"
#include "common/transport/shared_memory_pool_device.h"
#include "common/transport/staging_transport.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;

constexpr char kLayout[] = "model=m1;block_size=16;kv_dtype=f32;layout=layer,block,kv,head,slot,dim";

template <typename Predicate>
bool WaitFor(Predicate done, std::chrono::milliseconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Finish's outcome. Its callback runs on a transport thread, possibly after the test body gave up
// waiting, so the slot is shared.
struct Finished {
  std::mutex mu;
  std::optional<absl::StatusOr<TransferStats>> result;
};

std::shared_ptr<Finished> FinishWatched(KvTransport& sender, const std::string& endpoint,
                                        uint64_t tag) {
  auto f = std::make_shared<Finished>();
  sender.Finish(endpoint, tag, [f](absl::StatusOr<TransferStats> s) {
    std::lock_guard<std::mutex> lock(f->mu);
    f->result = std::move(s);
  });
  return f;
}

// What Finish reported, or nullopt when its callback did not run within `limit`.
std::optional<absl::StatusOr<TransferStats>> WaitFinished(Finished& f,
                                                          std::chrono::milliseconds limit = 20s) {
  WaitFor([&] {
    std::lock_guard<std::mutex> lock(f.mu);
    return f.result.has_value();
  }, limit);
  std::lock_guard<std::mutex> lock(f.mu);
  return f.result;
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", GetParam() == "sm" ? "sm,self" : "tcp,self", 1);
    src_.resize(1 << 20);
    dst_.assign(1 << 20, 0);
    for (size_t i = 0; i < src_.size(); ++i) src_[i] = static_cast<uint8_t>(i * 13 + 5);
    sender_ = Make(src_);
    receiver_ = Make(dst_);
  }
  void TearDown() override {
    SetStallKvPageForTesting(0, 0);
    SetCorruptKvPageForTesting(0);
  }
  std::unique_ptr<KvTransport> Make(std::vector<uint8_t>& pool, int64_t timeout_ms = 30000) {
    KvTransportOptions o;
    o.layout = kLayout;
    o.send_timeout_ms = timeout_ms;
    auto t = CreateKvTransport("ucx", o);
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE((*t)->RegisterPool(pool.data(), pool.size()).ok());
    return std::move(*t);
  }
  TransferPoll WaitPoll(uint64_t tag) {
    WaitFor([&] { return receiver_->Poll(tag).state != TransferState::kPending; });
    return receiver_->Poll(tag);
  }

  std::vector<uint8_t> src_, dst_;
  std::unique_ptr<KvTransport> sender_, receiver_;
};

TEST_P(UcxTransportTest, DescriptionNamesTheTransportsInUse) {
  const std::string d = receiver_->description();
  EXPECT_EQ(d.rfind("ucx(", 0), 0u) << d;
  EXPECT_NE(d.find(GetParam() == "sm" ? "memory" : "tcp/"), std::string::npos) << d;
  EXPECT_EQ(receiver_->endpoint().rfind("ucx:", 0), 0u);
}

TEST_P(UcxTransportTest, ThousandsOfPagesInOneTransfer) {
  // 4,096 pages of 128 bytes scattered over the pool: a page list far beyond an eager message,
  // puts coalesced where pages are contiguous on both sides, hashed in the sender's order.
  std::vector<PageCopy> pages;
  std::vector<ByteRange> allowed;
  for (uint64_t i = 0; i < 4096; ++i) {
    const uint64_t dst = (i % 2 == 0 ? i : 8191 - i) * 128;
    pages.push_back({i * 128, dst, 128});
    allowed.push_back({dst, dst + 128});
  }
  ASSERT_TRUE(receiver_->Expect(3, allowed).ok());
  for (size_t i = 0; i < pages.size(); i += 512) {
    ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 3, {pages.data() + i, 512}).ok());
  }
  auto finished = FinishWatched(*sender_, receiver_->endpoint(), 3);
  const TransferPoll p = WaitPoll(3);
  ASSERT_EQ(p.state, TransferState::kDone) << p.status;
  const auto sent = WaitFinished(*finished);
  ASSERT_TRUE(sent.has_value()) << "Finish's callback never ran";
  ASSERT_TRUE(sent->ok()) << sent->status();
  EXPECT_EQ(p.stats.pages, 4096);
  EXPECT_EQ(p.stats.bytes, 4096 * 128);
  EXPECT_EQ(p.stats.checksum, (*sent)->checksum);
  for (const PageCopy& page : pages) {
    ASSERT_EQ(std::memcmp(&dst_[page.dst_offset], &src_[page.src_offset], page.bytes), 0);
  }
}

TEST_P(UcxTransportTest, LongScatteredTransferLandsAndIsHashedInOrder) {
  // 24 MiB in 1,024 pages of 24 KiB, destinations in a shuffled block order (no two pages
  // coalesce): 1,024 puts, a 16 KiB page list fetched by rendezvous, hashed in the sender's order.
  constexpr uint64_t kPage = 24576, kPages = 1024;
  std::vector<uint8_t> src(kPage * kPages), dst(kPage * kPages, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 11);
  auto sender = Make(src);
  auto receiver = Make(dst);
  std::vector<PageCopy> pages;
  for (uint64_t i = 0; i < kPages; ++i) {
    const uint64_t block = (i * 389) % kPages;  // A permutation: 389 is prime to 1,024.
    pages.push_back({i * kPage, block * kPage, kPage});
  }
  ASSERT_TRUE(receiver->Expect(12, {{0, kPage * kPages}}).ok());
  for (size_t i = 0; i < pages.size(); i += 64) {
    ASSERT_TRUE(sender->Submit(receiver->endpoint(), 12, {pages.data() + i, 64}).ok());
  }
  auto finished = FinishWatched(*sender, receiver->endpoint(), 12);
  WaitFor([&] { return receiver->Poll(12).state != TransferState::kPending; }, 60s);
  const TransferPoll p = receiver->Poll(12);
  ASSERT_EQ(p.state, TransferState::kDone) << p.status;
  const auto sent = WaitFinished(*finished);
  ASSERT_TRUE(sent.has_value()) << "Finish's callback never ran";
  ASSERT_TRUE(sent->ok()) << sent->status();
  EXPECT_EQ(p.stats.pages, static_cast<int64_t>(kPages));
  EXPECT_EQ(p.stats.checksum, (*sent)->checksum);
  for (const PageCopy& page : pages) {
    ASSERT_EQ(std::memcmp(&dst[page.dst_offset], &src[page.src_offset], page.bytes), 0);
  }
}

TEST_P(UcxTransportTest, CorruptedPageIsRefusedByTheChecksum) {
  ASSERT_TRUE(receiver_->Expect(4, {{0, 65536}}).ok());
  SetCorruptKvPageForTesting(2);
  std::vector<PageCopy> pages = {{0, 0, 4096}, {4096, 4096, 4096}, {8192, 8192, 4096}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 4, pages).ok());
  sender_->Finish(receiver_->endpoint(), 4, [](absl::StatusOr<TransferStats>) {});
  const TransferPoll p = WaitPoll(4);
  EXPECT_EQ(p.state, TransferState::kFailed);
  EXPECT_EQ(p.status.code(), absl::StatusCode::kDataLoss) << p.status;
}

TEST_P(UcxTransportTest, OutOfRangeCopyIsNeverPosted) {
  // The remote key covers the whole pool; the sender checks GO's ranges before each put.
  ASSERT_TRUE(receiver_->Expect(5, {{0, 4096}}).ok());
  std::vector<PageCopy> pages = {{0, 0, 4096}, {4096, 65536, 4096}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 5, pages).ok());
  auto finished = FinishWatched(*sender_, receiver_->endpoint(), 5);
  const TransferPoll p = WaitPoll(5);
  EXPECT_EQ(p.state, TransferState::kFailed);
  EXPECT_EQ(p.status.code(), absl::StatusCode::kPermissionDenied) << p.status;
  const auto sent = WaitFinished(*finished);
  ASSERT_TRUE(sent.has_value()) << "Finish's callback never ran";
  EXPECT_EQ(sent->status().code(), absl::StatusCode::kPermissionDenied);
  for (size_t i = 65536; i < 65536 + 4096; ++i) ASSERT_EQ(dst_[i], 0) << i;
}

TEST_P(UcxTransportTest, ReleasedBeforeTheSenderBeganIsQuiescentAtOnceAndRefused) {
  ASSERT_TRUE(receiver_->Expect(6, {{0, 8192}}).ok());
  bool called = false;
  EXPECT_TRUE(receiver_->ReleaseUnfinished(6, [&] { called = true; }));
  EXPECT_FALSE(called);
  std::vector<PageCopy> pages = {{0, 0, 4096}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 6, pages).ok());
  const auto sent = WaitFinished(*FinishWatched(*sender_, receiver_->endpoint(), 6));
  ASSERT_TRUE(sent.has_value()) << "Finish's callback never ran";
  EXPECT_EQ(sent->status().code(), absl::StatusCode::kFailedPrecondition);
  for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(dst_[i], 0) << i;
}

TEST_P(UcxTransportTest, GivenUpTransferIsQuiescentOnlyAfterTheStalledSenderFlushed) {
  // The sender freezes for 600 ms before its second page; the receiver gives the transfer up
  // meanwhile. The late put still lands, so the blocks must stay quarantined until then.
  ASSERT_TRUE(receiver_->Expect(7, {{0, 8192}}).ok());
  SetStallKvPageForTesting(2, 600);
  std::vector<PageCopy> pages = {{0, 0, 4096}, {100000, 4096, 4096}};
  ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 7, pages).ok());
  auto finished = FinishWatched(*sender_, receiver_->endpoint(), 7);
  ASSERT_TRUE(WaitFor([&] { return dst_[0] != 0; }, 10s)) << "the first page never landed";
  std::atomic<bool> quiesced{false};
  std::atomic<bool> late_page_was_there{false};
  const bool at_once = receiver_->ReleaseUnfinished(7, [&] {
    late_page_was_there = std::memcmp(&dst_[4096], &src_[100000], 4096) == 0;
    quiesced = true;
  });
  EXPECT_FALSE(at_once);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(quiesced.load()) << "reported quiescent while the sender still had a page to put";
  ASSERT_TRUE(WaitFor([&] { return quiesced.load(); }, 10s));
  EXPECT_TRUE(late_page_was_there.load()) << "quiescent before the late put had landed";
  const auto sent = WaitFinished(*finished);
  ASSERT_TRUE(sent.has_value()) << "Finish's callback never ran";
  // The sender either saw the CANCEL before its flush (Cancelled) or had already flushed and sent
  // its end (OK); both are quiescent for the receiver.
  EXPECT_TRUE(sent->ok() || sent->status().code() == absl::StatusCode::kCancelled) << sent->status();
}

// ucx for GPU pools (--device cuda --transport ucx): the puts land in host mirrors and the pages
// reach the receiver's pool (shared memory standing in for GPU memory: TEST INFRASTRUCTURE) only
// once the transfer is complete; a given-up transfer's quarantine is ucx's own, passed through.
TEST_P(UcxTransportTest, GpuPoolsStagedThroughHostMemory) {
  auto device_pool = [] {
    auto p = AllocateSharedPool(1 << 20);
    EXPECT_TRUE(p.ok());
    return std::move(*p);
  };
  auto src = device_pool(), dst = device_pool();
  for (size_t i = 0; i < (1 << 20); ++i) src->data[i] = static_cast<uint8_t>(i * 7 + 3);
  auto staged = [&](SharedPool& pool) {
    KvTransportOptions o;
    o.layout = kLayout;
    auto t = CreateKvTransport("ucx", o);
    EXPECT_TRUE(t.ok()) << t.status();
    auto s = CreateStagingKvTransport(std::move(*t), CreateSharedMemoryPoolDevice());
    EXPECT_TRUE(s->RegisterPool(pool.data, 1 << 20).ok());
    return s;
  };
  auto sender = staged(*src), receiver = staged(*dst);
  ASSERT_TRUE(receiver->Expect(20, {{65536, 65536 + 8192}}).ok());
  const std::vector<PageCopy> pages = {{4096, 65536, 4096}, {300000, 69632, 4096}};
  ASSERT_TRUE(sender->Submit(receiver->endpoint(), 20, pages).ok());
  auto finished = FinishWatched(*sender, receiver->endpoint(), 20);
  ASSERT_TRUE(WaitFor([&] { return receiver->Poll(20).state != TransferState::kPending; }));
  ASSERT_EQ(receiver->Poll(20).state, TransferState::kDone) << receiver->Poll(20).status;
  for (const PageCopy& p : pages) {
    EXPECT_EQ(std::memcmp(dst->data + p.dst_offset, src->data + p.src_offset, p.bytes), 0);
  }
  const auto sent = WaitFinished(*finished);
  ASSERT_TRUE(sent.has_value() && sent->ok());
  receiver->Release(20);
  // Given up before its end: the pool is not written, and ucx's quarantine answer comes through.
  ASSERT_TRUE(receiver->Expect(21, {{131072, 135168}}).ok());
  SetStallKvPageForTesting(1, 400);
  const std::vector<PageCopy> late = {{8192, 131072, 4096}};
  ASSERT_TRUE(sender->Submit(receiver->endpoint(), 21, late).ok());
  auto finished_late = FinishWatched(*sender, receiver->endpoint(), 21);
  std::atomic<bool> quiesced{false};
  if (!receiver->ReleaseUnfinished(21, [&] { quiesced = true; })) {
    ASSERT_TRUE(WaitFor([&] { return quiesced.load(); }, 10s));
  }
  (void)WaitFinished(*finished_late);
  for (size_t i = 131072; i < 135168; ++i) ASSERT_EQ(dst->data[i], 0) << i;
}

TEST_P(UcxTransportTest, LostSenderFailsTheTransferAndQuiesces) {
  ASSERT_TRUE(receiver_->Expect(8, {{0, 8192}}).ok());
  ASSERT_TRUE(receiver_->Expect(9, {{8192, 16384}}).ok());
  {
    std::vector<PageCopy> pages = {{0, 0, 4096}};
    ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 8, pages).ok());
    std::vector<PageCopy> more = {{0, 8192, 4096}};
    ASSERT_TRUE(sender_->Submit(receiver_->endpoint(), 9, more).ok());
    ASSERT_TRUE(WaitFor([&] { return dst_[0] != 0 && dst_[8192] != 0; }, 10s));
    sender_.reset();  // Dies without finishing: its endpoints close.
  }
  std::atomic<bool> quiesced{false};
  if (!receiver_->ReleaseUnfinished(9, [&] { quiesced = true; })) {
    ASSERT_TRUE(WaitFor([&] { return quiesced.load(); }, 15s));
  }
  const TransferPoll p = WaitPoll(8);
  EXPECT_EQ(p.state, TransferState::kFailed);
  EXPECT_EQ(p.status.code(), absl::StatusCode::kUnavailable) << p.status;
}

TEST_P(UcxTransportTest, LostReceiverFailsTheSendersFinish) {
  std::vector<uint8_t> pool(1 << 16);
  auto receiver = Make(pool);
  ASSERT_TRUE(receiver->Expect(10, {{0, 8192}}).ok());
  const std::string endpoint = receiver->endpoint();
  receiver.reset();
  // A 2 s send timeout bounds the wait whatever UCX notices of the dead peer.
  auto sender = Make(src_, 2000);
  std::vector<PageCopy> pages = {{0, 0, 4096}};
  ASSERT_TRUE(sender->Submit(endpoint, 10, pages).ok());
  const auto sent = WaitFinished(*FinishWatched(*sender, endpoint, 10));
  ASSERT_TRUE(sent.has_value()) << "Finish never answered";
  EXPECT_FALSE(sent->ok());
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxTransportTest, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve
