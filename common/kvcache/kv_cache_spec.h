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
  KvDType dtype = KvDType::kF32;

  // One token's K (or V) of one kv head: head_dim elements.
  size_t RowBytes() const { return static_cast<size_t>(head_dim * KvDTypeBits(dtype) / 8); }
  // Per row of a quantized pool: one f32 scale.
  size_t RowScaleBytes() const { return KvDTypeQuantized(dtype) ? sizeof(float) : 0; }
  // One (layer, block) page: rows [K|V][kv_head][slot] of head_dim elements, then (quantized
  // dtypes) their scales in the same order, so a page carries everything needed to read it.
  size_t PageBytes() const {
    return static_cast<size_t>(2 * num_kv_heads * block_size) * (RowBytes() + RowScaleBytes());
  }
  // Offset of the scales inside a page (= the size of the codes).
  size_t PageScalesOffset() const {
    return static_cast<size_t>(2 * num_kv_heads * block_size) * RowBytes();
  }
  // All layers of one block.
  size_t BlockBytes() const { return PageBytes() * static_cast<size_t>(num_layers); }
  // K and V of one token over all layers (GQA-aware: kv heads, not attention heads), scales
  // included: BlockBytes() / block_size.
  size_t BytesPerToken() const {
    return static_cast<size_t>(2 * num_layers * num_kv_heads) * (RowBytes() + RowScaleBytes());
  }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_KV_CACHE_SPEC_H_
