// Paged attention in bf16 compute (--compute-dtype bf16): Q.K^T and P.V run through the bf16
// linear kernel (linear_bf16.h: VDPBF16PS, its AVX2 twin, AMX tiles or the scalar reference, each
// order's bits), the softmax in f32 as attention.cc's.
//
// Both sums follow `order`, one of linear_bf16.h's two (the runner passes its linear layers',
// Bf16PanelLayout(), so where AMX is on attention runs on its tiles too). For a row at position p
// and query head h, over keys [s, p], s = max(0, p - window + 1) (0 without a window), every
// element is one fixed sequence of operations:
//   score_j = dot(bf16(q_h), bf16(K_j)) in `order` over head_dim (kBf16Panels: its pairs in
//             order, each pair's odd element first; kBf16PanelsAmx: tiles of 16 pairs, an even
//             and an odd chain each), times K_j's scale for a quantized pool (its codes are exact
//             in bf16), times `scale`;
//   e       = attention.cc's softmax of the scores (internal::Softmax: max, exp, lane sums), and
//             inv = 1 / sum;
//   P_j     = bf16(e_j), times V_j's scale first for a quantized pool;
//   out     = inv * acc, acc the sum over the keys from s of P_j * V_j (lanes over head_dim) in
//             `order`, the keys as its k: kBf16Panels walks pairs (s + 2i, s + 2i + 1), the later
//             key's product first, an odd count's last key alone; kBf16PanelsAmx takes tiles of
//             32 keys from s, the pairs' earlier keys in one chain and the later in another.
// Every step is an f32 FMA of bf16 values with denormal inputs and results flushed. Nothing there
// depends on the other rows, the tile, the thread or the batch: a decode row and the same position
// inside a prefill chunk give the same bits, as on the f32 path.
//
// How it is fast: a call packs the keys its rows read once into bf16 panels in scratch (K: 16
// keys per panel, lanes over keys, as a weight matrix of linear_bf16.h; V: 16 head_dim elements
// per panel, pairs over keys; a second V packing starting one key later only where a window gives
// rows starts of both parities) and every tile of kRowsPerTile rows reuses them: the scores of a
// tile are one kernel call with 8 rows x the heads as its tokens; in P.V the rows that start
// together share their keys up to where `order` lets a sum be split (a pair; a tile of 32 keys)
// in one call over all of head_dim (the V panels viewed over those keys through
// MatrixRef::panel_stride), and each row then continues its own sums (LinearBf16Columns'
// accumulate). Every key loop prefetches the rows it will read 32 positions later
// (kv_prefetch.h). A call of one row (decode) in kBf16Panels packs nothing: with AVX512-BF16,
// f32 or bf16 pools and head_dim a multiple of 32, K rows are transposed and V rows zipped in
// registers, the same operations in the same order. AMX's order has no register path: its single
// rows are packed and run on tiles as a chunk's.
#ifndef PDSERVE_KERNELS_CPU_ATTENTION_BF16_H_
#define PDSERVE_KERNELS_CPU_ATTENTION_BF16_H_

#include <cstddef>
#include <cstdint>

#include "common/base/tensor_ref.h"
#include "kernels/cpu/attention.h"

namespace pdserve::kernels {

// Rows per tile: the scores of 8 rows x the query heads of one KV head are one GEMM.
inline constexpr int64_t kAttentionBf16RowsPerTile = 8;

// Scratch bytes for calls whose rows read at most `max_keys` keys (the longest context, or the
// window) with at most `max_heads` query heads per call.
size_t PagedAttentionBf16ScratchBytes(int64_t max_keys, int64_t max_heads, int64_t head_dim,
                                      bool window);

// Attention of the rows at positions first_position + i, i in [0, num_rows), of one sequence, for
// query heads [head_begin, head_end), which must share one KV head. The rows are cut into tiles of
// kAttentionBf16RowsPerTile; this call computes tiles tile_begin, tile_begin + tile_step, ... (so
// threads can share a long chunk). Row i's q is q + i * ldq ([num_heads][head_dim]) and its output
// out + i * ldo (the same layout; only the call's heads are written). `order`: kBf16Panels or
// kBf16PanelsAmx (where AMX is off, that order runs in linear_bf16.h's scalar reference).
void PagedAttentionBf16(const KvPagesView& view, const int32_t* block_table,
                        int64_t first_position, int64_t num_rows, int64_t tile_begin,
                        int64_t tile_step, int64_t window, const float* q, int64_t ldq,
                        int64_t num_heads, float scale, int64_t head_begin, int64_t head_end,
                        float* out, int64_t ldo, void* scratch, size_t scratch_bytes,
                        MatrixLayout order);

// The sequence above in plain loops for one row (tests).
void PagedAttentionBf16Reference(const KvPagesView& view, const int32_t* block_table,
                                 int64_t position, int64_t window, const float* q,
                                 int64_t num_heads, float scale, int64_t head_begin,
                                 int64_t head_end, float* out, MatrixLayout order);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_ATTENTION_BF16_H_
