#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/kv_prefetch.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

// In place: s[i] = exp(s[i] - max); returns the sum (8-lane order).
float ExpAndSum(float* s, int64_t n, float max) {
  int64_t i = 0;
#if PDSERVE_AVX2
  const __m256 mv = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  if (Avx512Enabled()) i = ExpAndSumAvx512(s, n, max, &acc);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = HorizontalSum(acc);
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) {
      s[i + l] = ExpScalar(s[i + l] - max);
      lane[l] += s[i + l];
    }
  float sum = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
#endif
  for (; i < n; ++i) {
    s[i] = ExpScalar(s[i] - max);
    sum += s[i];
  }
  return sum;
}

// scores[j] = dot(q, K[start + j]) (* key scale) * scale for j in [from, n), one key at a time.
template <KvDType D>
void ScoresOneByOne(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                    int64_t from, int64_t n, const float* q, float scale, float* scores) {
  SlotCursor cursor(table, view.block_size, start + from);
  for (int64_t j = from; j < n; ++j, cursor.Next()) {
    const int32_t block = cursor.block();
    const int64_t slot = cursor.slot();
    float s = DotF32<KvRow<D>>(q, view.Key(block, kvh, slot), view.head_dim);
    if constexpr (KvRow<D>::kScaled) s *= *view.KeyScale(block, kvh, slot);
    scores[j] = s * scale;
  }
}

}  // namespace

// The max is exact in any order, so 8 lanes find it: one dependent max per element was a third
// of the softmax's time. A NaN score, or a max that is not finite (+inf, or every score -inf),
// makes the whole row NaN, as torch's softmax does; MAXPS alone would drop a NaN or keep it
// depending on its lane.
float internal::Softmax(float* s, int64_t n) {
  float max = -INFINITY;
  bool nan = false;
  int64_t i = 0;
#if PDSERVE_AVX2
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(s);
    __m256 unordered = _mm256_cmp_ps(m, m, _CMP_UNORD_Q);
    for (i = 8; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(s + i);
      m = _mm256_max_ps(m, x);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    max = HorizontalMax(m);
    nan = _mm256_movemask_ps(unordered) != 0;
  }
#endif
  for (; i < n; ++i) {
    nan = nan || std::isnan(s[i]);
    max = std::max(max, s[i]);
  }
  if (nan || !std::isfinite(max)) {
    std::fill(s, s + n, NAN);
    return NAN;
  }
  return 1.0f / ExpAndSum(s, n, max);
}

namespace {

// The weight of the value row at `at` for probability p: p, times the row's scale when quantized.
template <KvDType D>
inline float ValueWeight(const KvPagesView& view, const SlotCursor& at, int64_t kvh, float p) {
  if constexpr (KvRow<D>::kScaled) return p * *view.ValueScale(at.block(), kvh, at.slot());
  return p;
}

void StoreRow(const KvPagesView& view, uint8_t* row, float* scale, const float* x) {
  switch (view.dtype) {
    case KvDType::kF32:
      std::memcpy(row, x, view.head_dim * sizeof(float));
      break;
    case KvDType::kBF16: {
      uint16_t* dst = reinterpret_cast<uint16_t*>(row);
      for (int64_t i = 0; i < view.head_dim; ++i) dst[i] = F32ToBf16(x[i]);
      break;
    }
    case KvDType::kInt8:
      QuantizeRowInt8(x, view.head_dim, reinterpret_cast<int8_t*>(row), scale);
      break;
    case KvDType::kInt4:
      QuantizeRowInt4(x, view.head_dim, row, scale);
      break;
  }
}

#if PDSERVE_AVX2
// scores[j] = dot(q, K[start + j]) (* key scale) * scale for 8 keys at once: 8 independent FMA
// chains instead of one, and one transposed reduction (bit-identical to Dot's, see
// HorizontalSum8x8).
template <KvDType D>
void Scores8(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t first,
             const float* q, float scale, float* out) {
  const uint8_t* keys[8];
  alignas(32) float key_scales[8];
  SlotCursor cursor(table, view.block_size, first);
  for (int i = 0; i < 8; ++i, cursor.Next()) {
    keys[i] = view.Key(cursor.block(), kvh, cursor.slot());
    if constexpr (KvRow<D>::kScaled) key_scales[i] = *view.KeyScale(cursor.block(), kvh, cursor.slot());
  }
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < view.head_dim; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, KvRow<D>::Load8(keys[i], d), acc[i]);
  }
  __m256 s = HorizontalSum8x8(acc);
  if constexpr (KvRow<D>::kScaled) s = _mm256_mul_ps(s, _mm256_load_ps(key_scales));
  _mm256_storeu_ps(out, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
}

// out[0:64) = sum_j w[j] * V[start + j][d0 : d0 + 64), keeping the 64 sums in registers, w[j] =
// p[j] (times the row's scale when quantized). Each element accumulates keys in order with one
// FMA each, exactly as AxpyF32 does.
template <KvDType D>
void WeightedValues64(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                      int64_t n, const float* p, int64_t d0, float* out) {
  __m256 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
  SlotCursor cursor(table, view.block_size, start);
  const int64_t vh = view.num_kv_heads + kvh;
  if (d0 == 0) PrefetchRows(view, table, vh, start, kPrefetchAhead, start + n);
  for (int64_t j = 0; j < n; ++j, cursor.Next()) {
    if (d0 == 0 && j % 8 == 0) PrefetchRows(view, table, vh, start + j + kPrefetchAhead, 8, start + n);
    const uint8_t* v = view.Value(cursor.block(), kvh, cursor.slot());
    const __m256 pj = _mm256_set1_ps(ValueWeight<D>(view, cursor, kvh, p[j]));
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(pj, KvRow<D>::Load8(v, d0 + 8 * c), acc[c]);
  }
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + d0 + 8 * c, acc[c]);
}
#endif  // PDSERVE_AVX2

template <KvDType D>
void PagedAttentionT(const KvPagesView& view, const int32_t* block_table, int64_t position,
                     int64_t window, const float* q, int64_t num_heads, float scale,
                     int64_t head_begin, int64_t head_end, float* out, float* scratch) {
  const int64_t d = view.head_dim;
  const int64_t group = num_heads / view.num_kv_heads;
  const int64_t start = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
  const int64_t n = position + 1 - start;
  const int64_t bs = view.block_size;
  for (int64_t h = head_begin; h < head_end; ++h) {
    const int64_t kvh = h / group;
    const float* qh = q + h * d;
    int64_t j = 0;
#if PDSERVE_AVX2
    if (d % 8 == 0 && n >= 8) {
      // Every query head prefetches, also the second and third of one KV head: a long context's
      // K and V (1 MiB at 2,048 f32 keys) do not stay in L2 from one head to the next; prefetching
      // for the first head only was 10-25% slower (BM_DecodeAttention under
      // PDSERVE_KERNEL_ISA=avx2, which takes this path).
      PrefetchRows(view, block_table, kvh, start, kPrefetchAhead, start + n);
      for (; j + 8 <= n; j += 8) {
        PrefetchRows(view, block_table, kvh, start + j + kPrefetchAhead, 8, start + n);
        Scores8<D>(view, block_table, kvh, start + j, qh, scale, scratch + j);
      }
    }
#endif
    ScoresOneByOne<D>(view, block_table, kvh, start, j, n, qh, scale, scratch);
    const float inv_sum = internal::Softmax(scratch, n);
    float* oh = out + h * d;
    int64_t d0 = 0;
#if PDSERVE_AVX2
    for (; d0 + 64 <= d; d0 += 64) {
      WeightedValues64<D>(view, block_table, kvh, start, n, scratch, d0, oh);
    }
#endif
    if (d0 < d) {
      std::memset(oh + d0, 0, (d - d0) * sizeof(float));
      SlotCursor cursor(block_table, bs, start);
      for (int64_t i = 0; i < n; ++i, cursor.Next()) {
        AxpyF32<KvRow<D>>(ValueWeight<D>(view, cursor, kvh, scratch[i]),
                          view.Value(cursor.block(), kvh, cursor.slot()), d0, d - d0, oh + d0);
      }
    }
    for (int64_t i = 0; i < d; ++i) oh[i] *= inv_sum;
  }
}

template <KvDType D>
void PagedAttentionKvGroupT(const KvPagesView& view, const int32_t* block_table, int64_t position,
                            int64_t window, const float* q, int64_t num_heads, float scale,
                            int64_t kv_head, float* out, float* scratch) {
  const int64_t d = view.head_dim;
  const int64_t group = num_heads / view.num_kv_heads;
  const int64_t h0 = kv_head * group;
  // Groups of more than kMaxGroupAvx512 query heads (TinyLlama's and Qwen's 7-8, an MQA model's
  // all) go through the grouped kernels kMaxGroupAvx512 heads at a time: each part reads the
  // keys and values once, where the per-head path read them once per head (decode attention on a
  // group of 8 took 16% of a 1.1B model's step after 512 tokens, bench/RESULTS.md).
  constexpr int64_t kMaxGroup = 64;
  if (group > kMaxGroup || d % 64 != 0 || !Avx512Enabled()) {
    PagedAttentionT<D>(view, block_table, position, window, q, num_heads, scale, h0, h0 + group,
                       out, scratch);
    return;
  }
  const int64_t start = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
  const int64_t n = position + 1 - start;
  const int64_t n8 = n & ~int64_t{7};
  const float* qs[kMaxGroup];
  float* scores[kMaxGroup];
  float* outs[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    qs[g] = q + (h0 + g) * d;
    scores[g] = scratch + g * n;
    outs[g] = out + (h0 + g) * d;
  }
  auto part = [&](int64_t g0) { return static_cast<int>(std::min<int64_t>(kMaxGroupAvx512, group - g0)); };
  for (int64_t g0 = 0; g0 < group; g0 += kMaxGroupAvx512) {
    ScoresGroupAvx512(view, block_table, kv_head, start, n8, qs + g0, part(g0), scale, scores + g0);
  }
  float inv_sum[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    ScoresOneByOne<D>(view, block_table, kv_head, start, n8, n, qs[g], scale, scores[g]);
    inv_sum[g] = internal::Softmax(scores[g], n);
  }
  for (int64_t g0 = 0; g0 < group; g0 += kMaxGroupAvx512) {
    WeightedValuesGroupAvx512(view, block_table, kv_head, start, n, scores + g0, part(g0), outs + g0);
  }
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t i = 0; i < d; ++i) outs[g][i] *= inv_sum[g];
  }
}

}  // namespace

void StoreKv(const KvPagesView& view, const int32_t* block_table, int64_t position,
             const float* k, const float* v) {
  const int32_t block = block_table[position / view.block_size];
  const int64_t slot = position % view.block_size;
  const int64_t d = view.head_dim;
  const bool quantized = KvDTypeQuantized(view.dtype);
  for (int64_t h = 0; h < view.num_kv_heads; ++h) {
    StoreRow(view, view.Key(block, h, slot), quantized ? view.KeyScale(block, h, slot) : nullptr,
             k + h * d);
    StoreRow(view, view.Value(block, h, slot),
             quantized ? view.ValueScale(block, h, slot) : nullptr, v + h * d);
  }
}

void PagedAttention(const KvPagesView& view, const int32_t* block_table, int64_t position,
                    int64_t window, const float* q, int64_t num_heads, float scale,
                    int64_t head_begin, int64_t head_end, float* out, float* scratch) {
  switch (view.dtype) {
#define PD_CASE(D)                                                                              \
  case D:                                                                                       \
    return PagedAttentionT<D>(view, block_table, position, window, q, num_heads, scale,         \
                              head_begin, head_end, out, scratch);
    PD_CASE(KvDType::kF32)
    PD_CASE(KvDType::kBF16)
    PD_CASE(KvDType::kInt8)
    PD_CASE(KvDType::kInt4)
#undef PD_CASE
  }
}

void PagedAttentionKvGroup(const KvPagesView& view, const int32_t* block_table, int64_t position,
                           int64_t window, const float* q, int64_t num_heads, float scale,
                           int64_t kv_head, float* out, float* scratch) {
  switch (view.dtype) {
#define PD_CASE(D)                                                                              \
  case D:                                                                                       \
    return PagedAttentionKvGroupT<D>(view, block_table, position, window, q, num_heads, scale, \
                                     kv_head, out, scratch);
    PD_CASE(KvDType::kF32)
    PD_CASE(KvDType::kBF16)
    PD_CASE(KvDType::kInt8)
    PD_CASE(KvDType::kInt4)
#undef PD_CASE
  }
}

}  // namespace pdserve::kernels
