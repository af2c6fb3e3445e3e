#include "kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/tensor_ref.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve::kernels {
namespace {

using internal::kPanelRows;
using internal::PanelElements;
constexpr int64_t kRows = kAttentionBf16RowsPerTile;
// A row's remaining pairs up to this many are copied with its last one and summed in one call.
constexpr int64_t kCopyPairs = 8;

inline float FlushDenormal(float f) {
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}
// One step of VDPBF16PS's sequence: acc + a * b, bf16 inputs, denormals flushed in and out.
inline float Step(float acc, uint16_t a, uint16_t b) {
  return FlushDenormal(std::fma(FlushDenormal(Bf16ToF32(a)), FlushDenormal(Bf16ToF32(b)), acc));
}

inline int64_t WindowStart(int64_t position, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
}

// A K or V row of the pool as bf16: f32 rounded to nearest even, bf16 as is, int8/int4 codes
// (exact in bf16; the row scale is applied apart).
void RowAsBf16(KvDType dtype, const uint8_t* row, int64_t d, uint16_t* out) {
  switch (dtype) {
    case KvDType::kF32:
      RoundRowsToBf16(reinterpret_cast<const float*>(row), 1, d, d, out, d);
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
  uint16_t* lines = nullptr; // A row's last V lines, copied (kCopyPairs + 1 per panel).
  float* key_scales = nullptr;
  float* value_scales = nullptr;
  uint16_t* row = nullptr;   // One row as bf16.
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
      take(static_cast<size_t>(v_panels * PanelElements(2 * (kCopyPairs + 1))) * 2));
  s.key_scales = reinterpret_cast<float*>(take(static_cast<size_t>(s.nk) * 4));
  s.value_scales = reinterpret_cast<float*>(take(static_cast<size_t>(s.nk) * 4));
  s.row = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(d + 1) * 2));
  s.bytes = at;
  return s;
}

// Keys [lo, hi) of KV head kvh as K panels: key lo + c is lane c % 16 of panel c / 16, whose line
// q holds its elements 2q, 2q + 1 (linear_bf16.h's layout with keys as the matrix's rows). Lanes
// past hi are zero.
void PackKeys(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t lo, int64_t hi,
              const Scratch& s) {
  const int64_t d = view.head_dim, pairs = (d + 1) / 2, pe = PanelElements(d);
  const bool quantized = KvDTypeQuantized(view.dtype);
  s.row[d] = 0;  // The missing odd element of an odd head_dim.
  SlotCursor cursor(table, view.block_size, lo);
  const int64_t end = lo + (hi - lo + kPanelRows - 1) / kPanelRows * kPanelRows;
  for (int64_t j = lo; j < end; ++j) {
    const int64_t c = j - lo;
    if (j < hi) {
      RowAsBf16(view.dtype, view.Key(cursor.block(), kvh, cursor.slot()), d, s.row);
      s.key_scales[c] = quantized ? *view.KeyScale(cursor.block(), kvh, cursor.slot()) : 1.0f;
      cursor.Next();
    } else {
      std::memset(s.row, 0, static_cast<size_t>(d) * 2);
    }
    uint32_t* lane = reinterpret_cast<uint32_t*>(s.k_panels + (c / kPanelRows) * pe) + c % kPanelRows;
    for (int64_t q = 0; q < pairs; ++q) {
      uint32_t pair;
      std::memcpy(&pair, s.row + 2 * q, 4);
      lane[q * kPanelRows] = pair;
    }
  }
}

// Values [start, hi) of KV head kvh as V panels: panel e / 16 holds head_dim element e of every
// key in lane e % 16, its line i the keys start + 2i and start + 2i + 1 (zero past hi).
void PackValues(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                int64_t hi, const Scratch& s, uint16_t* dst) {
  const int64_t d = view.head_dim;
  const int64_t pairs = (hi - start + 1) / 2;
  if (d % kPanelRows != 0) {  // Lanes past head_dim are read (and their sums dropped): zero them.
    const int64_t v_panels = (d + kPanelRows - 1) / kPanelRows;
    for (int64_t p = 0; p < v_panels; ++p) {
      std::memset(dst + p * s.v_stride, 0, static_cast<size_t>(pairs) * 2 * kPanelRows * 2);
    }
  }
  const bool quantized = KvDTypeQuantized(view.dtype);
  SlotCursor cursor(table, view.block_size, start);
  for (int64_t j = start; j < start + 2 * pairs; ++j) {
    const int64_t c = j - start;
    if (j < hi) {
      RowAsBf16(view.dtype, view.Value(cursor.block(), kvh, cursor.slot()), d, s.row);
      // Indexed from the call's first key, as the K panels' scales.
      if (quantized) s.value_scales[j - (start & ~int64_t{1})] =
          *view.ValueScale(cursor.block(), kvh, cursor.slot());
      cursor.Next();
    } else {
      std::memset(s.row, 0, static_cast<size_t>(d) * 2);
    }
    uint16_t* line = dst + (c / 2) * 2 * kPanelRows + c % 2;
    for (int64_t e = 0; e < d; ++e) line[(e / kPanelRows) * s.v_stride + (e % kPanelRows) * 2] = s.row[e];
  }
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
                        float* out, int64_t ldo, void* scratch, size_t scratch_bytes) {
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
  Scratch s = Carve(static_cast<uint8_t*>(scratch), hi - lo, heads, d, window > 0);
  PD_CHECK_MSG(s.bytes <= scratch_bytes, "bf16 attention scratch too small for the call's keys");
  const bool quantized = KvDTypeQuantized(view.dtype);

  PackKeys(view, block_table, kvh, lo, hi, s);
  // A row's P.V pairs keys from its own window start: the packing from lo serves even starts,
  // the one from lo + 1 odd starts (windows only).
  bool packed[2] = {false, false};
  const MatrixRef k_ref{DType::kBF16, s.k_panels, s.nk, d, MatrixLayout::kBf16Panels};
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
        float* sr = s.scores + (r * heads + g) * s.nk + off;
        if (quantized) {
          for (int64_t i = 0; i < n; ++i) sr[i] *= s.key_scales[off + i];
        }
        for (int64_t i = 0; i < n; ++i) sr[i] *= scale;
        inv_sum[r * heads + g] = internal::Softmax(sr, n);
        uint16_t* pr = s.p + (r * heads + g) * ldp;
        if (quantized) {
          for (int64_t i = 0; i < n; ++i) pr[i] = F32ToBf16(sr[i] * s.value_scales[off + i]);
        } else {
          RoundRowsToBf16(sr, 1, n, n, pr, n);
        }
      }
    }
    // P.V. The rows that start where the first does (all of them without a window) share its
    // whole pairs: one kernel call per 16 head_dim elements with every such row and head as a
    // token. Each row then continues its own sums over its remaining keys.
    const int64_t start0 = WindowStart(first_position + r0, window);
    int64_t sharing = 1;
    while (sharing < rows && WindowStart(first_position + r0 + sharing, window) == start0) ++sharing;
    const int64_t shared_pairs = (first_position + r0 + 1 - start0) / 2;
    if (shared_pairs > 0) {
      const int par = static_cast<int>(start0 & 1);
      const uint16_t* vp = s.v_packs[par] + (start0 - lo - par) / 2 * 2 * kPanelRows;
      for (int64_t p = 0; p < v_panels; ++p) {
        const int64_t lanes = std::min(kPanelRows, d - p * kPanelRows);
        const MatrixRef v_ref{DType::kBF16, vp + p * s.v_stride, lanes, 2 * shared_pairs,
                              MatrixLayout::kBf16Panels};
        LinearBf16Columns(s.p, sharing * heads, ldp, v_ref, s.acc + p * kPanelRows, d, 0, lanes);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t position = first_position + r0 + r;
      const int64_t start = WindowStart(position, window);
      const int64_t n = position + 1 - start;
      const int par = static_cast<int>(start & 1);
      const uint16_t* vp = s.v_packs[par] + (start - lo - par) / 2 * 2 * kPanelRows;
      const uint16_t* pr = s.p + r * heads * ldp;
      float* acc = s.acc + r * heads * d;
      int64_t done = r < sharing ? shared_pairs : 0;  // Pairs already summed.
      const int64_t whole = n / 2;
      if (whole - done > kCopyPairs) {  // Long remainders straight from the packing.
        for (int64_t p = 0; p < v_panels; ++p) {
          const int64_t lanes = std::min(kPanelRows, d - p * kPanelRows);
          const MatrixRef v_ref{DType::kBF16, vp + p * s.v_stride + done * 2 * kPanelRows, lanes,
                                2 * (whole - done), MatrixLayout::kBf16Panels};
          LinearBf16Columns(pr + 2 * done, heads, ldp, v_ref, acc + p * kPanelRows, d, 0, lanes,
                            done > 0);
        }
        done = whole;
      }
      // The rest (and an odd count's last key, its pair's other element zeroed as past the end
      // of a matrix) copied into panels of their own: one call.
      const int64_t cols = n - 2 * done;
      if (cols == 0) continue;
      const int64_t line_pairs = (cols + 1) / 2, stride = PanelElements(cols);
      for (int64_t p = 0; p < v_panels; ++p) {
        std::memcpy(s.lines + p * stride, vp + p * s.v_stride + done * 2 * kPanelRows,
                    static_cast<size_t>(line_pairs) * 2 * kPanelRows * 2);
        if (cols % 2 != 0) {
          uint16_t* last = s.lines + p * stride + (line_pairs - 1) * 2 * kPanelRows;
          for (int64_t l = 0; l < kPanelRows; ++l) last[2 * l + 1] = 0;
        }
      }
      const MatrixRef lines_ref{DType::kBF16, s.lines, d, cols, MatrixLayout::kBf16Panels};
      LinearBf16Columns(pr + 2 * done, heads, ldp, lines_ref, acc, d, 0, d, done > 0);
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
                                 int64_t head_end, float* out) {
  const int64_t d = view.head_dim;
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
      for (int64_t i0 = 0; i0 < d; i0 += 2) {
        const int64_t i1 = i0 + 1;
        dot = Step(dot, i1 < d ? qb[i1] : 0, i1 < d ? row[i1] : 0);
        dot = Step(dot, qb[i0], row[i0]);
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
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {
        a = Step(a, p[j + 1], values[j + 1][e]);
        a = Step(a, p[j], values[j][e]);
      }
      if (j < n) {  // The last pair's other element is zero (and its product added first).
        a = Step(a, 0, 0);
        a = Step(a, p[j], values[j][e]);
      }
      acc[e] = a;
    }
    for (int64_t e = 0; e < d; ++e) out[h * d + e] = acc[e] * inv_sum;
  }
}

}  // namespace pdserve::kernels
