// The checksum of KV pages moved between GPU pools, computed where the pages are (a kernel on
// each side; PageHashHost is its host twin and the host execution tests' reference).
//
// hash(page) = Mix(sum over 8-byte words w_i of Mix(w_i ^ (i * kOdd)) + bytes): a sum mod 2^64,
// so any reduction order gives the same value, and every word's position counts. The tail of a
// page that is not a multiple of 8 bytes is read as a zero-padded word. Not cryptographic: it
// catches corruption and misplaced pages, as the XXH3 of the tcp transport does.
#ifndef PDSERVE_KERNELS_CUDA_PAGE_HASH_H_
#define PDSERVE_KERNELS_CUDA_PAGE_HASH_H_

#include <cstdint>
#include <cstring>

#include "kernels/cuda/dialect.h"

namespace pdserve::cuda {

inline constexpr uint64_t kPageHashOdd = 0x9e3779b97f4a7c15ull;

PD_HD uint64_t PageHashMix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Word i of a page of `bytes` bytes (the last one zero-padded).
PD_HD uint64_t PageWord(const uint8_t* page, uint64_t bytes, uint64_t i) {
  uint64_t w = 0;
  const uint64_t at = i * 8;
  if (at + 8 <= bytes && reinterpret_cast<uintptr_t>(page) % 8 == 0) {
    return *reinterpret_cast<const uint64_t*>(page + at);  // Little-endian: the same value.
  }
  if (at + 8 <= bytes) {
    for (int b = 0; b < 8; ++b) w |= static_cast<uint64_t>(page[at + b]) << (8 * b);
  } else {
    for (uint64_t b = 0; at + b < bytes; ++b) w |= static_cast<uint64_t>(page[at + b]) << (8 * b);
  }
  return w;
}

PD_HD uint64_t PageWordTerm(const uint8_t* page, uint64_t bytes, uint64_t i) {
  return PageHashMix(PageWord(page, bytes, i) ^ (i * kPageHashOdd));
}

PD_HD uint64_t PageHashFinish(uint64_t sum, uint64_t bytes) { return PageHashMix(sum + bytes); }

inline uint64_t PageHashHost(const uint8_t* page, uint64_t bytes) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < (bytes + 7) / 8; ++i) sum += PageWordTerm(page, bytes, i);
  return PageHashFinish(sum, bytes);
}

// Kernel body: grid (pages); block threads sum their words, then a shared-memory tree (64-bit
// values through two 32-bit halves would need shuffles of both; shared memory is simpler).
// Shared memory: threads * 8 bytes.
template <typename Ctx>
PD_DEVICE void PageHashBody(Ctx& ctx, const uint8_t* const* pages, const uint64_t* bytes,
                            uint64_t* out) {
  uint64_t* partial = ctx.template shared<uint64_t>();
  const int p = ctx.block(0);
  const uint64_t n = bytes[p], words = (n + 7) / 8;
  uint64_t sum = 0;
  for (uint64_t i = ctx.thread(); i < words; i += ctx.threads()) sum += PageWordTerm(pages[p], n, i);
  partial[ctx.thread()] = sum;
  ctx.sync();
  if (ctx.thread() == 0) {
    uint64_t total = 0;
    for (int t = 0; t < ctx.threads(); ++t) total += partial[t];
    out[p] = PageHashFinish(total, n);
  }
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_PAGE_HASH_H_
