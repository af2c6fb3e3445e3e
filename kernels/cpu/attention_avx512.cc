#include "kernels/cpu/attention_avx512.h"

#include <cstring>

#include "kernels/cpu/kv_prefetch.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {

#if PDSERVE_AVX2

// As in linear_avx512.cc: the attribute on every AVX-512 function, no file-wide flags.
#define PD_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

namespace {

// Rows a and b's elements [d, d + 8) side by side, as f32 (codes for quantized dtypes).
template <KvDType D>
PD_AVX512 inline __m512 LoadPair(const uint8_t* a, const uint8_t* b, int64_t d);
// Elements [d, d + 16) of one row as f32.
template <KvDType D>
PD_AVX512 inline __m512 Load16(const uint8_t* p, int64_t d);

// Two 32-bit words of 8 nibbles each -> 16 sign-extended codes.
PD_AVX512 inline __m512 Nibbles16(int32_t lo, int32_t hi) {
  const __m512i w = _mm512_inserti32x8(_mm512_castsi256_si512(_mm256_set1_epi32(lo)),
                                       _mm256_set1_epi32(hi), 1);
  const __m512i shifts =
      _mm512_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
  return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(w, shifts), 28));
}

template <>
PD_AVX512 inline __m512 LoadPair<KvDType::kF32>(const uint8_t* a, const uint8_t* b, int64_t d) {
  return _mm512_insertf32x8(
      _mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a) + d)),
      _mm256_loadu_ps(reinterpret_cast<const float*>(b) + d), 1);
}
template <>
PD_AVX512 inline __m512 LoadPair<KvDType::kBF16>(const uint8_t* a, const uint8_t* b, int64_t d) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * d));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * d));
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <>
PD_AVX512 inline __m512 LoadPair<KvDType::kInt8>(const uint8_t* a, const uint8_t* b, int64_t d) {
  const __m128i c = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + d)),
                                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + d)));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
}
template <>
PD_AVX512 inline __m512 LoadPair<KvDType::kInt4>(const uint8_t* a, const uint8_t* b, int64_t d) {
  int32_t lo, hi;
  std::memcpy(&lo, a + d / 2, 4);
  std::memcpy(&hi, b + d / 2, 4);
  return Nibbles16(lo, hi);
}

template <>
PD_AVX512 inline __m512 Load16<KvDType::kF32>(const uint8_t* p, int64_t d) {
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + d);
}
template <>
PD_AVX512 inline __m512 Load16<KvDType::kBF16>(const uint8_t* p, int64_t d) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * d));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <>
PD_AVX512 inline __m512 Load16<KvDType::kInt8>(const uint8_t* p, int64_t d) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + d))));
}
template <>
PD_AVX512 inline __m512 Load16<KvDType::kInt4>(const uint8_t* p, int64_t d) {
  return LoadPair<KvDType::kInt4>(p, p + 4, d);
}

template <KvDType D, int G>
PD_AVX512 void Scores(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                      int64_t n8, const float* const* q, float scale, float* const* out) {
  constexpr bool kScaled = KvDTypeQuantized(D);
  if (n8 <= 0) return;
  SlotCursor cursor(table, view.block_size, start);
  PrefetchRows(view, table, kvh, start, kPrefetchAhead, start + n8);
  for (int64_t j = 0; j < n8; j += 8) {
    PrefetchRows(view, table, kvh, start + j + kPrefetchAhead, 8, start + n8);
    const uint8_t* keys[8];
    alignas(32) float key_scales[8];
    for (int i = 0; i < 8; ++i, cursor.Next()) {
      keys[i] = view.Key(cursor.block(), kvh, cursor.slot());
      if constexpr (kScaled) key_scales[i] = *view.KeyScale(cursor.block(), kvh, cursor.slot());
    }
    __m512 acc[G][4];  // acc[g][i]: keys 2i and 2i + 1 of head g.
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < view.head_dim; d += 8) {
      __m512 kv[4];
      for (int i = 0; i < 4; ++i) kv[i] = LoadPair<D>(keys[2 * i], keys[2 * i + 1], d);
      for (int g = 0; g < G; ++g) {
        const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[g] + d));
        for (int i = 0; i < 4; ++i) acc[g][i] = _mm512_fmadd_ps(qv, kv[i], acc[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      __m256 per_key[8];
      for (int i = 0; i < 4; ++i) {
        per_key[2 * i] = _mm512_castps512_ps256(acc[g][i]);
        per_key[2 * i + 1] = _mm512_extractf32x8_ps(acc[g][i], 1);
      }
      __m256 s = HorizontalSum8x8(per_key);
      if constexpr (kScaled) s = _mm256_mul_ps(s, _mm256_load_ps(key_scales));
      _mm256_storeu_ps(out[g] + j, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
    }
  }
}

template <KvDType D, int G>
PD_AVX512 void WeightedValues(const KvPagesView& view, const int32_t* table, int64_t kvh,
                              int64_t start, int64_t n, const float* const* p, float* const* out) {
  constexpr bool kScaled = KvDTypeQuantized(D);
  for (int64_t d0 = 0; d0 < view.head_dim; d0 += 64) {
    __m512 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_setzero_ps();
    SlotCursor cursor(table, view.block_size, start);
    const int64_t vh = view.num_kv_heads + kvh;
    if (d0 == 0) PrefetchRows(view, table, vh, start, kPrefetchAhead, start + n);
    for (int64_t j = 0; j < n; ++j, cursor.Next()) {
      if (d0 == 0 && j % 8 == 0) PrefetchRows(view, table, vh, start + j + kPrefetchAhead, 8, start + n);
      const uint8_t* v = view.Value(cursor.block(), kvh, cursor.slot());
      float value_scale = 1.0f;
      if constexpr (kScaled) value_scale = *view.ValueScale(cursor.block(), kvh, cursor.slot());
      __m512 vz[4];
      for (int c = 0; c < 4; ++c) vz[c] = Load16<D>(v, d0 + 16 * c);
      for (int g = 0; g < G; ++g) {
        // As the per-head path: the weight is p (times the row's scale when quantized).
        const __m512 pj = _mm512_set1_ps(kScaled ? p[g][j] * value_scale : p[g][j]);
        for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_fmadd_ps(pj, vz[c], acc[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out[g] + d0 + 16 * c, acc[g][c]);
  }
}

template <KvDType D>
PD_AVX512 void ScoresGroup(const KvPagesView& view, const int32_t* table, int64_t kvh,
                           int64_t start, int64_t n8, const float* const* q, int group,
                           float scale, float* const* out) {
  switch (group) {
    case 1: Scores<D, 1>(view, table, kvh, start, n8, q, scale, out); break;
    case 2: Scores<D, 2>(view, table, kvh, start, n8, q, scale, out); break;
    case 3: Scores<D, 3>(view, table, kvh, start, n8, q, scale, out); break;
    case 4: Scores<D, 4>(view, table, kvh, start, n8, q, scale, out); break;
    default: break;
  }
}

template <KvDType D>
PD_AVX512 void WeightedValuesGroup(const KvPagesView& view, const int32_t* table, int64_t kvh,
                                   int64_t start, int64_t n, const float* const* p, int group,
                                   float* const* out) {
  switch (group) {
    case 1: WeightedValues<D, 1>(view, table, kvh, start, n, p, out); break;
    case 2: WeightedValues<D, 2>(view, table, kvh, start, n, p, out); break;
    case 3: WeightedValues<D, 3>(view, table, kvh, start, n, p, out); break;
    case 4: WeightedValues<D, 4>(view, table, kvh, start, n, p, out); break;
    default: break;
  }
}

// Exp8 of simd.h on 16 lanes: the same operations on each lane, so the same bits.
PD_AVX512 inline __m512 Exp16(__m512 x) {
  using C = ExpConst;
  const __m512 max_x = _mm512_set1_ps(C::kMaxX);
  const __m512 min_x = _mm512_set1_ps(-C::kMaxX);
  x = _mm512_min_ps(_mm512_max_ps(x, min_x), max_x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(C::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(C::kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kP5));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512i rest = _mm512_sub_epi32(ni, half);
  const __m512 f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 f2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(rest, _mm512_set1_epi32(127)), 23));
  return _mm512_mul_ps(_mm512_mul_ps(p, f1), f2);
}

}  // namespace

PD_AVX512 int64_t ExpAndSumAvx512(float* s, int64_t n, float max, __m256* acc) {
  const __m512 mv = _mm512_set1_ps(max);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
    _mm512_storeu_ps(s + i, e);
    *acc = _mm256_add_ps(*acc, _mm512_castps512_ps256(e));  // The 8-lane order: low half first.
    *acc = _mm256_add_ps(*acc, _mm512_extractf32x8_ps(e, 1));
  }
  return i;
}

PD_AVX512 void ScoresGroupAvx512(const KvPagesView& view, const int32_t* table, int64_t kvh,
                                 int64_t start, int64_t n8, const float* const* q, int group,
                                 float scale, float* const* out) {
  switch (view.dtype) {
    case KvDType::kF32: return ScoresGroup<KvDType::kF32>(view, table, kvh, start, n8, q, group, scale, out);
    case KvDType::kBF16: return ScoresGroup<KvDType::kBF16>(view, table, kvh, start, n8, q, group, scale, out);
    case KvDType::kInt8: return ScoresGroup<KvDType::kInt8>(view, table, kvh, start, n8, q, group, scale, out);
    case KvDType::kInt4: return ScoresGroup<KvDType::kInt4>(view, table, kvh, start, n8, q, group, scale, out);
  }
}

PD_AVX512 void WeightedValuesGroupAvx512(const KvPagesView& view, const int32_t* table,
                                         int64_t kvh, int64_t start, int64_t n,
                                         const float* const* p, int group, float* const* out) {
  switch (view.dtype) {
    case KvDType::kF32: return WeightedValuesGroup<KvDType::kF32>(view, table, kvh, start, n, p, group, out);
    case KvDType::kBF16: return WeightedValuesGroup<KvDType::kBF16>(view, table, kvh, start, n, p, group, out);
    case KvDType::kInt8: return WeightedValuesGroup<KvDType::kInt8>(view, table, kvh, start, n, p, group, out);
    case KvDType::kInt4: return WeightedValuesGroup<KvDType::kInt4>(view, table, kvh, start, n, p, group, out);
  }
}

#else

void ScoresGroupAvx512(const KvPagesView&, const int32_t*, int64_t, int64_t, int64_t,
                       const float* const*, int, float, float* const*) {}
void WeightedValuesGroupAvx512(const KvPagesView&, const int32_t*, int64_t, int64_t, int64_t,
                               const float* const*, int, float* const*) {}

#endif  // PDSERVE_AVX2

}  // namespace pdserve::kernels
