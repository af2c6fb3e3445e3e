// Software prefetch of a sequence's KV rows ahead of the attention kernels' key loops (internal
// to kernels/cpu). The hardware prefetchers stop at 4 KiB pages and one head's rows of a block
// are a few KiB at most, so without it every block's rows began with misses to DRAM: decode
// attention over an out-of-cache context ran at 5-7 GB/s on one thread, 10-17 with it
// (bench/RESULTS.md).
#ifndef PDSERVE_KERNELS_CPU_KV_PREFETCH_H_
#define PDSERVE_KERNELS_CPU_KV_PREFETCH_H_

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace pdserve::kernels {

// How far ahead of the rows they read the key loops prefetch (positions).
inline constexpr int64_t kPrefetchAhead = 32;

inline void PrefetchL2(const void* p) {
  // A volatile asm: GCC deletes a loop whose only effect is __builtin_prefetch (a loop without
  // side effects may be assumed away), which emptied the first version of this at -O3.
#if defined(__x86_64__)
  __asm__ volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// The rows of one head at positions [first, min(first + count, end)) as spans of contiguous
// bytes, one per block touched: fn(block, first slot, rows, first row's address).
template <typename Fn>
inline void ForEachRowSpan(const KvPagesView& view, const int32_t* table, int64_t row_head,
                           int64_t first, int64_t count, int64_t end, Fn&& fn) {
  const int64_t stop = first + count < end ? first + count : end;
  const int64_t bs = view.block_size;
  const bool pow2 = (bs & (bs - 1)) == 0;  // The usual case: shifts, not two divisions.
  const int shift = __builtin_ctzll(static_cast<unsigned long long>(bs));
  for (int64_t p = first; p < stop;) {
    const int32_t block = table[pow2 ? p >> shift : p / bs];
    const int64_t slot = pow2 ? p & (bs - 1) : p % bs;
    const int64_t rows = bs - slot < stop - p ? bs - slot : stop - p;
    fn(block, slot, rows, view.Key(block, row_head, slot));
    p += rows;
  }
}

// Prefetches into L2 the rows (and row scales) of one head at positions [first, min(first +
// count, end)): `row_head` is a KV head for keys, num_kv_heads + that head for values. Inline,
// with no call: a call in the key loops made the compiler keep their accumulators in memory.
inline void PrefetchRows(const KvPagesView& view, const int32_t* table, int64_t row_head,
                         int64_t first, int64_t count, int64_t end) {
  ForEachRowSpan(view, table, row_head, first, count, end,
                 [&](int32_t block, int64_t slot, int64_t rows, const uint8_t* row) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(row);
    const uintptr_t hi = lo + static_cast<uintptr_t>(rows) * view.RowBytes();
    for (uintptr_t line = lo & ~uintptr_t{63}; line < hi; line += 64) {
      PrefetchL2(reinterpret_cast<const void*>(line));
    }
    if (KvDTypeQuantized(view.dtype)) PrefetchL2(view.KeyScale(block, row_head, slot));
  });
}

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_KV_PREFETCH_H_
