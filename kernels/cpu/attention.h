// Paged attention on the CPU: keys and values live in fixed-size blocks of a KV pool, found
// through a per-sequence block table. Layout of one (layer, block) page, contiguous so it can be
// sent as one piece: [K|V][kv_head][slot][head_dim].
//
// Every query row is computed on its own with a fixed operation order (scores, max, exp, sum,
// weighted sum of V), so the result does not depend on chunking or batching.
//
// Quantized pools are read in place, never through a full-precision copy: a score is
// (dot(q, codes) * key_scale) * scale, and a value row is accumulated as
// fma(p * value_scale, code, acc), each in the same order on every path.
#ifndef PDSERVE_KERNELS_CPU_ATTENTION_H_
#define PDSERVE_KERNELS_CPU_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"

namespace pdserve::kernels {

// One layer's pages of a KV pool (dtype f32, bf16, int8 or int4; see KvCacheSpec for the page).
struct KvPagesView {
  uint8_t* layer_base = nullptr;  // Page of block b starts at layer_base + b * page_bytes.
  size_t page_bytes = 0;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  KvDType dtype = KvDType::kF32;

  size_t RowBytes() const { return static_cast<size_t>(head_dim * KvDTypeBits(dtype) / 8); }
  uint8_t* Key(int32_t block, int64_t head, int64_t slot) const {
    return layer_base + block * page_bytes + static_cast<size_t>(head * block_size + slot) * RowBytes();
  }
  uint8_t* Value(int32_t block, int64_t head, int64_t slot) const {
    return Key(block, num_kv_heads + head, slot);
  }
  // Quantized dtypes: the row's scale, after the page's 2 * num_kv_heads * block_size rows.
  float* KeyScale(int32_t block, int64_t head, int64_t slot) const {
    uint8_t* scales = layer_base + block * page_bytes +
                      static_cast<size_t>(2 * num_kv_heads * block_size) * RowBytes();
    return reinterpret_cast<float*>(scales) + head * block_size + slot;
  }
  float* ValueScale(int32_t block, int64_t head, int64_t slot) const {
    return KeyScale(block, num_kv_heads + head, slot);
  }
};

// Walks positions start, start + 1, ... of a sequence's block table as (block, slot) without a
// division per position (the kernels' key loops were spending more time dividing by block_size
// than multiplying, bench/RESULTS.md).
class SlotCursor {
 public:
  SlotCursor(const int32_t* block_table, int64_t block_size, int64_t start)
      : table_(block_table),
        block_size_(block_size),
        index_(start / block_size),
        slot_(start % block_size) {}
  int32_t block() const { return table_[index_]; }
  int64_t slot() const { return slot_; }
  void Next() {
    if (++slot_ == block_size_) {
      slot_ = 0;
      ++index_;
    }
  }

 private:
  const int32_t* table_;
  int64_t block_size_;
  int64_t index_;
  int64_t slot_;
};

// Writes one token's k and v ([num_kv_heads][head_dim] each) at `position` of the sequence whose
// blocks are `block_table`, quantizing them for int8/int4 pools (kv_quant.h: one scale per row;
// a row holding inf or NaN gets a NaN scale, so attention over it is NaN as over an f32 pool).
// Cost: 2 * kv_heads * head_dim elements written.
void StoreKv(const KvPagesView& view, const int32_t* block_table, int64_t position,
             const float* k, const float* v);

// Attention output of query heads [head_begin, head_end) of one token at `position`, attending to
// keys in [max(0, position - window + 1), position] (window <= 0: all). q and out are
// [num_heads][head_dim]; scratch holds at least position + 1 floats.
// Cost: reads (position+1) K and V rows per kv head; 4 * ctx * head_dim flops per query head.
void PagedAttention(const KvPagesView& view, const int32_t* block_table, int64_t position,
                    int64_t window, const float* q, int64_t num_heads, float scale,
                    int64_t head_begin, int64_t head_end, float* out, float* scratch);

// The same for every query head that shares KV head `kv_head` (num_heads / num_kv_heads of them),
// bitwise equal to PagedAttention over those heads. Where the CPU has AVX-512 and head_dim is a
// multiple of 64, each key and value is read once for the group instead of once per head.
// scratch holds at least (num_heads / num_kv_heads) * (position + 1) floats.
void PagedAttentionKvGroup(const KvPagesView& view, const int32_t* block_table, int64_t position,
                           int64_t window, const float* q, int64_t num_heads, float scale,
                           int64_t kv_head, float* out, float* scratch);

namespace internal {
// In place: s[i] = exp(s[i] - max(s)) for i in [0, n); returns 1 / their sum (in 8 lanes by i % 8,
// then a fixed tree). The softmax of the f32 and the bf16 attention.
float Softmax(float* s, int64_t n);
}  // namespace internal

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_ATTENTION_H_
