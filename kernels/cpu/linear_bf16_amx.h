// AMX-BF16 path of the bf16 linear kernel (internal to kernels/cpu; contract in linear_bf16.h).
//
// TDPBF16PS, for each output, sums the element-0 products of its k tile's pairs in one f32 chain
// and the element-1 products in another, both from zero, in order, each product-add an FMA with
// DAZ, FTZ and round to nearest even, and then adds (chain 0 + chain 1) to C (Intel's current
// pseudocode; the older one showed one chain, pair by pair, which the hardware does not do:
// bench/RESULTS.md). That is the kBf16PanelsAmx order of linear_bf16.h when every TDPBF16PS
// covers one of its k tiles: 16 pairs, and the last, partial, tile through tiles sized for it.
// AmxEnabled() checks the hardware against the order's scalar reference before the path is used.
//
// The panel layout is already AMX's B tile: 16 pairs of one panel are 16 rows of 64 bytes. A tile
// = up to 16 tokens x 16 pairs; C = those tokens x one panel's 16 outputs. Tiles: C0, C1 (two
// panels), A, B0, B1 for whole tiles of 16 pairs, and A', B0', B1' sized for the last k tile.
// A tiles read the activations in place; an odd k has them staged (copied, with a zero after the
// last element) so no tile reads past a row.
//
// The kernel is a template over the tile operations so that the tests can run its logic (staging,
// tails, column ranges) through an emulation of them on a CPU without AMX
// (linear_bf16_amx_test.cc); the binary instantiates it with the instructions only.
#ifndef PDSERVE_KERNELS_CPU_LINEAR_BF16_AMX_H_
#define PDSERVE_KERNELS_CPU_LINEAR_BF16_AMX_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/base/tensor_ref.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve::kernels::amx {

// LDTILECFG's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // Bytes per row of each tile.
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tile registers.
enum Tile : int { kC0 = 0, kC1 = 1, kA = 2, kB0 = 3, kB1 = 4, kATail = 5, kB0Tail = 6, kB1Tail = 7 };

constexpr int64_t kLanes = internal::kPanelRows;  // Outputs per panel: a C tile's columns.
constexpr int64_t kTilePairs = internal::kAmxTilePairs;  // k pairs per A/B tile (64-byte rows).
constexpr int64_t kTileRows = 16;   // Tokens per A/C tile.

// The tile configuration for `tokens` rows (1-16) and a last k tile of `tail_pairs` (0-15).
inline TileConfig MakeConfig(int tokens, int tail_pairs) {
  TileConfig cfg;
  const auto rows = static_cast<uint8_t>(tokens);
  for (int t : {kC0, kC1}) {
    cfg.rows[t] = rows;
    cfg.colsb[t] = kLanes * 4;
  }
  cfg.rows[kA] = rows;
  cfg.colsb[kA] = kTilePairs * 4;
  for (int t : {kB0, kB1}) {
    cfg.rows[t] = kTilePairs;
    cfg.colsb[t] = kLanes * 4;
  }
  if (tail_pairs > 0) {
    cfg.rows[kATail] = rows;
    cfg.colsb[kATail] = static_cast<uint16_t>(tail_pairs * 4);
    for (int t : {kB0Tail, kB1Tail}) {
      cfg.rows[t] = static_cast<uint8_t>(tail_pairs);
      cfg.colsb[t] = kLanes * 4;
    }
  }
  return cfg;
}

// Rows [0, tokens) of x as the A tiles read them: `pairs` pairs per row, zero past k.
inline void StageTokens(const uint16_t* x, int64_t ldx, int tokens, int64_t k, uint16_t* staged) {
  const int64_t pairs = (k + 1) / 2;
  for (int t = 0; t < tokens; ++t) {
    uint16_t* dst = staged + t * pairs * 2;
    std::memcpy(dst, x + t * ldx, static_cast<size_t>(k) * 2);
    if (k % 2 != 0) dst[k] = 0;
  }
}

// One k tile from pair q: the tokens' rows (`a`, `a_stride` bytes apart) into A, panel p's pairs
// into B0 (and p + 1's into B1 when `two`), each product added to its C tile.
template <class Ops, int A, int B0, int B1>
void KStep(const uint16_t* a, int64_t a_stride, const uint16_t* b0, const uint16_t* b1,
           int64_t q, bool two) {
  Ops::template Load<A>(a + 2 * q, a_stride);
  Ops::template Load<B0>(b0 + q * 2 * kLanes, kLanes * 4);
  Ops::template Dot<kC0, A, B0>();
  if (two) {
    Ops::template Load<B1>(b1 + q * 2 * kLanes, kLanes * 4);
    Ops::template Dot<kC1, A, B1>();
  }
}

// Columns [n_begin, n_end) of y for m rows of xb against w packed as kBf16PanelsAmx; with
// `accumulate` the C tiles start from y's values (the order's accumulator walks on: a k split at a
// whole tile gives one call's bits). `Ops` supplies Configure(const TileConfig&), Zero<T>(),
// Load<T>(ptr, stride_bytes), Dot<C, A, B>(), Store<T>(ptr, stride_bytes), Release().
template <class Ops>
void Columns(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
             int64_t n_begin, int64_t n_end, bool accumulate = false) {
  const int64_t k = w.cols, pairs = (k + 1) / 2, panel_elements = internal::PanelStride(w);
  const int64_t full = pairs / kTilePairs * kTilePairs;
  const int tail = static_cast<int>(pairs - full);
  const auto* panels = static_cast<const uint16_t*>(w.data);
  // An even k: the A tiles read x's rows where they are (no tile reads past a row's k elements).
  // An odd one: rows staged with a zero after the last element.
  const bool stage = k % 2 != 0;
  const int64_t a_stride = stage ? pairs * 4 : ldx * 2;  // Bytes from one token row to the next.
  thread_local std::vector<uint16_t> staged;
  if (stage) staged.resize(static_cast<size_t>(kTileRows * pairs * 2));
  alignas(64) float c[2][kTileRows][kLanes];
  for (int64_t t0 = 0; t0 < m; t0 += kTileRows) {
    const int tokens = static_cast<int>(std::min(kTileRows, m - t0));
    const uint16_t* a = xb + t0 * ldx;
    if (stage) {
      StageTokens(a, ldx, tokens, k, staged.data());
      a = staged.data();
    }
    Ops::Configure(MakeConfig(tokens, tail));
    for (int64_t p = n_begin / kLanes; p * kLanes < n_end; p += 2) {
      const bool two = (p + 1) * kLanes < n_end;
      const uint16_t* b0 = panels + p * panel_elements;
      const uint16_t* b1 = b0 + panel_elements;
      if (accumulate) {  // C from y: a panel inside the range in place, one cut by its ends via c.
        for (int h = 0; h < (two ? 2 : 1); ++h) {
          const int64_t first = (p + h) * kLanes;
          const int64_t lo = std::max(n_begin, first), hi = std::min(n_end, first + kLanes);
          const float* in = y + t0 * ldy + first;
          int64_t stride = ldy * 4;
          if (lo != first || hi != first + kLanes) {
            std::memset(c[h], 0, sizeof(c[h]));
            for (int t = 0; t < tokens; ++t) {
              std::memcpy(&c[h][t][lo - first], y + (t0 + t) * ldy + lo, (hi - lo) * sizeof(float));
            }
            in = &c[h][0][0];
            stride = kLanes * 4;
          }
          if (h == 0) {
            Ops::template Load<kC0>(in, stride);
          } else {
            Ops::template Load<kC1>(in, stride);
          }
        }
      } else {
        Ops::template Zero<kC0>();
        if (two) Ops::template Zero<kC1>();
      }
      for (int64_t q = 0; q < full; q += kTilePairs) {
        KStep<Ops, kA, kB0, kB1>(a, a_stride, b0, b1, q, two);
      }
      if (tail > 0) KStep<Ops, kATail, kB0Tail, kB1Tail>(a, a_stride, b0, b1, full, two);
      // A panel inside the range goes straight to y; one cut by its ends through c.
      for (int h = 0; h < (two ? 2 : 1); ++h) {
        const int64_t first = (p + h) * kLanes;
        const int64_t lo = std::max(n_begin, first), hi = std::min(n_end, first + kLanes);
        const bool whole = lo == first && hi == first + kLanes;
        float* out = whole ? y + t0 * ldy + first : &c[h][0][0];
        const int64_t stride = whole ? ldy * 4 : kLanes * 4;
        if (h == 0) {
          Ops::template Store<kC0>(out, stride);
        } else {
          Ops::template Store<kC1>(out, stride);
        }
        if (whole) continue;
        for (int t = 0; t < tokens; ++t) {
          std::memcpy(y + (t0 + t) * ldy + lo, &c[h][t][lo - first], (hi - lo) * sizeof(float));
        }
      }
    }
  }
  Ops::Release();
}

}  // namespace pdserve::kernels::amx

#endif  // PDSERVE_KERNELS_CPU_LINEAR_BF16_AMX_H_
