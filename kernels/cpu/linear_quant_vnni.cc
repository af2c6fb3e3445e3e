#include "kernels/cpu/linear_quant_vnni.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/linear_quant_simd.h"

// GCC 12's AVX-512 insert/extract intrinsics start from _mm512_undefined_*(), a self-initialised
// value, and -Wmaybe-uninitialized reports it once they are inlined (a false positive).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace pdserve::kernels {

#if PDSERVE_AVX2

// Every function that uses AVX-512 carries this attribute (no file-wide flags: inline functions
// of shared headers compiled here must stay AVX2; see linear_avx512.cc).
#define PD_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

namespace {

using namespace quant_simd;  // NOLINT: the shared pieces of both paths.

bool CpuHasVnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}

std::atomic<bool>& EnabledFlag() {
  static std::atomic<bool> enabled{[] {
    const char* isa = std::getenv("PDSERVE_KERNEL_ISA");
    return CpuHasVnni() && !(isa != nullptr && std::strcmp(isa, "avx2") == 0);
  }()};
  return enabled;
}

// [a | b] as one 512-bit register.
PD_VNNI inline __m512i JoinI(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// ---- Q8_0, Q4_0, Q5_0 -------------------------------------------------------------------------
//
// For GroupK, per row of x the block's 32 products in 8 lanes: x's codes plus 128 (an unsigned
// byte, as VPDPBUSD wants) times the signed weight codes, started from -128 x the weights' 4-sums,
// is exactly the sum of the four products (256-bit VPDPBUSD: a block is 32 codes).

template <typename Codes>
struct Kernel32 {
  static constexpr int kElements = 32, kDAt = 0, kDminAt = -1;
  template <int R>
  PD_VNNI static void Dot(const uint8_t* b, const XRows<R>& x, __m256i* dot, __m128i*) {
    const __m256i wv = Codes::At(b), bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i init = _mm256_sub_epi32(_mm256_setzero_si256(),
                                          _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, wv));
    for (int r = 0; r < R; ++r) dot[r] = _mm256_dpbusd_epi32(init, _mm256_xor_si256(Load32(x.q[r]), bias), wv);
  }
};

// ---- Q4_K, Q5_K, Q6_K -------------------------------------------------------------------------
//
// 64 codes at a time (two sub-blocks of 32, or four of Q6_K's 16): VPMADDUBSW into 32 int16 pair
// sums, then VPDPWSSD multiplies each by its sub-block's scale and adds pairs of them into the
// int32 accumulator. The 512-bit accumulator folds into the AVX2 path's 8-lane one at the end of
// the block (integer sums: any order gives the same total).

// The 32 int16 lanes of a 64-code product, each the scale (int16 lane of sc) of its sub-block:
// lanes 0-15 scale a, 16-31 scale b; or, with four, lanes 8i..8i+7 scale a + i.
template <int a, int b>
PD_VNNI inline __m512i ScalesOfTwo(__m512i sc) {
  const __m512i idx = _mm512_set_epi16(b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b,  //
                                       a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a);
  return _mm512_permutexvar_epi16(idx, sc);
}
template <int a>
PD_VNNI inline __m512i ScalesOfFour(__m512i sc) {
  constexpr int b = a + 1, c = a + 2, d = a + 3;
  const __m512i idx = _mm512_set_epi16(d, d, d, d, d, d, d, d, c, c, c, c, c, c, c, c,  //
                                       b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
  return _mm512_permutexvar_epi16(idx, sc);
}

PD_VNNI inline __m256i Fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// Pair p (sub-blocks 2p, 2p+1) of a Q4_K (kFifth false) or Q5_K block against R rows.
template <bool kFifth, int p, int R>
PD_VNNI inline void PairQ45K(const uint8_t* qs, __m256i qh, const XRows<R>& x, __m512i sc,
                             __m512i* acc) {
  const __m256i bytes = Load32(qs + 32 * p);
  __m512i codes = _mm512_and_si512(JoinI(bytes, _mm256_srli_epi16(bytes, 4)), _mm512_set1_epi8(0x0F));
  if constexpr (kFifth) {
    codes = _mm512_or_si512(codes, JoinI(BitTo4<2 * p>(qh), BitTo4<2 * p + 1>(qh)));
  }
  const __m512i scale = ScalesOfTwo<2 * p, 2 * p + 1>(sc);
  for (int r = 0; r < R; ++r) {
    const __m512i prod = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(x.q[r] + 64 * p));
    acc[r] = _mm512_dpwssd_epi32(acc[r], prod, scale);
  }
}

template <bool kFifth>
struct KernelQ45K {
  static constexpr int kElements = 256, kDAt = 0, kDminAt = 2;
  template <int R>
  PD_VNNI static void Dot(const uint8_t* b, const XRows<R>& x, __m256i* dot, __m128i* mins) {
    const __m256i sm = ScalesMins(b + 4);  // int16: the eight scales, then the eight mins.
    const __m512i sc = _mm512_castsi256_si512(sm);
    const __m128i mn = _mm256_extracti128_si256(sm, 1);
    __m512i acc[R];
    for (int r = 0; r < R; ++r) {
      mins[r] = _mm_madd_epi16(mn, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sum32[r])));
      acc[r] = _mm512_setzero_si512();
    }
    const uint8_t* qs = kFifth ? b + 48 : b + 16;
    const __m256i qh = kFifth ? Load32(b + 16) : _mm256_setzero_si256();
    PairQ45K<kFifth, 0, R>(qs, qh, x, sc, acc);
    PairQ45K<kFifth, 1, R>(qs, qh, x, sc, acc);
    PairQ45K<kFifth, 2, R>(qs, qh, x, sc, acc);
    PairQ45K<kFifth, 3, R>(qs, qh, x, sc, acc);
    for (int r = 0; r < R; ++r) dot[r] = Fold(acc[r]);
  }
};

// Half h of a Q6_K block (128 codes): quarters 0 and 1 (x at 128h, 64 codes), then 2 and 3.
// Quarter k's codes are ql's nibbles (low for k < 2) with two bits of qh (shifted by 4, 2, 0, -2),
// as linear_quant.cc's HalfQ6K; sc: the block's sixteen scales as int16.
template <int h, int R>
PD_VNNI inline void HalfQ6K(const uint8_t* b, const XRows<R>& x, __m512i sc, __m512i* acc) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i ql = _mm512_loadu_si512(b + 64 * h);  // ql0 | ql1
  const __m512i qh = _mm512_broadcast_i64x4(Load32(b + 128 + 32 * h));
  const __m512i shift01 = _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
                                           0x0002000200020002, 0x0004000400040004, 0x0004000400040004,
                                           0x0004000400040004, 0x0004000400040004);
  const __m512i shift23 = _mm512_set_epi64(0x0002000200020002, 0x0002000200020002, 0x0002000200020002,
                                           0x0002000200020002, 0, 0, 0, 0);
  const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                      _mm512_and_si512(_mm512_sllv_epi16(qh, shift01), m30));
  const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                      _mm512_and_si512(_mm512_srlv_epi16(qh, shift23), m30));
  const __m512i s01 = ScalesOfFour<8 * h>(sc), s23 = ScalesOfFour<8 * h + 4>(sc);
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(q01, _mm512_loadu_si512(x.q[r] + 128 * h)), s01);
    acc[r] = _mm512_dpwssd_epi32(
        acc[r], _mm512_maddubs_epi16(q23, _mm512_loadu_si512(x.q[r] + 128 * h + 64)), s23);
  }
}

// Q6_K: per row, the sum over the 16 sub-blocks of scale * (codes . x - 32 * sum of x's codes).
struct KernelQ6K {
  static constexpr int kElements = 256, kDAt = 208, kDminAt = -1;
  template <int R>
  PD_VNNI static void Dot(const uint8_t* b, const XRows<R>& x, __m256i* dot, __m128i*) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
    HalfQ6K<0, R>(b, x, sc, acc);
    HalfQ6K<1, R>(b, x, sc, acc);
    for (int r = 0; r < R; ++r) {
      const __m256i off = _mm256_madd_epi16(sc16, Load32(x.sum16[r]));
      dot[r] = _mm256_sub_epi32(Fold(acc[r]), _mm256_slli_epi32(off, 5));
    }
  }
};

#define PD_QUANT_TARGET PD_VNNI
#include "kernels/cpu/linear_quant_group.inc"
#undef PD_QUANT_TARGET

constexpr int kRows = 4;  // Rows of x per kernel call, as the AVX2 path.

template <typename Codes>
constexpr QuantColumnsFn kTiles32 = Tiles<kRows, GroupK<Kernel32<Codes>, kRows>, GroupK<Kernel32<Codes>, 1>>;
template <typename Kernel>
constexpr QuantColumnsFn kTilesK = Tiles<kRows, GroupK<Kernel, kRows>, GroupK<Kernel, 1>>;

}  // namespace

bool QuantVnniEnabled() { return EnabledFlag().load(std::memory_order_relaxed); }

void SetQuantVnniEnabled(bool enabled) {
  EnabledFlag().store(enabled && CpuHasVnni(), std::memory_order_relaxed);
}

QuantColumnsFn QuantColumnsVnni(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return kTiles32<CodesQ8_0>;
    case GgmlType::kQ4_0: return kTiles32<CodesQ4_0>;
    case GgmlType::kQ5_0: return kTiles32<CodesQ5_0>;
    case GgmlType::kQ4_K: return kTilesK<KernelQ45K<false>>;
    case GgmlType::kQ5_K: return kTilesK<KernelQ45K<true>>;
    case GgmlType::kQ6_K: return kTilesK<KernelQ6K>;
    default: return nullptr;
  }
}

#else  // No AVX2 in this build: the scalar twin everywhere.

bool QuantVnniEnabled() { return false; }
void SetQuantVnniEnabled(bool) {}
QuantColumnsFn QuantColumnsVnni(GgmlType) { return nullptr; }

#endif

}  // namespace pdserve::kernels
