#include "common/base/huge_page_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/base/check.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

HugePageArena::~HugePageArena() {
  if (base_ != nullptr) munmap(base_, size_);
}

absl::Status HugePageArena::Reserve(size_t bytes, bool huge_pages) {
  PD_CHECK(base_ == nullptr);
  if (bytes == 0) return absl::OkStatus();
  size_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Over-map by one huge page and trim, so the region starts on a 2 MiB boundary.
  void* raw = mmap(nullptr, size_ + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (raw == MAP_FAILED) {
    const size_t want = size_;
    size_ = 0;
    return absl::ResourceExhaustedError(Str("cannot map ", want >> 20, " MiB: ", std::strerror(errno)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size_ + kHugePage;
  if (end > aligned + size_) munmap(reinterpret_cast<void*>(aligned + size_), end - aligned - size_);
  base_ = reinterpret_cast<char*>(aligned);
  // Advice only: without THP the memory is still fine.
  madvise(base_, size_, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return absl::OkStatus();
}

void* HugePageArena::Take(size_t bytes) {
  const size_t n = Aligned(bytes);
  PD_CHECK(used_ + n <= size_);
  void* p = base_ + used_;
  used_ += n;
  return p;
}

size_t HugePageArena::HugeBytes() const {
  if (base_ == nullptr) return 0;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base_), hi = lo + size_;
  size_t total = 0;
  while (std::getline(smaps, line)) {
    unsigned long a, b;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find(':') > line.find('-')) {
      inside = a < hi && b > lo;
      continue;
    }
    size_t kb;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %zu kB", &kb) == 1) total += kb << 10;
  }
  return total;
}

}  // namespace pdserve
