#include "kernels/cpu/linear_quant_panels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/dtype.h"
#include "kernels/cpu/linear_quant_simd.h"
#include "kernels/cpu/linear_quant_vnni.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd.h"

#if !defined(__clang__)
// GCC 12: AVX-512 intrinsics start from _mm512_undefined_*() (as in linear_quant_vnni.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace pdserve::kernels {
namespace {

constexpr int kP = static_cast<int>(kQuantPanelRows);

// Offsets inside one panel block (linear_quant_panels.h).
namespace q4k {
// Per sub-block of 32 its codes' low 4 bits (256) and, for Q5_K, their fifth bits (64) side by
// side (one stream through a block), then scales, mins, d and dmin.
constexpr int SubBytes(bool fifth) { return fifth ? 320 : 256; }
constexpr int Codes(bool fifth, int sub, int pair) { return SubBytes(fifth) * sub + 64 * pair; }
constexpr int High(int sub) { return SubBytes(true) * sub + 256; }
constexpr int Scales(bool fifth) { return 8 * SubBytes(fifth); }
constexpr int Mins(bool fifth) { return Scales(fifth) + 128; }
constexpr int D(bool fifth) { return Scales(fifth) + 256; }
constexpr int Dmin(bool fifth) { return Scales(fifth) + 288; }
constexpr int Bytes(bool fifth) { return Scales(fifth) + 320; }
static_assert(Bytes(false) == 2368 && Bytes(true) == 2880);
}
namespace q6k {
// Three planes of 64 bytes per sub-block of 16, side by side (one stream through a block).
constexpr int Plane(int sub, int j) { return 192 * sub + 64 * j; }
constexpr int kScales = 3072, kD = 3328, kBytes = 3360;
}
// The 32-element formats: codes (Q8_0 bytes; Q4_0 and Q5_0 nibbles), Q5_0's fifth bits, d.
namespace q8 {
constexpr int kCodes = 0, kD = 512, kBytes = 544;
}
namespace q4 {
constexpr int kCodes = 0, kD = 256, kBytes = 288;
}
namespace q5 {
constexpr int kCodes = 0, kHigh = 256, kD = 320, kBytes = 352;
}

bool HasPanels(GgmlType type) { return GgmlPanelBlockBytes(type) > 0; }

bool Is32(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ5_0;
}
int PanelBlockElements(GgmlType type) { return Is32(type) ? 32 : 256; }
// What the 32-element formats add to a signed code to store it unsigned.
int CodeOffset(GgmlType type) {
  return type == GgmlType::kQ8_0 ? 128 : type == GgmlType::kQ4_0 ? 8 : 16;
}
int DAt(GgmlType type) { return type == GgmlType::kQ8_0 ? q8::kD : type == GgmlType::kQ4_0 ? q4::kD : q5::kD; }

// Where block s of a panel's `blocks` keeps its codes and its 16 d (f16, the block's last 32
// bytes), as offsets from the panel's start, for the 32-element formats, whose blocks are 32
// bytes past whole lines (linear_quant_panels.h): a pair of blocks is stored as the first's
// codes, the second's, then their d side by side, so every block's codes start on a line and no
// 64-byte load straddles two (every other Q8_0 block's did: +7-10% from memory, bench/
// RESULTS.md, "blocks stored in pairs"). An odd last block is stored whole. Q6_K (3,360 bytes)
// is not paired: it read 5-12% slower so.
struct Place {
  int64_t body, d;
};
inline Place Paired(int64_t s, int64_t blocks, int64_t bytes) {
  const int64_t at = s * bytes;
  if (s % 2 == 1) return {at - 32, at + bytes - 32};
  if (s + 1 < blocks) return {at, at + 2 * bytes - 64};
  return {at, at + bytes - 32};
}

// One block of rows c < n of a panel (src[c], row-major blocks) into dst; rows past n stay zero.
// Q4_K, or Q5_K (fifth true): the codes' low 4 bits as Q4_K's, each sub-block's fifth bits after
// its codes.
void PackBlockQ45K(bool fifth, const uint8_t* const* src, int n, uint8_t* dst) {
  std::memset(dst, 0, q4k::Bytes(fifth));
  uint8_t q[256];
  for (int c = 0; c < n; ++c) {
    BlockCodesK(fifth ? GgmlType::kQ5_K : GgmlType::kQ4_K, src[c], q);
    for (int sub = 0; sub < 8; ++sub) {
      for (int pair = 0; pair < 4; ++pair) {
        for (int i = 0; i < 4; ++i) {
          const int e = 32 * sub + 8 * pair + i;
          dst[q4k::Codes(fifth, sub, pair) + 4 * c + i] =
              static_cast<uint8_t>((q[e] & 0xF) | ((q[e + 4] & 0xF) << 4));
          if (fifth) {
            dst[q4k::High(sub) + 4 * c + i] |=
                static_cast<uint8_t>(((q[e] >> 4) << (2 * pair)) | ((q[e + 4] >> 4) << (2 * pair + 1)));
          }
        }
      }
      int sc, mn;
      KQuantScaleMin(sub, src[c] + 4, &sc, &mn);
      dst[q4k::Scales(fifth) + 16 * sub + c] = static_cast<uint8_t>(sc);
      dst[q4k::Mins(fifth) + 32 * (sub / 2) + 2 * c + sub % 2] = static_cast<uint8_t>(mn);
    }
    std::memcpy(dst + q4k::D(fifth) + 2 * c, src[c], 2);
    std::memcpy(dst + q4k::Dmin(fifth) + 2 * c, src[c] + 2, 2);
  }
}

void PackBlockQ6K(const uint8_t* const* src, int n, uint8_t* dst) {
  std::memset(dst, 0, q6k::kBytes);
  uint8_t q[256];
  for (int c = 0; c < n; ++c) {
    BlockCodesK(GgmlType::kQ6_K, src[c], q);
    for (int sub = 0; sub < 16; ++sub) {
      for (int j = 0; j < 3; ++j) {
        for (int i = 0; i < 4; ++i) {
          const int e = 16 * sub + 4 * j + i, fourth = 16 * sub + 12 + i;
          dst[q6k::Plane(sub, j) + 4 * c + i] =
              static_cast<uint8_t>(q[e] | (((q[fourth] >> (2 * j)) & 3) << 6));
        }
      }
      dst[q6k::kScales + 32 * (sub / 2) + 2 * c + sub % 2] = src[c][192 + sub];
    }
    std::memcpy(dst + q6k::kD + 2 * c, src[c] + 208, 2);
  }
}

void PackBlock32(GgmlType type, const uint8_t* const* src, int n, uint8_t* dst, uint8_t* d) {
  std::memset(dst, 0, static_cast<size_t>(DAt(type)));
  std::memset(d, 0, 32);
  int8_t q[32];
  for (int c = 0; c < n; ++c) {
    BlockCodes32(type, src[c], q);
    for (int e = 0; e < 32; ++e) {
      const int l = e / 4, i = e % 4;
      const int u = q[e] + CodeOffset(type);  // 0-255 (Q8_0), 0-15 (Q4_0), 0-31 (Q5_0).
      if (type == GgmlType::kQ8_0) {
        dst[q8::kCodes + 64 * l + 4 * c + i] = static_cast<uint8_t>(u);
        continue;
      }
      dst[q4::kCodes + 64 * (l / 2) + 4 * c + i] |= static_cast<uint8_t>((u & 0xF) << (4 * (l % 2)));
      if (type == GgmlType::kQ5_0) dst[q5::kHigh + 4 * c + i] |= static_cast<uint8_t>((u >> 4) << l);
    }
    std::memcpy(d + 2 * c, src[c], 2);
  }
}

// The signed code of element e (0-31) of row c in a 32-element panel block.
int Code32(GgmlType type, const uint8_t* b, int c, int e) {
  const int l = e / 4, i = e % 4;
  if (type == GgmlType::kQ8_0) return b[q8::kCodes + 64 * l + 4 * c + i] - CodeOffset(type);
  int u = (b[q4::kCodes + 64 * (l / 2) + 4 * c + i] >> (4 * (l % 2))) & 0xF;
  if (type == GgmlType::kQ5_0) u |= ((b[q5::kHigh + 4 * c + i] >> l) & 1) << 4;
  return u - CodeOffset(type);
}

float F16At(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return F16ToF32(v);
}

}  // namespace

bool QuantPanelsSupported(GgmlType type) {
  static const bool off = [] {
    const char* v = std::getenv("PDSERVE_QUANT_PANELS");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  if (off || !HasPanels(type)) return false;
#if PDSERVE_AVX2
  return true;
#else
  return false;
#endif
}

int64_t QuantPanelsBytes(GgmlType type, int64_t rows, int64_t cols) {
  return (rows + kP - 1) / kP * (cols / PanelBlockElements(type)) * GgmlPanelBlockBytes(type);
}

void PackQuantPanels(const QuantMatrixRef& w, void* dst) {
  const int64_t blocks = w.cols / PanelBlockElements(w.type), block_bytes = GgmlBlockBytes(w.type);
  const int64_t panel_block = GgmlPanelBlockBytes(w.type);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t p = 0; p * kP < w.rows; ++p) {
    const int n = static_cast<int>(std::min<int64_t>(kP, w.rows - p * kP));
    uint8_t* panel = out + p * blocks * panel_block;
    for (int64_t s = 0; s < blocks; ++s) {
      const uint8_t* src[kP];
      for (int c = 0; c < n; ++c) src[c] = w.row(p * kP + c) + s * block_bytes;
      if (Is32(w.type)) {
        const Place at = Paired(s, blocks, panel_block);
        PackBlock32(w.type, src, n, panel + at.body, panel + at.d);
      } else if (w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ5_K) {
        PackBlockQ45K(w.type == GgmlType::kQ5_K, src, n, panel + s * panel_block);
      } else {
        PackBlockQ6K(src, n, panel + s * panel_block);
      }
    }
  }
}

void DequantizePanelRow(GgmlType type, const void* panels, int64_t cols, int64_t row, float* out) {
  const int64_t elements = PanelBlockElements(type), blocks = cols / elements;
  const int64_t panel_block = GgmlPanelBlockBytes(type);
  const int c = static_cast<int>(row % kP);
  const uint8_t* panel = static_cast<const uint8_t*>(panels) + (row / kP) * blocks * panel_block;
  for (int64_t s = 0; s < blocks; ++s) {
    const Place at = Is32(type) ? Paired(s, blocks, panel_block) : Place{s * panel_block, 0};
    const uint8_t* b = panel + at.body;
    float* o = out + elements * s;
    if (Is32(type)) {  // As quant_blocks.cc: d * code.
      const float d = F16At(panel + at.d + 2 * c);
      for (int e = 0; e < 32; ++e) o[e] = d * static_cast<float>(Code32(type, b, c, e));
    } else if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K) {
      // As quant_blocks.cc's Q45K: fma(d * sc, q, -(dmin * mn)).
      const bool fifth = type == GgmlType::kQ5_K;
      const float d = F16At(b + q4k::D(fifth) + 2 * c), dmin = F16At(b + q4k::Dmin(fifth) + 2 * c);
      for (int sub = 0; sub < 8; ++sub) {
        const float ds = d * static_cast<float>(b[q4k::Scales(fifth) + 16 * sub + c]);
        const float ms = dmin * static_cast<float>(b[q4k::Mins(fifth) + 32 * (sub / 2) + 2 * c + sub % 2]);
        for (int pair = 0; pair < 4; ++pair) {
          const uint8_t* lane = b + q4k::Codes(fifth, sub, pair) + 4 * c;
          for (int i = 0; i < 4; ++i) {
            const int high = fifth ? b[q4k::High(sub) + 4 * c + i] >> (2 * pair) : 0;
            const int lo = (lane[i] & 0xF) | ((high & 1) << 4), hi = (lane[i] >> 4) | (((high >> 1) & 1) << 4);
            o[32 * sub + 8 * pair + i] = std::fma(ds, static_cast<float>(lo), -ms);
            o[32 * sub + 8 * pair + 4 + i] = std::fma(ds, static_cast<float>(hi), -ms);
          }
        }
      }
    } else {  // As Q6K: (d * scale) * (code - 32).
      const float d = F16At(b + q6k::kD + 2 * c);
      for (int sub = 0; sub < 16; ++sub) {
        const auto sc = static_cast<int8_t>(b[q6k::kScales + 32 * (sub / 2) + 2 * c + sub % 2]);
        for (int g = 0; g < 4; ++g) {
          for (int i = 0; i < 4; ++i) {
            int code = 0;
            if (g < 3) {
              code = b[q6k::Plane(sub, g) + 4 * c + i] & 0x3F;
            } else {
              for (int j = 0; j < 3; ++j) code |= (b[q6k::Plane(sub, j) + 4 * c + i] >> 6) << (2 * j);
            }
            o[16 * sub + 4 * g + i] = (d * static_cast<float>(sc)) * static_cast<float>(code - 32);
          }
        }
      }
    }
  }
}

#if PDSERVE_AVX2

#define PD_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

namespace {

// The row-major kernels' pieces: BitTo4, Load32.
using quant_simd::BitTo4;
using quant_simd::Load32;

// Part `part` of kParts of a block's lines, kPrefetchBytes ahead, into L2 (the first rows of x
// stream the weights from memory, as the row-major kernels' Prefetch does). Issued one part per
// pass of a block's inner loop, unrolled, not in a loop of its own before the block: that loop
// cost 4 instructions a line, and a decode step on K-quant weights ran 5-9% faster with the
// prefetches spread (bench/RESULTS.md, "prefetches spread through a block").
template <int kBytes, int kParts>
inline void PrefetchPart(const uint8_t* blk, int part) {
  constexpr int kLines = (kBytes + 63) / 64, kPer = (kLines + kParts - 1) / kParts;
#pragma GCC unroll 16
  for (int i = 0; i < kPer; ++i) {
    const int line = part * kPer + i;
    if (line < kLines) {
      _mm_prefetch(reinterpret_cast<const char*>(blk + quant_simd::kPrefetchBytes + 64 * line),
                   _MM_HINT_T1);
    }
  }
}

// Rows t..t+R-1 of x as the panel kernels read them: codes, block scales, and the sums of the
// codes per `sum_block` (16 or 32) elements.
template <int R>
struct XRowsAt {
  const int8_t* codes[R];
  const int16_t* sums[R];
  const float* scales[R];
  XRowsAt(const QuantizedActivations& xq, int64_t t, int sum_block) {
    const std::vector<int16_t>& all = sum_block == 16 ? xq.sum16 : xq.sum32;
    for (int r = 0; r < R; ++r) {
      codes[r] = xq.codes(t + r);
      sums[r] = all.data() + (t + r) * (xq.k / sum_block);
      scales[r] = xq.scales(t + r);
    }
  }
};

PD_VNNI inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
PD_VNNI inline __m512i Broadcast4(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
PD_VNNI inline __m512i Load64(const uint8_t* p) { return _mm512_loadu_si512(p); }
PD_VNNI inline __m512 LoadF16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Rows t..t+R-1 of x against one panel (16 outputs per row): per block, per sub-block of 32, the
// codes' dot products with x in 16 int32 lanes (VPDPBUSD: unsigned codes, x's signed codes),
// times the sub-block scales into the block's integer total; the mins' total by VPDPWSSD on
// (min, min) and (sum, sum) pairs; then linear_quant.h's float steps.
template <bool kFifth>
struct PanelQ45K {
  static constexpr int kBytes = q4k::Bytes(kFifth);
  static constexpr int kRows = 8;  // 3 x 8 accumulators in the 32 registers.
  template <int R>
  PD_VNNI static void Run(const uint8_t* panel, int64_t blocks, const QuantizedActivations& xq,
                          int64_t t, bool prefetch, uint32_t keep, float* y, int64_t ldy) {
    const XRowsAt<R> x(xq, t, 32);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t s = 0; s < blocks; ++s) {
      const uint8_t* b = panel + s * kBytes;
      __m512i itot[R];
      for (int r = 0; r < R; ++r) itot[r] = _mm512_setzero_si512();
      for (int sub = 0; sub < 8; ++sub) {
        if (prefetch) PrefetchPart<kBytes, 8>(b, sub);
        // Few rows of x: several chains of VPDPBUSD per row (a single one of 8 was bound by the
        // instruction's latency at decode); integer sums, so any grouping gives the same total.
        constexpr int kChains = R == 1 ? 4 : R == 2 ? 2 : 1;
        __m512i dot[R][kChains];
        for (int r = 0; r < R; ++r) {
          for (int ch = 0; ch < kChains; ++ch) dot[r][ch] = _mm512_setzero_si512();
        }
        const __m512i high = kFifth ? Load64(b + q4k::High(sub)) : _mm512_setzero_si512();
        for (int pair = 0; pair < 4; ++pair) {
          const __m512i packed = Load64(b + q4k::Codes(kFifth, sub, pair));
          __m512i lo = _mm512_and_si512(packed, m4);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), m4);
          if constexpr (kFifth) {  // Bits 2 pair and 2 pair + 1 of the plane to bit 4.
            const __m512i b4 = _mm512_set1_epi8(0x10);
            const int sl = 2 * pair, sh = 2 * pair + 1;
            lo = _mm512_or_si512(lo, _mm512_and_si512(sl <= 4 ? _mm512_slli_epi16(high, 4 - sl)
                                                               : _mm512_srli_epi16(high, sl - 4), b4));
            hi = _mm512_or_si512(hi, _mm512_and_si512(sh <= 4 ? _mm512_slli_epi16(high, 4 - sh)
                                                               : _mm512_srli_epi16(high, sh - 4), b4));
          }
          for (int r = 0; r < R; ++r) {
            const int8_t* xp = x.codes[r] + 256 * s + 32 * sub + 8 * pair;
            __m512i& c0 = dot[r][(2 * pair) % kChains];
            __m512i& c1 = dot[r][(2 * pair + 1) % kChains];
            c0 = _mm512_dpbusd_epi32(c0, lo, Broadcast4(xp));
            c1 = _mm512_dpbusd_epi32(c1, hi, Broadcast4(xp + 4));
          }
        }
        const __m512i sc = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + q4k::Scales(kFifth) + 16 * sub)));
        for (int r = 0; r < R; ++r) {
          __m512i total = dot[r][0];
          for (int ch = 1; ch < kChains; ++ch) total = _mm512_add_epi32(total, dot[r][ch]);
          itot[r] = _mm512_add_epi32(itot[r], _mm512_mullo_epi32(total, sc));
        }
      }
      __m512i imin[R];
      for (int r = 0; r < R; ++r) imin[r] = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) {
        const __m512i mn = _mm512_cvtepu8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + q4k::Mins(kFifth) + 32 * i)));
        for (int r = 0; r < R; ++r) {
          imin[r] = _mm512_dpwssd_epi32(imin[r], mn, Broadcast4(x.sums[r] + 8 * s + 2 * i));
        }
      }
      const __m512 d = LoadF16x16(b + q4k::D(kFifth)), dmin = LoadF16x16(b + q4k::Dmin(kFifth));
      for (int r = 0; r < R; ++r) {
        const __m512 ft = _mm512_cvtepi32_ps(itot[r]), fm = _mm512_cvtepi32_ps(imin[r]);
        const __m512 p = _mm512_mul_ps(dmin, fm);
        const __m512 e = _mm512_fmsub_ps(dmin, fm, p);
        const __m512 blk = _mm512_sub_ps(_mm512_fmsub_ps(d, ft, p), e);
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x.scales[r][s]), blk, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (t + r) * ldy, static_cast<__mmask16>(keep), acc[r]);
  }
};

// Q6_K: per sub-block of 16, the 6-bit codes of three groups of 4 k masked out of their planes and
// the fourth's gathered from the planes' top bit pairs, dotted with x and scaled (signed) into the
// total; the offset 32 * sum of scale * x's 16-sums taken out at the end of the block (VPDPWSSD
// on (scale, scale) pairs).
struct PanelQ6K {
  static constexpr int kBytes = q6k::kBytes;
  static constexpr int kRows = 8;
  template <int R>
  PD_VNNI static void Run(const uint8_t* panel, int64_t blocks, const QuantizedActivations& xq,
                          int64_t t, bool prefetch, uint32_t keep, float* y, int64_t ldy) {
    const XRowsAt<R> x(xq, t, 16);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3f = _mm512_set1_epi8(0x3F), m03 = _mm512_set1_epi8(0x03);
    for (int64_t s = 0; s < blocks; ++s) {
      const uint8_t* b = panel + s * kBytes;
      __m512i itot[R], off[R];
      for (int r = 0; r < R; ++r) itot[r] = off[r] = _mm512_setzero_si512();
      for (int pair = 0; pair < 8; ++pair) {
        if (prefetch) PrefetchPart<kBytes, 8>(b, pair);
        const __m512i scales = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + q6k::kScales + 32 * pair)));
        for (int r = 0; r < R; ++r) {
          off[r] = _mm512_dpwssd_epi32(off[r], scales, Broadcast4(x.sums[r] + 16 * s + 2 * pair));
        }
        for (int odd = 0; odd < 2; ++odd) {
          const int sub = 2 * pair + odd;
          const __m512i sc = odd ? _mm512_srai_epi32(scales, 16)
                                 : _mm512_srai_epi32(_mm512_slli_epi32(scales, 16), 16);
          const __m512i p0 = Load64(b + q6k::Plane(sub, 0)), p1 = Load64(b + q6k::Plane(sub, 1));
          const __m512i p2 = Load64(b + q6k::Plane(sub, 2));
          const __m512i q0 = _mm512_and_si512(p0, m3f), q1 = _mm512_and_si512(p1, m3f);
          const __m512i q2 = _mm512_and_si512(p2, m3f);
          // The fourth group from the planes' top bit pairs: bits 0-1 from p0's, 2-3 from p1's,
          // 4-5 from p2's (bit selects; 16-bit shifts bring a neighbour's bits in above them).
          const __m512i t = _mm512_ternarylogic_epi32(m03, _mm512_srli_epi16(p0, 6),
                                                      _mm512_srli_epi16(p1, 4), 0xCA);
          const __m512i q3 = _mm512_and_si512(
              _mm512_ternarylogic_epi32(m4, t, _mm512_srli_epi16(p2, 2), 0xCA), m3f);
          for (int r = 0; r < R; ++r) {
            const int8_t* xp = x.codes[r] + 256 * s + 16 * sub;
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q0, Broadcast4(xp));
            dot = _mm512_dpbusd_epi32(dot, q1, Broadcast4(xp + 4));
            dot = _mm512_dpbusd_epi32(dot, q2, Broadcast4(xp + 8));
            dot = _mm512_dpbusd_epi32(dot, q3, Broadcast4(xp + 12));
            itot[r] = _mm512_add_epi32(itot[r], _mm512_mullo_epi32(dot, sc));
          }
        }
      }
      const __m512 d = LoadF16x16(b + q6k::kD);
      for (int r = 0; r < R; ++r) {
        const __m512i total = _mm512_sub_epi32(itot[r], _mm512_slli_epi32(off[r], 5));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x.scales[r][s])),
                                 _mm512_cvtepi32_ps(total), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (t + r) * ldy, static_cast<__mmask16>(keep), acc[r]);
  }
};

// The codes of quad l (elements 4l..4l+3 of 16 rows) of a 32-element panel block, per format,
// stored unsigned: the signed code plus kOffset (CodeOffset). Prepare loads what the block's quads
// share.
struct CodesQ8_0 {
  static constexpr int kBytes = q8::kBytes, kOffset = 128;
  PD_VNNI static __m512i Prepare(const uint8_t*) { return _mm512_setzero_si512(); }
  PD_VNNI static __m512i Quad(const uint8_t* b, __m512i, int l) { return Load64(b + q8::kCodes + 64 * l); }
};
struct CodesQ4_0 {
  static constexpr int kBytes = q4::kBytes, kOffset = 8;
  PD_VNNI static __m512i Prepare(const uint8_t*) { return _mm512_setzero_si512(); }
  PD_VNNI static __m512i Quad(const uint8_t* b, __m512i, int l) {
    __m512i v = Load64(b + q4::kCodes + 64 * (l / 2));
    if (l % 2) v = _mm512_srli_epi16(v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
  }
};
struct CodesQ5_0 {
  static constexpr int kBytes = q5::kBytes, kOffset = 16;
  PD_VNNI static __m512i Prepare(const uint8_t* b) { return Load64(b + q5::kHigh); }
  PD_VNNI static __m512i Quad(const uint8_t* b, __m512i high, int l) {
    __m512i v = Load64(b + q5::kCodes + 64 * (l / 2));
    if (l % 2) v = _mm512_srli_epi16(v, 4);
    // Bit l of each high byte to bit 4 (16-bit shifts: bits crossing bytes are masked off).
    const __m512i h = l <= 4 ? _mm512_slli_epi16(high, 4 - l) : _mm512_srli_epi16(high, l - 4);
    return _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi8(0x0F)),
                           _mm512_and_si512(h, _mm512_set1_epi8(0x10)));
  }
};

// Q8_0, Q4_0, Q5_0: per block, each output's integer total is VPDPBUSD of the unsigned stored
// codes against x's four signed codes broadcast, line after line (two chains, to overlap their
// latency), started from -kOffset x the sum of x's 32 codes (shared by the 16 outputs: the
// offset's whole contribution); then linear_quant.h's one FMA per block.
template <typename Codes>
struct PanelBlocks32 {
  static constexpr int kBytes = Codes::kBytes;
  static constexpr int kRows = 6;  // 2 (R < 4: 3) registers per row of x.
  template <int R>
  PD_VNNI static void Run(const uint8_t* panel, int64_t blocks, const QuantizedActivations& xq,
                          int64_t t, bool prefetch, uint32_t keep, float* y, int64_t ldy) {
    constexpr int kChains = R < 4 ? 2 : 1;
    const XRowsAt<R> x(xq, t, 32);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < blocks; ++s) {
      const Place at = Paired(s, blocks, kBytes);
      const uint8_t* b = panel + at.body;
      const __m512i shared = Codes::Prepare(b);
      __m512i tot[R][kChains];
      for (int r = 0; r < R; ++r) {
        tot[r][0] = _mm512_set1_epi32(-Codes::kOffset * x.sums[r][s]);
        if constexpr (kChains > 1) tot[r][1] = _mm512_setzero_si512();
      }
      for (int l = 0; l < 8; ++l) {
        // One row of x streams fastest on the hardware prefetcher alone (Zen 4, one thread:
        // +34%); more rows compute long enough per line that the hints pay (16 rows: 1.8x).
        if (prefetch && R > 1) PrefetchPart<kBytes, 8>(b, l);
        __m512i w = Codes::Quad(b, shared, l);
        // In a register for every row's VPDPBUSD: GCC folds Q8_0's load into each, more loads
        // of a line from memory in flight for one (one load read 2% faster, bench/RESULTS.md).
        asm("" : "+v"(w));
        for (int r = 0; r < R; ++r) {
          tot[r][l % kChains] =
              _mm512_dpbusd_epi32(tot[r][l % kChains], w, Broadcast4(x.codes[r] + 32 * s + 4 * l));
        }
      }
      const __m512 d = LoadF16x16(panel + at.d);
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(x.scales[r][s]));
        __m512i itot = tot[r][0];
        if constexpr (kChains > 1) itot = _mm512_add_epi32(itot, tot[r][1]);
        const __m512 total = _mm512_cvtepi32_ps(itot);
        acc[r] = _mm512_fmadd_ps(scale, total, acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (t + r) * ldy, static_cast<__mmask16>(keep), acc[r]);
  }
};

// ---- The AVX2 kernels of the panels ----------------------------------------------------------
//
// For CPUs without AVX512-VNNI: a panel in two halves of 8 columns (32 bytes of each 64-byte row).
// K-quants: per k-quad VPMADDUBSW (unsigned codes, x's signed codes: pairs of products, at most
// 2 x 63 x 127, no saturation) and VPMADDWD by the column's sub-block scale in both halves of its
// lane, which is the scale times the quad's four products, exact in int32. The 32-element
// formats: VPMADDUBSW and VPMADDWD by 1 per quad. The same integer totals, so the same bits.

inline __m256i Bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline __m128i Load16At(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256 LoadF16x8(const uint8_t* p) { return _mm256_cvtph_ps(Load16At(p)); }
// Lane c (int32) = (v, v) as int16 from a byte per column.
inline __m256i ScaleTwice(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  const __m256i s = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(v)));
  return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}
// y's eight columns of a half that `keep` (its 8 bits) asks for.
inline void StoreKept(float* y, uint32_t keep, __m256 v) {
  if (keep == 0xFF) {
    _mm256_storeu_ps(y, v);
    return;
  }
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i mask = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(keep)), bit), bit);
  _mm256_maskstore_ps(y, mask, v);
}
template <bool kFifth>
struct PanelQ45KAvx2 {
  static constexpr int kBytes = q4k::Bytes(kFifth);
  static constexpr int kRows = 4;

  template <int pair, int R>
  static void Pair(const uint8_t* b, int sub, int h, __m256i high, __m256i sc, const int8_t* const* x,
                   __m256i* itot) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i packed = Load32(b + q4k::Codes(kFifth, sub, pair) + 32 * h);
    __m256i lo = _mm256_and_si256(packed, m4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
    if constexpr (kFifth) {
      lo = _mm256_or_si256(lo, BitTo4<2 * pair>(high));
      hi = _mm256_or_si256(hi, BitTo4<2 * pair + 1>(high));
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xp = x[r] + 32 * sub + 8 * pair;
      itot[r] = _mm256_add_epi32(itot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, Bcast4(xp)), sc));
      itot[r] = _mm256_add_epi32(itot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, Bcast4(xp + 4)), sc));
    }
  }

  template <int R>
  static void Run(const uint8_t* panel, int64_t blocks, const QuantizedActivations& xq, int64_t t,
                  bool prefetch, uint32_t keep, float* y, int64_t ldy) {
    const XRowsAt<R> rows(xq, t, 32);
    for (int h = 0; h < 2; ++h) {
      const uint32_t kept = (keep >> (8 * h)) & 0xFF;
      if (kept == 0) continue;
      __m256 acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t s = 0; s < blocks; ++s) {
        const uint8_t* b = panel + s * kBytes;
        const int8_t* x[R];
        __m256i itot[R];
        for (int r = 0; r < R; ++r) {
          x[r] = rows.codes[r] + 256 * s;
          itot[r] = _mm256_setzero_si256();
        }
        for (int sub = 0; sub < 8; ++sub) {
          if (prefetch && h == 0) PrefetchPart<kBytes, 8>(b, sub);
          const __m256i sc = ScaleTwice(b + q4k::Scales(kFifth) + 16 * sub + 8 * h);
          const __m256i high = kFifth ? Load32(b + q4k::High(sub) + 32 * h) : _mm256_setzero_si256();
          Pair<0, R>(b, sub, h, high, sc, x, itot);
          Pair<1, R>(b, sub, h, high, sc, x, itot);
          Pair<2, R>(b, sub, h, high, sc, x, itot);
          Pair<3, R>(b, sub, h, high, sc, x, itot);
        }
        const __m256 d = LoadF16x8(b + q4k::D(kFifth) + 16 * h), dmin = LoadF16x8(b + q4k::Dmin(kFifth) + 16 * h);
        for (int r = 0; r < R; ++r) {
          const int16_t* xs = rows.sums[r] + 8 * s;
          __m256i imin = _mm256_setzero_si256();
          for (int i = 0; i < 4; ++i) {
            const __m256i mn = _mm256_cvtepu8_epi16(Load16At(b + q4k::Mins(kFifth) + 32 * i + 16 * h));
            imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mn, Bcast4(xs + 2 * i)));
          }
          const __m256 ft = _mm256_cvtepi32_ps(itot[r]), fm = _mm256_cvtepi32_ps(imin);
          const __m256 p = _mm256_mul_ps(dmin, fm);
          const __m256 e = _mm256_fmsub_ps(dmin, fm, p);
          const __m256 blk = _mm256_sub_ps(_mm256_fmsub_ps(d, ft, p), e);
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(rows.scales[r][s]), blk, acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) StoreKept(y + (t + r) * ldy + 8 * h, kept, acc[r]);
    }
  }
};

struct PanelQ6KAvx2 {
  static constexpr int kBytes = q6k::kBytes;
  static constexpr int kRows = 4;
  template <int R>
  static void Run(const uint8_t* panel, int64_t blocks, const QuantizedActivations& xq, int64_t t,
                  bool prefetch, uint32_t keep, float* y, int64_t ldy) {
    const XRowsAt<R> rows(xq, t, 16);
    const __m256i m3f = _mm256_set1_epi8(0x3F), m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C),
                  m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const uint32_t kept = (keep >> (8 * h)) & 0xFF;
      if (kept == 0) continue;
      __m256 acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t s = 0; s < blocks; ++s) {
        const uint8_t* b = panel + s * kBytes;
        __m256i itot[R];
        for (int r = 0; r < R; ++r) itot[r] = _mm256_setzero_si256();
        for (int sub = 0; sub < 16; ++sub) {
          if (prefetch && h == 0) PrefetchPart<kBytes, 16>(b, sub);
          // (scale, scale) per lane: the sub-block's half of the pair (as int16, signed).
          const __m256i pairs = _mm256_cvtepi8_epi16(Load16At(b + q6k::kScales + 32 * (sub / 2) + 16 * h));
          const __m256i sc = sub % 2 == 0 ? _mm256_blend_epi16(pairs, _mm256_slli_epi32(pairs, 16), 0xAA)
                                          : _mm256_blend_epi16(_mm256_srli_epi32(pairs, 16), pairs, 0xAA);
          const __m256i p0 = Load32(b + q6k::Plane(sub, 0) + 32 * h);
          const __m256i p1 = Load32(b + q6k::Plane(sub, 1) + 32 * h);
          const __m256i p2 = Load32(b + q6k::Plane(sub, 2) + 32 * h);
          const __m256i q0 = _mm256_and_si256(p0, m3f), q1 = _mm256_and_si256(p1, m3f);
          const __m256i q2 = _mm256_and_si256(p2, m3f);
          const __m256i q3 = _mm256_or_si256(
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p0, 6), m03),
                              _mm256_and_si256(_mm256_srli_epi16(p1, 4), m0c)),
              _mm256_and_si256(_mm256_srli_epi16(p2, 2), m30));
          for (int r = 0; r < R; ++r) {
            const int8_t* x = rows.codes[r] + 256 * s + 16 * sub;
            itot[r] = _mm256_add_epi32(itot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q0, Bcast4(x)), sc));
            itot[r] = _mm256_add_epi32(itot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q1, Bcast4(x + 4)), sc));
            itot[r] = _mm256_add_epi32(itot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q2, Bcast4(x + 8)), sc));
            itot[r] = _mm256_add_epi32(itot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q3, Bcast4(x + 12)), sc));
          }
        }
        const __m256 d = LoadF16x8(b + q6k::kD + 16 * h);
        for (int r = 0; r < R; ++r) {
          const int16_t* xs = rows.sums[r] + 16 * s;
          __m256i off = _mm256_setzero_si256();
          for (int pair = 0; pair < 8; ++pair) {
            const __m256i pairs = _mm256_cvtepi8_epi16(Load16At(b + q6k::kScales + 32 * pair + 16 * h));
            off = _mm256_add_epi32(off, _mm256_madd_epi16(pairs, Bcast4(xs + 2 * pair)));
          }
          const __m256i total = _mm256_sub_epi32(itot[r], _mm256_slli_epi32(off, 5));
          acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(rows.scales[r][s])),
                                   _mm256_cvtepi32_ps(total), acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) StoreKept(y + (t + r) * ldy + 8 * h, kept, acc[r]);
    }
  }
};

// Half h (8 columns) of quad l of a 32-element panel block, as VPMADDUBSW takes it. Q4_0 and
// Q5_0: the stored unsigned codes (at most 31: pairs of products stay in int16). Q8_0's stored
// codes (0-255) would saturate a pair, so kSigned: the signed codes back, multiplied as |w| by x
// with w's sign (DotSigned's way); they carry no offset.
struct CodesQ8_0Avx2 {
  static constexpr int kBytes = q8::kBytes, kOffset = 0;
  static constexpr bool kSigned = true;
  static __m256i Prepare(const uint8_t*, int) { return _mm256_setzero_si256(); }
  static __m256i Quad(const uint8_t* b, __m256i, int l, int h) {
    return _mm256_xor_si256(Load32(b + q8::kCodes + 64 * l + 32 * h), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};
struct CodesQ4_0Avx2 {
  static constexpr int kBytes = q4::kBytes, kOffset = 8;
  static constexpr bool kSigned = false;
  static __m256i Prepare(const uint8_t*, int) { return _mm256_setzero_si256(); }
  static __m256i Quad(const uint8_t* b, __m256i, int l, int h) {
    __m256i v = Load32(b + q4::kCodes + 64 * (l / 2) + 32 * h);
    if (l % 2) v = _mm256_srli_epi16(v, 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
  }
};
struct CodesQ5_0Avx2 {
  static constexpr int kBytes = q5::kBytes, kOffset = 16;
  static constexpr bool kSigned = false;
  static __m256i Prepare(const uint8_t* b, int h) { return Load32(b + q5::kHigh + 32 * h); }
  static __m256i Quad(const uint8_t* b, __m256i high, int l, int h) {
    __m256i v = Load32(b + q5::kCodes + 64 * (l / 2) + 32 * h);
    if (l % 2) v = _mm256_srli_epi16(v, 4);
    const __m256i hb = l <= 4 ? _mm256_slli_epi16(high, 4 - l) : _mm256_srli_epi16(high, l - 4);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)),
                           _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
  }
};

// One row of x takes both halves of each line in one pass over the panel (read once from
// memory); more rows a half at a time (their registers), the second pass from L2.
template <typename Codes>
struct PanelBlocks32Avx2 {
  static constexpr int kBytes = Codes::kBytes;
  static constexpr int kRows = 4;
  template <int R>
  static void Run(const uint8_t* panel, int64_t blocks, const QuantizedActivations& xq, int64_t t,
                  bool prefetch, uint32_t keep, float* y, int64_t ldy) {
    constexpr int kHalves = R == 1 ? 2 : 1;
    const XRowsAt<R> rows(xq, t, 32);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h0 = 0; h0 < 2; h0 += kHalves) {
      if (((keep >> (8 * h0)) & ((1u << (8 * kHalves)) - 1)) == 0) continue;
      __m256 acc[R][kHalves];
      for (int r = 0; r < R; ++r) {
        for (int i = 0; i < kHalves; ++i) acc[r][i] = _mm256_setzero_ps();
      }
      for (int64_t s = 0; s < blocks; ++s) {
        const Place at = Paired(s, blocks, kBytes);
        const uint8_t* b = panel + at.body;
        __m256i shared[kHalves], itot[R][kHalves];
        for (int i = 0; i < kHalves; ++i) shared[i] = Codes::Prepare(b, h0 + i);
        for (int r = 0; r < R; ++r) {
          for (int i = 0; i < kHalves; ++i) itot[r][i] = _mm256_set1_epi32(-Codes::kOffset * rows.sums[r][s]);
        }
        for (int l = 0; l < 8; ++l) {
          if (prefetch && h0 == 0) PrefetchPart<kBytes, 8>(b, l);
          for (int i = 0; i < kHalves; ++i) {
            const __m256i w = Codes::Quad(b, shared[i], l, h0 + i);
            const __m256i u = Codes::kSigned ? _mm256_sign_epi8(w, w) : w;
            for (int r = 0; r < R; ++r) {
              __m256i xb = Bcast4(rows.codes[r] + 32 * s + 4 * l);
              if constexpr (Codes::kSigned) xb = _mm256_sign_epi8(xb, w);
              itot[r][i] = _mm256_add_epi32(itot[r][i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xb), ones));
            }
          }
        }
        for (int i = 0; i < kHalves; ++i) {
          const __m256 d = LoadF16x8(panel + at.d + 16 * (h0 + i));
          for (int r = 0; r < R; ++r) {
            acc[r][i] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(rows.scales[r][s])),
                                        _mm256_cvtepi32_ps(itot[r][i]), acc[r][i]);
          }
        }
      }
      for (int i = 0; i < kHalves; ++i) {
        const uint32_t kept = (keep >> (8 * (h0 + i))) & 0xFF;
        for (int r = 0; r < R; ++r) StoreKept(y + (t + r) * ldy + 8 * (h0 + i), kept, acc[r][i]);
      }
    }
  }
};

// Every panel the columns touch, its rows of x kRows at a time (then 4, 2, 1); `keep` has bit c
// set for the panel's columns in [n_begin, n_end).
template <typename Kernel>
void Columns(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y, int64_t ldy,
             int64_t n_begin, int64_t n_end) {
  const int64_t blocks = w.cols / PanelBlockElements(w.type), panel_bytes = blocks * Kernel::kBytes;
  constexpr int kRows = Kernel::kRows;
  for (int64_t p = n_begin / kP; p * kP < n_end; ++p) {
    const int64_t j0 = p * kP;
    const int64_t lo = std::max(n_begin, j0) - j0, hi = std::min(n_end, j0 + kP) - j0;
    const uint32_t keep = ((1u << hi) - 1) & ~((1u << lo) - 1);
    const uint8_t* panel = static_cast<const uint8_t*>(w.data) + p * panel_bytes;
    float* yp = y + j0;
    int64_t t = 0;
    for (; t + kRows <= xq.m; t += kRows) {
      Kernel::template Run<kRows>(panel, blocks, xq, t, t == 0, keep, yp, ldy);
    }
    if constexpr (kRows > 4) {
      if (xq.m - t >= 4) {
        Kernel::template Run<4>(panel, blocks, xq, t, t == 0, keep, yp, ldy);
        t += 4;
      }
    }
    if (xq.m - t >= 2) {
      Kernel::template Run<2>(panel, blocks, xq, t, t == 0, keep, yp, ldy);
      t += 2;
    }
    if (xq.m - t >= 1) Kernel::template Run<1>(panel, blocks, xq, t, t == 0, keep, yp, ldy);
  }
}

}  // namespace

void LinearQuantPanelColumns(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y,
                             int64_t ldy, int64_t n_begin, int64_t n_end) {
  // Every format has AVX2 kernels too, with the same bits.
  const bool vnni = QuantVnniEnabled();
  switch (w.type) {
    case GgmlType::kQ8_0:
      return vnni ? Columns<PanelBlocks32<CodesQ8_0>>(xq, w, y, ldy, n_begin, n_end)
                  : Columns<PanelBlocks32Avx2<CodesQ8_0Avx2>>(xq, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ4_0:
      return vnni ? Columns<PanelBlocks32<CodesQ4_0>>(xq, w, y, ldy, n_begin, n_end)
                  : Columns<PanelBlocks32Avx2<CodesQ4_0Avx2>>(xq, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ5_0:
      return vnni ? Columns<PanelBlocks32<CodesQ5_0>>(xq, w, y, ldy, n_begin, n_end)
                  : Columns<PanelBlocks32Avx2<CodesQ5_0Avx2>>(xq, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ4_K:
      return vnni ? Columns<PanelQ45K<false>>(xq, w, y, ldy, n_begin, n_end)
                  : Columns<PanelQ45KAvx2<false>>(xq, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ5_K:
      return vnni ? Columns<PanelQ45K<true>>(xq, w, y, ldy, n_begin, n_end)
                  : Columns<PanelQ45KAvx2<true>>(xq, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ6_K:
      return vnni ? Columns<PanelQ6K>(xq, w, y, ldy, n_begin, n_end)
                  : Columns<PanelQ6KAvx2>(xq, w, y, ldy, n_begin, n_end);
    default: return;
  }
}

#else  // No AVX2 in this build: QuantPanelsSupported is false, nothing is packed.

void LinearQuantPanelColumns(const QuantizedActivations&, const QuantMatrixRef&, float*, int64_t,
                             int64_t, int64_t) {}

#endif

}  // namespace pdserve::kernels
