#include "kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/tensor_ref.h"
#include "kernels/cpu/kv_prefetch.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

using internal::kPanelRows;
using internal::PanelElements;
constexpr int64_t kRows = kAttentionBf16RowsPerTile;
// A row's remaining pairs up to this many are copied with its last one and summed in one call.
constexpr int64_t kCopyPairs = 8;
// V lines per panel the copy holds: that, or AMX's order's last partial tile (< 16 pairs).
constexpr int64_t kLinesPerPanel = std::max<int64_t>(kCopyPairs + 1, internal::kAmxTilePairs);

using internal::Bf16DotStep;

inline int64_t WindowStart(int64_t position, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
}

// A K or V row of the pool as bf16: f32 rounded to nearest even with denormals flushed
// (VCVTNEPS2BF16's conversion; the dot steps read denormals as zero anyway), bf16 as is,
// int8/int4 codes (exact in bf16; the row scale is applied apart).
void RowAsBf16(KvDType dtype, const uint8_t* row, int64_t d, uint16_t* out) {
  switch (dtype) {
    case KvDType::kF32:
      RoundToBf16Ftz(reinterpret_cast<const float*>(row), d, out);
      break;
    case KvDType::kBF16:
      std::memcpy(out, row, static_cast<size_t>(d) * 2);
      break;
    case KvDType::kInt8:
      for (int64_t i = 0; i < d; ++i) out[i] = F32ToBf16(static_cast<float>(static_cast<int8_t>(row[i])));
      break;
    case KvDType::kInt4:
      for (int64_t i = 0; i < d; ++i) out[i] = F32ToBf16(static_cast<float>(Int4Code(row, i)));
      break;
  }
}

inline size_t Align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// The scratch of one call, carved from the caller's bytes.
struct Scratch {
  int64_t nk = 0;            // Key columns: the call's keys rounded up to whole K panels.
  int64_t v_stride = 0;      // Elements between V panels (16 head_dim rows each).
  uint16_t* k_panels = nullptr;
  uint16_t* v_packs[2] = {nullptr, nullptr};  // Pairs from the call's first key, and one later.
  uint16_t* qb = nullptr;    // [kRows * heads][head_dim]
  float* scores = nullptr;   // [kRows * heads][nk]
  uint16_t* p = nullptr;     // [kRows * heads][nk + 2]
  float* acc = nullptr;      // [kRows * heads][head_dim]
  uint16_t* lines = nullptr; // A row's last V lines, copied (kLinesPerPanel per panel).
  float* key_scales = nullptr;
  float* value_scales = nullptr;
  uint16_t* rows = nullptr;  // 16 K or V rows as bf16, row_stride apart, then a zero row.
  int64_t row_stride = 0;    // head_dim rounded up to even (the pad element zero).
  size_t bytes = 0;
};

Scratch Carve(uint8_t* base, int64_t keys, int64_t heads, int64_t d, bool window) {
  Scratch s;
  s.nk = (keys + kPanelRows - 1) / kPanelRows * kPanelRows;
  const int64_t v_panels = (d + kPanelRows - 1) / kPanelRows;
  s.v_stride = PanelElements(s.nk);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    uint8_t* p = base ? base + at : nullptr;
    at += Align64(bytes);
    return p;
  };
  s.k_panels = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(s.nk / kPanelRows * PanelElements(d)) * 2));
  for (int par = 0; par < (window ? 2 : 1); ++par) {
    s.v_packs[par] = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(v_panels * s.v_stride) * 2));
  }
  s.qb = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(kRows * heads * d) * 2));
  s.scores = reinterpret_cast<float*>(take(static_cast<size_t>(kRows * heads * s.nk) * 4));
  s.p = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(kRows * heads * (s.nk + 2)) * 2));
  s.acc = reinterpret_cast<float*>(take(static_cast<size_t>(kRows * heads * d) * 4));
  s.lines = reinterpret_cast<uint16_t*>(
      take(static_cast<size_t>(v_panels * PanelElements(2 * kLinesPerPanel)) * 2));
  s.key_scales = reinterpret_cast<float*>(take(static_cast<size_t>(s.nk) * 4));
  s.value_scales = reinterpret_cast<float*>(take(static_cast<size_t>(s.nk) * 4));
  s.row_stride = (d + 1) / 2 * 2;
  s.rows = reinterpret_cast<uint16_t*>(take(static_cast<size_t>((kPanelRows + 1) * s.row_stride) * 2));
  s.bytes = at;
  return s;
}

#if PDSERVE_AVX2
#define PD_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// A 16 x 16 transpose of 32-bit elements in registers: out[c] lane l = r[l] element c.
PD_AVX512 inline void Transpose16x16(const __m512i* r, __m512i* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // b[4i + j], 128-bit lane L: rows 4i..4i+3 of element 4L + j.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i + 0], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i u = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x44);
    const __m512i v = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xee);
    const __m512i w = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x44);
    const __m512i z = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xee);
    out[j] = _mm512_shuffle_i32x4(u, w, 0x88);
    out[4 + j] = _mm512_shuffle_i32x4(u, w, 0xdd);
    out[8 + j] = _mm512_shuffle_i32x4(v, z, 0x88);
    out[12 + j] = _mm512_shuffle_i32x4(v, z, 0xdd);
  }
}

// Lines [0, pairs) of a K panel from 16 bf16 rows (rows[l] is key l's, `pairs` pairs each): line
// q, lane l is pair q of row l.
PD_AVX512 void TransposeToPanelAvx512(const uint16_t* const* rows, int64_t pairs, uint16_t* panel) {
  for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
    const int64_t n = std::min<int64_t>(16, pairs - q0);
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    __m512i r[16], line[16];
    for (int l = 0; l < 16; ++l) r[l] = _mm512_maskz_loadu_epi32(mask, rows[l] + 2 * q0);
    Transpose16x16(r, line);
    uint16_t* out = panel + q0 * 2 * kPanelRows;
    for (int c = 0; c < n; ++c) _mm512_storeu_si512(out + c * 2 * kPanelRows, line[c]);
  }
}

// One V line per panel from two bf16 rows a and b: lane l of panel p holds a[16p + l],
// b[16p + l] (zero past d).
PD_AVX512 void InterleaveLinesAvx512(const uint16_t* a, const uint16_t* b, int64_t d,
                                     int64_t v_stride, uint16_t* dst) {
  static constexpr uint16_t kZip[32] = {0, 16, 1,  17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                        8, 24, 9,  25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i zip = _mm512_loadu_si512(kZip);
  for (int64_t p = 0; p * kPanelRows < d; ++p) {
    const int64_t lanes = std::min(kPanelRows, d - p * kPanelRows);
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1);
    const __m256i va = _mm256_maskz_loadu_epi16(mask, a + p * kPanelRows);
    const __m256i vb = _mm256_maskz_loadu_epi16(mask, b + p * kPanelRows);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(va), vb, 1);
    _mm512_storeu_si512(dst + p * v_stride, _mm512_permutexvar_epi16(zip, both));
  }
}

// A single row (decode) without packing: the same sequence of operations as the tiles', with K
// rows transposed and V rows interleaved in registers. f32 and bf16 pools, head_dim a multiple of
// 32. In kBf16Panels' order each score is one VDPBF16PS lane walking head_dim's pairs in order and
// P.V pairs keys from the row's start, later key first, an odd count's last key with a zero. In
// kBf16PanelsAmx's each tile of 16 pairs (of head_dim; of keys) keeps an even and an odd chain:
// f32 FMAs of the pairs' elements (a bf16 is the high half of its f32) under MXCSR's DAZ and FTZ
// (the caller's DazFtzScope), each chain's own flushing steps exactly; the tile's end adds as
// AmxTileSum. (VDPBF16PS with the other element of each pair masked computes the same bits, with
// -0 as the masked product: x + (-0) = x for every x where +0 would turn -0 into +0; but it does
// half the products per instruction, and on a Xeon it issues at half the FMA's rate: measured
// 1.3x slower than the FMAs.)
#define PD_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

// Elements [e, e + 32) of a K or V row as bf16 (f32 converted as RoundToBf16Ftz).
template <KvDType D>
PD_AVX512BF16 inline __m512i Load32(const uint8_t* row, int64_t e) {
  if constexpr (D == KvDType::kF32) {
    const float* f = reinterpret_cast<const float*>(row) + e;
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));
  } else {
    return _mm512_loadu_si512(reinterpret_cast<const uint16_t*>(row) + e);
  }
}

// Lanes' pairs as f32: the even (low) elements and the odd (high) ones.
PD_AVX512BF16 inline __m512 EvenF32(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
PD_AVX512BF16 inline __m512 OddF32(__m512i pairs) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
}
// internal::AmxTileSum on 16 lanes (under DAZ and FTZ, each add flushes).
PD_AVX512BF16 inline __m512 TileSum(__m512 acc, __m512 even, __m512 odd) {
  return _mm512_add_ps(acc, _mm512_add_ps(even, odd));
}
PD_AVX512BF16 inline __m512 Bf16Broadcast(uint16_t v) {
  return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(v) << 16)));
}

// scores[g * lds + j] = dot(qb[g], K[start + j]) for j in [0, n), G heads; 16 keys per lane set.
// A 32-element step of head_dim is one tile of AMX's order.
template <KvDType D, int G, bool kAmx>
PD_AVX512BF16 void DecodeScores(const KvPagesView& view, const int32_t* table, int64_t kvh,
                                int64_t start, int64_t n, const uint16_t* qb, float* scores,
                                int64_t lds) {
  const int64_t d = view.head_dim;
  SlotCursor cursor(table, view.block_size, start);
  PrefetchRows(view, table, kvh, start, kPrefetchAhead, start + n);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    PrefetchRows(view, table, kvh, start + j0 + kPrefetchAhead, 16, start + n);
    const int64_t keys = std::min<int64_t>(16, n - j0);
    const uint8_t* rows[16];
    for (int l = 0; l < keys; ++l, cursor.Next()) rows[l] = view.Key(cursor.block(), kvh, cursor.slot());
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; e += 32) {
      __m512i r[16], line[16];
      for (int l = 0; l < 16; ++l) r[l] = l < keys ? Load32<D>(rows[l], e) : _mm512_setzero_si512();
      Transpose16x16(r, line);
      if constexpr (kAmx) {
        __m512 even[G], odd[G];
        for (int g = 0; g < G; ++g) even[g] = odd[g] = _mm512_setzero_ps();
        for (int c = 0; c < 16; ++c) {
          const __m512 ke = EvenF32(line[c]), ko = OddF32(line[c]);
          for (int g = 0; g < G; ++g) {
            const uint16_t* pair = qb + g * d + e + 2 * c;
            even[g] = _mm512_fmadd_ps(Bf16Broadcast(pair[0]), ke, even[g]);
            odd[g] = _mm512_fmadd_ps(Bf16Broadcast(pair[1]), ko, odd[g]);
          }
        }
        for (int g = 0; g < G; ++g) acc[g] = TileSum(acc[g], even[g], odd[g]);
      } else {
        for (int c = 0; c < 16; ++c) {
          for (int g = 0; g < G; ++g) {
            uint32_t pair;
            std::memcpy(&pair, qb + g * d + e + 2 * c, 4);
            acc[g] = _mm512_dpbf16_ps(acc[g], (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)),
                                      (__m512bh)line[c]);
          }
        }
      }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << keys) - 1);
    for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(scores + g * lds + j0, mask, acc[g]);
  }
}

// acc[g * d + e] = the P.V sums (before 1/sum) of G heads over keys [start, start + n), p[g] the
// heads' bf16 probabilities (ldp apart). 32 elements of head_dim at a time: rows a and b zipped by
// VPUNPCK{L,H}WD give pairs of elements 8L + t (low) and 8L + 4 + t (high) in 128-bit lane L. In
// AMX's order every 16 pairs of keys from the start end a tile.
template <KvDType D, int G, bool kAmx>
PD_AVX512BF16 void DecodeValues(const KvPagesView& view, const int32_t* table, int64_t kvh,
                                int64_t start, int64_t n, const uint16_t* p, int64_t ldp,
                                float* acc_out) {
  const int64_t d = view.head_dim;
  static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  static constexpr int32_t kSecond[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i first = _mm512_loadu_si512(kFirst), second = _mm512_loadu_si512(kSecond);
  for (int64_t e = 0; e < d; e += 32) {
    __m512 lo[G], hi[G];
    // AMX's order: the tile's chains, of the low and high halves.
    __m512 lo_even[kAmx ? G : 1], lo_odd[kAmx ? G : 1], hi_even[kAmx ? G : 1], hi_odd[kAmx ? G : 1];
    for (int g = 0; g < G; ++g) lo[g] = hi[g] = _mm512_setzero_ps();
    if constexpr (kAmx) {
      for (int g = 0; g < G; ++g) {
        lo_even[g] = lo_odd[g] = hi_even[g] = hi_odd[g] = _mm512_setzero_ps();
      }
    }
    SlotCursor cursor(table, view.block_size, start);
    // The first pass brings the rows into L2 for the later ones.
    const int64_t vh = view.num_kv_heads + kvh;
    if (e == 0) PrefetchRows(view, table, vh, start, kPrefetchAhead, start + n);
    for (int64_t j = 0; j < n; j += 2) {
      if (e == 0 && j % 16 == 0) PrefetchRows(view, table, vh, start + j + kPrefetchAhead, 16, start + n);
      if constexpr (kAmx) {
        if (j > 0 && j % (2 * internal::kAmxTilePairs) == 0) {
          for (int g = 0; g < G; ++g) {
            lo[g] = TileSum(lo[g], lo_even[g], lo_odd[g]);
            hi[g] = TileSum(hi[g], hi_even[g], hi_odd[g]);
            lo_even[g] = lo_odd[g] = hi_even[g] = hi_odd[g] = _mm512_setzero_ps();
          }
        }
      }
      const __m512i a = Load32<D>(view.Value(cursor.block(), kvh, cursor.slot()), e);
      cursor.Next();
      __m512i b = _mm512_setzero_si512();
      if (j + 1 < n) {
        b = Load32<D>(view.Value(cursor.block(), kvh, cursor.slot()), e);
        cursor.Next();
      }
      const __m512i zl = _mm512_unpacklo_epi16(a, b), zh = _mm512_unpackhi_epi16(a, b);
      if constexpr (kAmx) {
        const __m512 zl_even = EvenF32(zl), zl_odd = OddF32(zl);
        const __m512 zh_even = EvenF32(zh), zh_odd = OddF32(zh);
        for (int g = 0; g < G; ++g) {
          const __m512 pe = Bf16Broadcast(p[g * ldp + j]);
          const __m512 po = Bf16Broadcast(j + 1 < n ? p[g * ldp + j + 1] : 0);
          lo_even[g] = _mm512_fmadd_ps(pe, zl_even, lo_even[g]);
          lo_odd[g] = _mm512_fmadd_ps(po, zl_odd, lo_odd[g]);
          hi_even[g] = _mm512_fmadd_ps(pe, zh_even, hi_even[g]);
          hi_odd[g] = _mm512_fmadd_ps(po, zh_odd, hi_odd[g]);
        }
      } else {
        for (int g = 0; g < G; ++g) {
          uint32_t pair = p[g * ldp + j];
          if (j + 1 < n) pair |= static_cast<uint32_t>(p[g * ldp + j + 1]) << 16;
          const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
          lo[g] = _mm512_dpbf16_ps(lo[g], pp, (__m512bh)zl);
          hi[g] = _mm512_dpbf16_ps(hi[g], pp, (__m512bh)zh);
        }
      }
    }
    if constexpr (kAmx) {
      if (n > 0) {
        for (int g = 0; g < G; ++g) {
          lo[g] = TileSum(lo[g], lo_even[g], lo_odd[g]);
          hi[g] = TileSum(hi[g], hi_even[g], hi_odd[g]);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      _mm512_storeu_ps(acc_out + g * d + e, _mm512_permutex2var_ps(lo[g], first, hi[g]));
      _mm512_storeu_ps(acc_out + g * d + e + 16, _mm512_permutex2var_ps(lo[g], second, hi[g]));
    }
  }
}

// The AMX order's variants run under DAZ and FTZ (their FMAs flush as TDPBF16PS does); the
// softmax between the two calls does not.
template <KvDType D>
PD_AVX512BF16 void DecodeScoresAny(int g, bool amx, const KvPagesView& view, const int32_t* table,
                                   int64_t kvh, int64_t start, int64_t n, const uint16_t* qb,
                                   float* scores, int64_t lds) {
  if (amx) {
    DazFtzScope daz_ftz;
    switch (g) {
#define PD_G(G) \
  case G: return DecodeScores<D, G, true>(view, table, kvh, start, n, qb, scores, lds);
      PD_G(1) PD_G(2) PD_G(3) PD_G(4) PD_G(5) PD_G(6) PD_G(7) PD_G(8)
#undef PD_G
    }
  }
  switch (g) {
#define PD_G(G) \
  case G: return DecodeScores<D, G, false>(view, table, kvh, start, n, qb, scores, lds);
    PD_G(1) PD_G(2) PD_G(3) PD_G(4) PD_G(5) PD_G(6) PD_G(7) PD_G(8)
#undef PD_G
  }
}
template <KvDType D>
PD_AVX512BF16 void DecodeValuesAny(int g, bool amx, const KvPagesView& view, const int32_t* table,
                                   int64_t kvh, int64_t start, int64_t n, const uint16_t* p,
                                   int64_t ldp, float* acc) {
  if (amx) {
    DazFtzScope daz_ftz;
    switch (g) {
#define PD_G(G) case G: return DecodeValues<D, G, true>(view, table, kvh, start, n, p, ldp, acc);
      PD_G(1) PD_G(2) PD_G(3) PD_G(4) PD_G(5) PD_G(6) PD_G(7) PD_G(8)
#undef PD_G
    }
  }
  switch (g) {
#define PD_G(G) case G: return DecodeValues<D, G, false>(view, table, kvh, start, n, p, ldp, acc);
    PD_G(1) PD_G(2) PD_G(3) PD_G(4) PD_G(5) PD_G(6) PD_G(7) PD_G(8)
#undef PD_G
  }
}
#endif  // PDSERVE_AVX2

// Key or value rows of one KV head as bf16: a bf16 pool's rows in place, others converted into
// one of the scratch's 16 row slots. Rows past the end read as zeros.
class Bf16Rows {
 public:
  Bf16Rows(const KvPagesView& view, const int32_t* table, int64_t kvh, bool values, int64_t start,
           int64_t hi, const Scratch& s)
      : view_(view), kvh_(values ? view.num_kv_heads + kvh : kvh), cursor_(table, view.block_size, start),
        table_(table), start_(start), at_(start), hi_(hi), s_(s) {
    PrefetchRows(view, table, kvh_, start, kPrefetchAhead, hi);
    std::memset(s.rows + kPanelRows * s.row_stride, 0, static_cast<size_t>(s.row_stride) * 2);
  }
  // The next row (into slot `slot` when converted); its scale (quantized) into *scale.
  const uint16_t* Next(int slot, float* scale) {
    if (at_ >= hi_) return s_.rows + kPanelRows * s_.row_stride;  // The zero row.
    if ((at_ - start_) % 16 == 0) PrefetchRows(view_, table_, kvh_, at_ + kPrefetchAhead, 16, hi_);
    const int32_t block = cursor_.block();
    const int64_t slot_in_block = cursor_.slot();
    const uint8_t* row = view_.Key(block, kvh_, slot_in_block);
    if (KvDTypeQuantized(view_.dtype)) *scale = *view_.KeyScale(block, kvh_, slot_in_block);
    cursor_.Next();
    ++at_;
    if (view_.dtype == KvDType::kBF16) return reinterpret_cast<const uint16_t*>(row);
    uint16_t* out = s_.rows + slot * s_.row_stride;
    RowAsBf16(view_.dtype, row, view_.head_dim, out);
    return out;
  }

 private:
  const KvPagesView& view_;
  const int64_t kvh_;  // K heads, then V heads, as the page (and KeyScale) count them.
  SlotCursor cursor_;
  const int32_t* table_;
  const int64_t start_;
  int64_t at_;
  const int64_t hi_;
  const Scratch& s_;
};

// Keys [lo, hi) of KV head kvh as K panels: key lo + c is lane c % 16 of panel c / 16, whose line
// q holds its elements 2q, 2q + 1 (linear_bf16.h's layout with keys as the matrix's rows). Lanes
// past hi are zero.
void PackKeys(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t lo, int64_t hi,
              const Scratch& s) {
  const int64_t d = view.head_dim, pairs = (d + 1) / 2, pe = PanelElements(d);
#if PDSERVE_AVX2
  const bool avx512 = Avx512Enabled() && d % 2 == 0;
#endif
  Bf16Rows rows(view, table, kvh, /*values=*/false, lo, hi, s);
  float unused;
  for (int64_t c0 = 0; lo + c0 < hi; c0 += kPanelRows) {
    const uint16_t* r[kPanelRows];
    for (int l = 0; l < kPanelRows; ++l) {
      float* scale = c0 + l < s.nk ? &s.key_scales[c0 + l] : &unused;
      *scale = 1.0f;
      r[l] = rows.Next(l, scale);
    }
    uint16_t* panel = s.k_panels + (c0 / kPanelRows) * pe;
#if PDSERVE_AVX2
    if (avx512) {
      TransposeToPanelAvx512(r, pairs, panel);
      continue;
    }
#endif
    for (int64_t l = 0; l < kPanelRows; ++l) {
      uint16_t* lane = panel + 2 * l;
      for (int64_t q = 0; q < pairs; ++q) {
        lane[q * 2 * kPanelRows] = r[l][2 * q];
        lane[q * 2 * kPanelRows + 1] = 2 * q + 1 < d ? r[l][2 * q + 1] : 0;
      }
    }
  }
}

// Values [start, hi) of KV head kvh as V panels: panel e / 16 holds head_dim element e of every
// key in lane e % 16, its line i the keys start + 2i and start + 2i + 1 (zero past hi).
void PackValues(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                int64_t hi, const Scratch& s, uint16_t* dst) {
  const int64_t d = view.head_dim;
  const int64_t pairs = (hi - start + 1) / 2;
#if PDSERVE_AVX2
  const bool avx512 = Avx512Enabled();
#endif
  Bf16Rows rows(view, table, kvh, /*values=*/true, start, hi, s);
  // Scales indexed from the call's first key (start rounded down to even), as the key scales.
  float* scales = s.value_scales - (start & ~int64_t{1}) + start;
  float unused;
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t c = 2 * i;
    const uint16_t* a = rows.Next(0, start + c < hi ? &scales[c] : &unused);
    const uint16_t* b = rows.Next(1, start + c + 1 < hi ? &scales[c + 1] : &unused);
    uint16_t* line = dst + i * 2 * kPanelRows;
#if PDSERVE_AVX2
    if (avx512) {
      InterleaveLinesAvx512(a, b, d, s.v_stride, line);
      continue;
    }
#endif
    for (int64_t p = 0; p * kPanelRows < d; ++p) {
      uint16_t* out = line + p * s.v_stride;
      for (int64_t l = 0; l < kPanelRows; ++l) {
        const int64_t e = p * kPanelRows + l;
        out[2 * l] = e < d ? a[e] : 0;
        out[2 * l + 1] = e < d ? b[e] : 0;
      }
    }
  }
}

// One row and head's n scores in place: times the keys' scales (quantized pools), times scale,
// softmax; P (times the values' scales) rounded to bf16 into p. Returns 1 / the sum.
float SoftmaxToP(float* scores, int64_t n, float scale, const float* key_scales,
                 const float* value_scales, uint16_t* p) {
  if (key_scales != nullptr) {
    for (int64_t i = 0; i < n; ++i) scores[i] *= key_scales[i];
  }
  for (int64_t i = 0; i < n; ++i) scores[i] *= scale;
  const float inv_sum = internal::Softmax(scores, n);
  if (value_scales != nullptr) {
    for (int64_t i = 0; i < n; ++i) p[i] = F32ToBf16(scores[i] * value_scales[i]);
  } else {
    RoundRowsToBf16(scores, 1, n, n, p, n);
  }
  return inv_sum;
}

}  // namespace

size_t PagedAttentionBf16ScratchBytes(int64_t max_keys, int64_t max_heads, int64_t head_dim,
                                      bool window) {
  // A call's keys start at its first row's window start rounded down to a panel: up to 15 more.
  return Carve(nullptr, max_keys + kPanelRows, max_heads, head_dim, window).bytes;
}

void PagedAttentionBf16(const KvPagesView& view, const int32_t* block_table,
                        int64_t first_position, int64_t num_rows, int64_t tile_begin,
                        int64_t tile_step, int64_t window, const float* q, int64_t ldq,
                        int64_t num_heads, float scale, int64_t head_begin, int64_t head_end,
                        float* out, int64_t ldo, void* scratch, size_t scratch_bytes,
                        MatrixLayout order) {
  PD_CHECK(order == MatrixLayout::kBf16Panels || order == MatrixLayout::kBf16PanelsAmx);
  const int64_t d = view.head_dim;
  const int64_t group = num_heads / view.num_kv_heads;
  const int64_t kvh = head_begin / group;
  const int64_t heads = head_end - head_begin;
  PD_CHECK(heads >= 1 && (head_end - 1) / group == kvh && tile_step >= 1);
  const int64_t tiles = (num_rows + kRows - 1) / kRows;
  if (tile_begin >= tiles) return;
  const int64_t last_tile = tile_begin + (tiles - 1 - tile_begin) / tile_step * tile_step;
  const int64_t last_row = std::min(num_rows, (last_tile + 1) * kRows) - 1;
  // Keys from the first row's window start (rounded down to a panel, so even) to the last row.
  const int64_t lo = WindowStart(first_position + tile_begin * kRows, window) / kPanelRows * kPanelRows;
  const int64_t hi = first_position + last_row + 1;
#if PDSERVE_AVX2
  if (num_rows == 1 && heads <= 8 && d % 32 == 0 && Bf16DotEnabled() &&
      (view.dtype == KvDType::kF32 || view.dtype == KvDType::kBF16)) {
    // Decode: one row reads every key once; packing them would cost more than the arithmetic.
    const int64_t start = WindowStart(first_position, window), n = first_position + 1 - start;
    Scratch s = Carve(static_cast<uint8_t*>(scratch), n, heads, d, false);
    PD_CHECK_MSG(s.bytes <= scratch_bytes, "bf16 attention scratch too small for the call's keys");
    const int g_count = static_cast<int>(heads);
    const bool amx = order == MatrixLayout::kBf16PanelsAmx;
    for (int64_t g = 0; g < heads; ++g) {
      RoundRowsToBf16(q + (head_begin + g) * d, 1, d, d, s.qb + g * d, d);
    }
    const int64_t ldp = s.nk + 2;
    if (view.dtype == KvDType::kF32) {
      DecodeScoresAny<KvDType::kF32>(g_count, amx, view, block_table, kvh, start, n, s.qb,
                                     s.scores, s.nk);
    } else {
      DecodeScoresAny<KvDType::kBF16>(g_count, amx, view, block_table, kvh, start, n, s.qb,
                                      s.scores, s.nk);
    }
    float inv_sum[8];
    for (int64_t g = 0; g < heads; ++g) {
      inv_sum[g] = SoftmaxToP(s.scores + g * s.nk, n, scale, nullptr, nullptr, s.p + g * ldp);
    }
    if (view.dtype == KvDType::kF32) {
      DecodeValuesAny<KvDType::kF32>(g_count, amx, view, block_table, kvh, start, n, s.p, ldp,
                                     s.acc);
    } else {
      DecodeValuesAny<KvDType::kBF16>(g_count, amx, view, block_table, kvh, start, n, s.p, ldp,
                                      s.acc);
    }
    for (int64_t g = 0; g < heads; ++g) {
      float* o = out + (head_begin + g) * d;
      for (int64_t e = 0; e < d; ++e) o[e] = s.acc[g * d + e] * inv_sum[g];
    }
    return;
  }
#endif
  Scratch s = Carve(static_cast<uint8_t*>(scratch), hi - lo, heads, d, window > 0);
  PD_CHECK_MSG(s.bytes <= scratch_bytes, "bf16 attention scratch too small for the call's keys");
  const bool quantized = KvDTypeQuantized(view.dtype);

  PackKeys(view, block_table, kvh, lo, hi, s);
  // A row's P.V pairs keys from its own window start: the packing from lo serves even starts,
  // the one from lo + 1 odd starts (windows only).
  bool packed[2] = {false, false};
  const MatrixRef k_ref{DType::kBF16, s.k_panels, s.nk, d, order};
  const int64_t ldp = s.nk + 2;
  const int64_t v_panels = (d + kPanelRows - 1) / kPanelRows;

  for (int64_t tile = tile_begin; tile < tiles; tile += tile_step) {
    const int64_t r0 = tile * kRows, rows = std::min(kRows, num_rows - r0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < heads; ++g) {
        RoundRowsToBf16(q + (r0 + r) * ldq + (head_begin + g) * d, 1, d, d,
                        s.qb + (r * heads + g) * d, d);
      }
    }
    // Every score the tile's rows need, in one kernel call: keys from the first row's window
    // start to the last row (a row's columns past its own position are computed and not read).
    const int64_t n_begin = WindowStart(first_position + r0, window) - lo;
    const int64_t n_end = first_position + r0 + rows - lo;
    LinearBf16Columns(s.qb, rows * heads, d, k_ref, s.scores, s.nk, n_begin, n_end);

    // Softmax and P of every row and head of the tile.
    float inv_sum[kRows * 64];
    PD_CHECK(heads <= 64);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = first_position + r0 + r;
      const int64_t start = WindowStart(position, window);
      const int64_t n = position + 1 - start, off = start - lo;
      const int par = static_cast<int>(start & 1);
      if (!packed[par]) {
        PackValues(view, block_table, kvh, lo + par, hi, s, s.v_packs[par]);
        packed[par] = true;
      }
      for (int64_t g = 0; g < heads; ++g) {
        inv_sum[r * heads + g] = SoftmaxToP(
            s.scores + (r * heads + g) * s.nk + off, n, scale,
            quantized ? s.key_scales + off : nullptr, quantized ? s.value_scales + off : nullptr,
            s.p + (r * heads + g) * ldp);
      }
    }
    // P.V. The rows that start where the first does (all of them without a window) share its
    // keys up to a point where the order lets a sum be split (any pair in kBf16Panels, a whole
    // tile of 32 keys from the start in kBf16PanelsAmx): one kernel call with every such row and
    // head as a token and head_dim as the outputs (the V panels viewed over those keys:
    // panel_stride). Each row then continues its own sums over its remaining keys.
    const int64_t split = order == MatrixLayout::kBf16PanelsAmx ? 2 * internal::kAmxTilePairs : 2;
    const int64_t start0 = WindowStart(first_position + r0, window);
    int64_t sharing = 1;
    while (sharing < rows && WindowStart(first_position + r0 + sharing, window) == start0) ++sharing;
    const int64_t shared = (first_position + r0 + 1 - start0) / split * split;  // Keys.
    if (shared > 0) {
      const int par = static_cast<int>(start0 & 1);
      const uint16_t* vp = s.v_packs[par] + (start0 - lo - par) / 2 * 2 * kPanelRows;
      const MatrixRef v_ref{DType::kBF16, vp, d, shared, order, s.v_stride};
      LinearBf16Columns(s.p, sharing * heads, ldp, v_ref, s.acc, d, 0, d);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = first_position + r0 + r;
      const int64_t start = WindowStart(position, window);
      const int64_t n = position + 1 - start;
      const int par = static_cast<int>(start & 1);
      const uint16_t* vp = s.v_packs[par] + (start - lo - par) / 2 * 2 * kPanelRows;
      const uint16_t* pr = s.p + r * heads * ldp;
      float* acc = s.acc + r * heads * d;
      int64_t done = r < sharing ? shared : 0;  // Keys already summed (even: whole V lines).
      const int64_t whole = n / split * split;
      if (whole - done > 2 * kCopyPairs) {  // Long remainders straight from the packing.
        const MatrixRef v_ref{DType::kBF16, vp + done * kPanelRows, d, whole - done, order,
                              s.v_stride};
        LinearBf16Columns(pr + done, heads, ldp, v_ref, acc, d, 0, d, done > 0);
        done = whole;
      }
      // The rest (fewer than 2 * kCopyPairs + 2 keys, or than a tile; an odd count's last key
      // with its pair's other element zeroed as past the end of a matrix) copied into panels of
      // their own: one call.
      const int64_t cols = n - done;
      if (cols == 0) continue;
      const int64_t line_pairs = (cols + 1) / 2, stride = PanelElements(cols);
      PD_CHECK(line_pairs <= kLinesPerPanel);
      for (int64_t p = 0; p < v_panels; ++p) {
        std::memcpy(s.lines + p * stride, vp + p * s.v_stride + done * kPanelRows,
                    static_cast<size_t>(line_pairs) * 2 * kPanelRows * 2);
        if (cols % 2 != 0) {
          uint16_t* last = s.lines + p * stride + (line_pairs - 1) * 2 * kPanelRows;
          for (int64_t l = 0; l < kPanelRows; ++l) last[2 * l + 1] = 0;
        }
      }
      const MatrixRef lines_ref{DType::kBF16, s.lines, d, cols, order};
      LinearBf16Columns(pr + done, heads, ldp, lines_ref, acc, d, 0, d, done > 0);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < heads; ++g) {
        float* o = out + (r0 + r) * ldo + (head_begin + g) * d;
        const float* acc = s.acc + (r * heads + g) * d;
        const float inv = inv_sum[r * heads + g];
        for (int64_t e = 0; e < d; ++e) o[e] = acc[e] * inv;
      }
    }
  }
}

void PagedAttentionBf16Reference(const KvPagesView& view, const int32_t* block_table,
                                 int64_t position, int64_t window, const float* q,
                                 int64_t num_heads, float scale, int64_t head_begin,
                                 int64_t head_end, float* out, MatrixLayout order) {
  const int64_t d = view.head_dim;
  const bool amx = order == MatrixLayout::kBf16PanelsAmx;
  constexpr int64_t kTileKeys = 2 * internal::kAmxTilePairs;  // Also head_dim's elements per tile.
  const int64_t group = num_heads / view.num_kv_heads;
  const int64_t start = WindowStart(position, window), n = position + 1 - start;
  const bool quantized = KvDTypeQuantized(view.dtype);
  std::vector<uint16_t> qb(d), row(d);
  std::vector<std::vector<uint16_t>> values(n, std::vector<uint16_t>(d));
  std::vector<float> scores(n), acc(d);
  std::vector<uint16_t> p(n);
  for (int64_t h = head_begin; h < head_end; ++h) {
    const int64_t kvh = h / group;
    for (int64_t i = 0; i < d; ++i) qb[i] = F32ToBf16(q[h * d + i]);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = start + j;
      const int32_t block = block_table[pos / view.block_size];
      const int64_t slot = pos % view.block_size;
      RowAsBf16(view.dtype, view.Key(block, kvh, slot), d, row.data());
      float dot = 0.0f;
      if (amx) {  // linear_bf16.h's second order: per tile of pairs, even and odd chains.
        for (int64_t t0 = 0; t0 < d; t0 += kTileKeys) {
          float even = 0.0f, odd = 0.0f;
          for (int64_t i0 = t0; i0 < std::min(d, t0 + kTileKeys); i0 += 2) {
            const int64_t i1 = i0 + 1;
            even = Bf16DotStep(even, qb[i0], row[i0]);
            odd = Bf16DotStep(odd, i1 < d ? qb[i1] : 0, i1 < d ? row[i1] : 0);
          }
          dot = internal::AmxTileSum(dot, even, odd);
        }
      } else {
        for (int64_t i0 = 0; i0 < d; i0 += 2) {
          const int64_t i1 = i0 + 1;
          dot = Bf16DotStep(dot, i1 < d ? qb[i1] : 0, i1 < d ? row[i1] : 0);
          dot = Bf16DotStep(dot, qb[i0], row[i0]);
        }
      }
      if (quantized) dot *= *view.KeyScale(block, kvh, slot);
      scores[j] = dot * scale;
      RowAsBf16(view.dtype, view.Value(block, kvh, slot), d, values[j].data());
    }
    const float inv_sum = internal::Softmax(scores.data(), n);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = start + j;
      const float vs = quantized ? *view.ValueScale(block_table[pos / view.block_size], kvh,
                                                    pos % view.block_size)
                                 : 1.0f;
      p[j] = F32ToBf16(quantized ? scores[j] * vs : scores[j]);
    }
    for (int64_t e = 0; e < d; ++e) {
      float a = 0.0f;
      if (amx) {  // Tiles of 32 keys from the start: the earlier key of each pair in one chain.
        for (int64_t t0 = 0; t0 < n; t0 += kTileKeys) {
          float even = 0.0f, odd = 0.0f;
          for (int64_t j = t0; j < std::min(n, t0 + kTileKeys); j += 2) {
            even = Bf16DotStep(even, p[j], values[j][e]);
            odd = Bf16DotStep(odd, j + 1 < n ? p[j + 1] : 0, j + 1 < n ? values[j + 1][e] : 0);
          }
          a = internal::AmxTileSum(a, even, odd);
        }
        acc[e] = a;
        continue;
      }
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {
        a = Bf16DotStep(a, p[j + 1], values[j + 1][e]);
        a = Bf16DotStep(a, p[j], values[j][e]);
      }
      if (j < n) {  // The last pair's other element is zero (and its product added first).
        a = Bf16DotStep(a, 0, 0);
        a = Bf16DotStep(a, p[j], values[j][e]);
      }
      acc[e] = a;
    }
    for (int64_t e = 0; e < d; ++e) out[h * d + e] = acc[e] * inv_sum;
  }
}

}  // namespace pdserve::kernels
