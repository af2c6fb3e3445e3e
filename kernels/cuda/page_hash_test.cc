// The page hash kernel (page_hash.h) on the host execution layer against its host twin, and the
// properties the transports rely on: every byte and its position count.
#include "kernels/cuda/page_hash.h"

#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "kernels/cuda/host_exec.h"
#include "kernels/cuda/launch_config.h"

namespace pdserve::cuda {
namespace {

TEST(PageHashTest, KernelEqualsHostTwinOnPagesOfEverySize) {
  SplitMix64 rng(4);
  std::vector<uint8_t> memory(70000);
  for (uint8_t& b : memory) b = static_cast<uint8_t>(rng.Next());
  // Aligned and unaligned starts, sizes with tails, an empty page.
  const std::vector<std::pair<size_t, uint64_t>> spans = {{0, 4096}, {8, 65536}, {3, 1003}, {64, 7}, {128, 0}};
  std::vector<const uint8_t*> pages;
  std::vector<uint64_t> bytes, got(spans.size(), 0);
  for (const auto& [at, n] : spans) {
    pages.push_back(memory.data() + at);
    bytes.push_back(n);
  }
  const LaunchConfig c = PageHashLaunch(static_cast<int>(spans.size()));  // As production launches it.
  host::Launch(host::Grid{c.grid_x, c.grid_y, c.grid_z}, c.threads, c.shared_bytes,
               [&](host::HostCtx& ctx) { PageHashBody(ctx, pages.data(), bytes.data(), got.data()); });
  for (size_t i = 0; i < spans.size(); ++i) EXPECT_EQ(got[i], PageHashHost(pages[i], bytes[i])) << i;
}

TEST(PageHashTest, EveryByteAndItsPlaceCount) {
  std::vector<uint8_t> a(4096, 0);
  const uint64_t zero = PageHashHost(a.data(), a.size());
  EXPECT_NE(zero, PageHashHost(a.data(), a.size() - 8)) << "the length counts";
  for (size_t at : {size_t{0}, size_t{1}, size_t{4095}}) {
    a[at] = 1;
    EXPECT_NE(PageHashHost(a.data(), a.size()), zero) << at;
    a[at] = 0;
  }
  // Two words swapped: the same multiset of words, another hash.
  a[0] = 1;
  const uint64_t first = PageHashHost(a.data(), a.size());
  a[0] = 0;
  a[8] = 1;
  EXPECT_NE(PageHashHost(a.data(), a.size()), first);
}

}  // namespace
}  // namespace pdserve::cuda
