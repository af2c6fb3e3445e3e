#include "common/kvcache/host_tier.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

KvTierKey Key(uint64_t block, uint64_t model = 7) { return {{model, model + 1}, {block, block * 3 + 1}}; }

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

HostTierOptions Budget(int64_t bytes) {
  HostTierOptions o;
  o.budget_bytes = bytes;
  return o;
}

// 5,000-byte blocks take 8 KiB slots: three fit in 24 KiB.
constexpr size_t kBlock = 5000;
constexpr int64_t kThreeSlots = 3 * 8192;

TEST(HostTier, StoresLoadsAndEvictsTheLeastRecentlyUsed) {
  auto tier = HostTier::Create(Budget(kThreeSlots));
  ASSERT_TRUE(tier.ok()) << tier.status();
  HostTier& t = **tier;
  EXPECT_EQ(t.name(), "host");
  EXPECT_STREQ(t.event_medium(), "CPU");
  for (uint8_t b = 1; b <= 3; ++b) ASSERT_TRUE(t.Store(Key(b), Bytes(kBlock, b)).ok());
  EXPECT_FALSE(t.Contains(Key(1, 8)));  // Another model's key.
  std::vector<uint8_t> out(kBlock);
  ASSERT_TRUE(t.Load(Key(1), absl::MakeSpan(out)).ok());  // 1 is now the most recent.
  EXPECT_EQ(out, Bytes(kBlock, 1));
  ASSERT_TRUE(t.Store(Key(4), Bytes(kBlock, 4)).ok());  // No slot free: 2 goes.
  EXPECT_FALSE(t.Contains(Key(2)));
  for (uint8_t b : {1, 3, 4}) {
    EXPECT_TRUE(t.Contains(Key(b)));
    ASSERT_TRUE(t.Load(Key(b), absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, Bytes(kBlock, b)) << int{b};
  }
  EXPECT_EQ(t.Load(Key(2), absl::MakeSpan(out)).code(), absl::StatusCode::kNotFound);
  std::vector<KvTierKey> removed;
  t.TakeRemoved(&removed);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_TRUE(removed[0] == Key(2));
  const std::vector<BlockHash> held = t.Held(Key(0).model);
  EXPECT_EQ(held.size(), 3u);
  const KvTierStats s = t.Stats();
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.bytes, 3 * static_cast<int64_t>(kBlock));
  EXPECT_EQ(s.stores, 4);
  EXPECT_EQ(s.loads, 4);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.corrupt, 0);
}

TEST(HostTier, ACorruptedSlotFailsItsChecksumAndIsNeverUsed) {
  auto tier = HostTier::Create(Budget(kThreeSlots));
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->Store(Key(1), Bytes(kBlock, 1)).ok());
  (*tier)->CorruptForTesting(Key(1));
  std::vector<uint8_t> out(kBlock, 0);
  EXPECT_EQ((*tier)->Load(Key(1), absl::MakeSpan(out)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out, std::vector<uint8_t>(kBlock, 0)) << "nothing of a failing block is handed out";
  EXPECT_FALSE((*tier)->Contains(Key(1)));
  EXPECT_EQ((*tier)->Stats().corrupt, 1);
  // Stored again, it is good again (its slot was freed, not lost).
  ASSERT_TRUE((*tier)->Store(Key(1), Bytes(kBlock, 1)).ok());
  ASSERT_TRUE((*tier)->Load(Key(1), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, Bytes(kBlock, 1));
}

TEST(HostTier, LoadRunStopsAtTheFirstBlockItLacks) {
  auto tier = HostTier::Create(Budget(kThreeSlots));
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->Store(Key(1), Bytes(kBlock, 1)).ok());
  ASSERT_TRUE((*tier)->Store(Key(2), Bytes(kBlock, 2)).ok());
  ASSERT_TRUE((*tier)->Store(Key(4), Bytes(kBlock, 4)).ok());
  const std::vector<KvTierKey> keys = {Key(1), Key(2), Key(3), Key(4)};
  std::vector<std::vector<uint8_t>> got;
  const int64_t n = (*tier)->LoadRun(keys, kBlock, [&](size_t i, absl::Span<const uint8_t> b) {
    EXPECT_EQ(i, got.size());
    got.emplace_back(b.begin(), b.end());
  });
  EXPECT_EQ(n, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], Bytes(kBlock, 1));
  EXPECT_EQ(got[1], Bytes(kBlock, 2));
}

TEST(HostTier, RefusesBlocksOfAnotherSizeAndBadBudgetsNamingTheFlag) {
  auto none = HostTier::Create(Budget(0));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("--kv-offload-host-gib"), std::string::npos) << none.status();
  auto tier = HostTier::Create(Budget(kThreeSlots));
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->Store(Key(1), Bytes(kBlock, 1)).ok());
  const absl::Status other = (*tier)->Store(Key(2), Bytes(kBlock + 1, 2));
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("5001"), std::string::npos) << other;
  std::vector<uint8_t> out(kBlock + 1);
  EXPECT_FALSE((*tier)->Load(Key(1), absl::MakeSpan(out)).ok()) << "a load of another size is a miss";
  auto small = HostTier::Create(Budget(4096));
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)->Store(Key(1), Bytes(kBlock, 1)).code(), absl::StatusCode::kResourceExhausted);
}

// The pin hook stands in for cudaHostRegister (no GPU here): called once on the whole mapping,
// undone at the end; a failure is an error naming the flag.
TEST(HostTier, PinsItsMemoryOnceAndUnpinsIt) {
  std::vector<std::pair<void*, size_t>> pinned;
  std::vector<void*> unpinned;
  {
    HostTierOptions o;
    o.budget_bytes = kThreeSlots;
    o.pin = [&](void* p, size_t n) {
      pinned.emplace_back(p, n);
      return absl::OkStatus();
    };
    o.unpin = [&](void* p) { unpinned.push_back(p); };
    auto tier = HostTier::Create(o);
    ASSERT_TRUE(tier.ok());
    ASSERT_EQ(pinned.size(), 1u);
    EXPECT_EQ(pinned[0].second, static_cast<size_t>(kThreeSlots));
    ASSERT_TRUE((*tier)->Store(Key(1), Bytes(kBlock, 1)).ok());
  }
  ASSERT_EQ(unpinned.size(), 1u);
  EXPECT_EQ(unpinned[0], pinned[0].first);
  HostTierOptions failing;
  failing.budget_bytes = kThreeSlots;
  failing.pin = [](void*, size_t) { return absl::ResourceExhaustedError("out of pinnable memory"); };
  auto tier = HostTier::Create(failing);
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.status().message().find("--kv-offload-host-gib"), std::string::npos) << tier.status();
  EXPECT_NE(tier.status().message().find("out of pinnable memory"), std::string::npos) << tier.status();
}

// Two engines' I/O threads share a tier: every block loaded is the one stored under its key.
TEST(HostTier, EnginesSharingTheTierReadOnlyWhatWasStoredUnderTheKey) {
  auto tier = HostTier::Create(Budget(16 * 8192));
  ASSERT_TRUE(tier.ok());
  HostTier& t = **tier;
  auto worker = [&](uint64_t first) {
    std::vector<uint8_t> out(kBlock);
    for (int round = 0; round < 400; ++round) {
      const uint64_t b = first + static_cast<uint64_t>(round % 40);
      (void)t.Store(Key(b), Bytes(kBlock, static_cast<uint8_t>(b)));
      const uint64_t other = first + static_cast<uint64_t>((round * 7) % 40);
      if (t.Load(Key(other), absl::MakeSpan(out)).ok()) {
        ASSERT_EQ(out, Bytes(kBlock, static_cast<uint8_t>(other))) << other;
      }
    }
  };
  std::thread a(worker, 0), b(worker, 20);
  a.join();
  b.join();
  const KvTierStats s = t.Stats();
  EXPECT_EQ(s.blocks, 16);
  EXPECT_EQ(s.corrupt, 0);
  EXPECT_GT(s.evictions, 0);
}

}  // namespace
}  // namespace pdserve
