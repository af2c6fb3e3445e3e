#include "common/base/huge_page_arena.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(HugePageArena, HandsOutAlignedPiecesOfOneMapping) {
  HugePageArena arena;
  const size_t sizes[] = {1, 100, 4096, 3 << 20, 7};
  size_t total = 0;
  for (size_t s : sizes) total += HugePageArena::Aligned(s);
  ASSERT_TRUE(arena.Reserve(total).ok());
  char* previous = nullptr;
  for (size_t s : sizes) {
    char* p = static_cast<char*>(arena.Take(s));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    if (previous != nullptr) EXPECT_GT(p, previous);
    std::memset(p, 0xab, s);  // Writable, to the last byte.
    EXPECT_EQ(static_cast<unsigned char>(p[s - 1]), 0xab);
    previous = p;
  }
  // The first piece starts on a 2 MiB boundary, so huge pages can back it; whether the kernel
  // gives them depends on THP (never / madvise / always), so only the bound is asserted.
  EXPECT_LE(arena.HugeBytes(), (total + (2u << 20) - 1) / (2u << 20) * (2u << 20));
}

TEST(HugePageArena, EmptyReservationIsFine) {
  HugePageArena arena;
  EXPECT_TRUE(arena.Reserve(0).ok());
  EXPECT_EQ(arena.HugeBytes(), 0u);
}

TEST(HugePageArena, UnmappableSizeIsAnError) {
  HugePageArena arena;
  const absl::Status s = arena.Reserve(size_t{1} << 62);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(HugePageArena, TakingMoreThanReservedDies) {
  HugePageArena arena;
  ASSERT_TRUE(arena.Reserve(64).ok());
  arena.Take(64);
  // 64 bytes were rounded up to 2 MiB: the reservation still has room; past it, a CHECK fails.
  arena.Take((2u << 20) - 64);
  EXPECT_DEATH(arena.Take(1), "");
}

}  // namespace
}  // namespace pdserve
