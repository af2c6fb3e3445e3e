#include "kernels/cpu/attention_avx512.h"

#include "kernels/cpu/simd.h"

namespace pdserve::kernels {

#if PDSERVE_AVX2

// As in linear_avx512.cc: the attribute on every AVX-512 function, no file-wide flags.
#define PD_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

namespace {

// Keys a and b's [d, d + 8) side by side, as f32.
PD_AVX512 inline __m512 LoadPair(const uint8_t* a, const uint8_t* b, bool f32) {
  if (f32) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a))),
                              _mm256_loadu_ps(reinterpret_cast<const float*>(b)), 1);
  }
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 consecutive elements as f32.
PD_AVX512 inline __m512 Load16(const uint8_t* p, bool f32) {
  if (f32) return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int G>
PD_AVX512 void Scores(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                      int64_t n8, const float* const* q, float scale, float* const* out) {
  const bool f32 = view.dtype == DType::kF32;
  const size_t elt = DTypeSize(view.dtype);
  for (int64_t j = 0; j < n8; j += 8) {
    const uint8_t* keys[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t p = start + j + i;
      keys[i] = view.Key(table[p / view.block_size], kvh, p % view.block_size);
    }
    __m512 acc[G][4];  // acc[g][i]: keys 2i and 2i + 1 of head g.
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < view.head_dim; d += 8) {
      __m512 kv[4];
      for (int i = 0; i < 4; ++i) kv[i] = LoadPair(keys[2 * i] + d * elt, keys[2 * i + 1] + d * elt, f32);
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
      _mm256_storeu_ps(out[g] + j, _mm256_mul_ps(HorizontalSum8x8(per_key), _mm256_set1_ps(scale)));
    }
  }
}

template <int G>
PD_AVX512 void WeightedValues(const KvPagesView& view, const int32_t* table, int64_t kvh,
                              int64_t start, int64_t n, const float* const* p, float* const* out) {
  const bool f32 = view.dtype == DType::kF32;
  const size_t elt = DTypeSize(view.dtype);
  for (int64_t d0 = 0; d0 < view.head_dim; d0 += 64) {
    __m512 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = start + j;
      const uint8_t* v = view.Value(table[pos / view.block_size], kvh, pos % view.block_size) + d0 * elt;
      __m512 vz[4];
      for (int c = 0; c < 4; ++c) vz[c] = Load16(v + 16 * c * elt, f32);
      for (int g = 0; g < G; ++g) {
        const __m512 pj = _mm512_set1_ps(p[g][j]);
        for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_fmadd_ps(pj, vz[c], acc[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out[g] + d0 + 16 * c, acc[g][c]);
  }
}

}  // namespace

PD_AVX512 void ScoresGroupAvx512(const KvPagesView& view, const int32_t* table, int64_t kvh,
                                 int64_t start, int64_t n8, const float* const* q, int group,
                                 float scale, float* const* out) {
  switch (group) {
    case 1: Scores<1>(view, table, kvh, start, n8, q, scale, out); break;
    case 2: Scores<2>(view, table, kvh, start, n8, q, scale, out); break;
    case 3: Scores<3>(view, table, kvh, start, n8, q, scale, out); break;
    case 4: Scores<4>(view, table, kvh, start, n8, q, scale, out); break;
    default: break;
  }
}

PD_AVX512 void WeightedValuesGroupAvx512(const KvPagesView& view, const int32_t* table,
                                         int64_t kvh, int64_t start, int64_t n,
                                         const float* const* p, int group, float* const* out) {
  switch (group) {
    case 1: WeightedValues<1>(view, table, kvh, start, n, p, out); break;
    case 2: WeightedValues<2>(view, table, kvh, start, n, p, out); break;
    case 3: WeightedValues<3>(view, table, kvh, start, n, p, out); break;
    case 4: WeightedValues<4>(view, table, kvh, start, n, p, out); break;
    default: break;
  }
}

#else

void ScoresGroupAvx512(const KvPagesView&, const int32_t*, int64_t, int64_t, int64_t,
                       const float* const*, int, float, float* const*) {}
void WeightedValuesGroupAvx512(const KvPagesView&, const int32_t*, int64_t, int64_t, int64_t,
                               const float* const*, int, float* const*) {}

#endif  // PDSERVE_AVX2

}  // namespace pdserve::kernels
