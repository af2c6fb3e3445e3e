// One anonymous mapping handed out in 64-byte-aligned pieces, asking the kernel for transparent
// huge pages (MADV_HUGEPAGE): the model runner's copies of weight matrices live here, so a decode
// step that streams them walks 2 MiB pages instead of 4 KiB ones. Where THP is off, or the
// kernel finds no huge page, it is ordinary memory.
#ifndef PDSERVE_COMMON_BASE_HUGE_PAGE_ARENA_H_
#define PDSERVE_COMMON_BASE_HUGE_PAGE_ARENA_H_

#include <cstddef>

#include "absl/status/status.h"

namespace pdserve {

class HugePageArena {
 public:
  HugePageArena() = default;
  ~HugePageArena();
  HugePageArena(const HugePageArena&) = delete;
  HugePageArena& operator=(const HugePageArena&) = delete;

  static size_t Aligned(size_t bytes) { return (bytes + 63) & ~size_t{63}; }
  // Maps `bytes` (rounded up to 2 MiB; nothing for 0), asking for huge pages or, with
  // `huge_pages` false, for none. Call once, before Take. ResourceExhausted when the memory
  // cannot be mapped.
  absl::Status Reserve(size_t bytes, bool huge_pages = true);
  // The next Aligned(bytes) of the reservation; the caller sized Reserve for every Take.
  void* Take(size_t bytes);
  // Bytes of the reservation the kernel backs with huge pages now (from /proc/self/smaps).
  size_t HugeBytes() const;

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
  size_t used_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_HUGE_PAGE_ARENA_H_
