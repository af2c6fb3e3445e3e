// The shape of a KV pool. Both ends of a KV transfer must agree on it (the handshake compares it).
#ifndef PDSERVE_COMMON_KVCACHE_KV_CACHE_SPEC_H_
#define PDSERVE_COMMON_KVCACHE_KV_CACHE_SPEC_H_

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"

namespace pdserve {

struct KvCacheSpec {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
  DType dtype = DType::kF32;  // kF32 or kBF16 for the pool.

  // One (layer, block) page: [K|V][kv_head][slot][head_dim].
  size_t PageBytes() const {
    return static_cast<size_t>(2 * num_kv_heads * block_size * head_dim) * DTypeSize(dtype);
  }
  // All layers of one block.
  size_t BlockBytes() const { return PageBytes() * static_cast<size_t>(num_layers); }
  // K and V of one token over all layers (GQA-aware: kv heads, not attention heads).
  size_t BytesPerToken() const {
    return static_cast<size_t>(2 * num_layers * num_kv_heads * head_dim) * DTypeSize(dtype);
  }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_KV_CACHE_SPEC_H_
