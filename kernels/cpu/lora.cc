#include "kernels/cpu/lora.h"

#include <algorithm>
#include <vector>

#include "common/base/thread_pool.h"
#include "kernels/cpu/linear.h"

namespace pdserve::kernels {
namespace {

// The expand's work items: a delta's output columns in tiles, its rows in blocks, so the
// partial products fit a stack buffer.
constexpr int64_t kTileColumns = 64;
constexpr int64_t kBlockRows = 16;

}  // namespace

int64_t LoraScratchFloats(const LoraDelta* deltas, int num_deltas) {
  int64_t n = 0;
  for (int i = 0; i < num_deltas; ++i) n += (deltas[i].end - deltas[i].begin) * deltas[i].a->rows;
  return n;
}

void LoraAddMulti(const float* x, int64_t ldx, const LoraDelta* deltas, int num_deltas, float* t,
                  ThreadPool* pool) {
  if (num_deltas == 0) return;
  // Where each delta's A x rows go in t, and the expand's items (delta, column tile).
  constexpr int kMaxInline = 64;
  int64_t offsets_inline[kMaxInline + 1];
  int64_t tiles_inline[kMaxInline + 1];
  std::vector<int64_t> offsets_heap, tiles_heap;
  int64_t* offsets = offsets_inline;
  int64_t* tiles = tiles_inline;
  if (num_deltas > kMaxInline) {
    offsets_heap.resize(num_deltas + 1);
    tiles_heap.resize(num_deltas + 1);
    offsets = offsets_heap.data();
    tiles = tiles_heap.data();
  }
  offsets[0] = 0;
  tiles[0] = 0;
  for (int i = 0; i < num_deltas; ++i) {
    const LoraDelta& d = deltas[i];
    offsets[i + 1] = offsets[i] + (d.end - d.begin) * d.a->rows;
    tiles[i + 1] = tiles[i] + (d.b->rows + kTileColumns - 1) / kTileColumns;
  }
  // Shrink: t = x A^T, one item per delta (its rank columns are too few to split).
  pool->ParallelForDynamic(num_deltas, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const LoraDelta& d = deltas[i];
      LinearColumns(x + d.begin * ldx, d.end - d.begin, ldx, *d.a, t + offsets[i], d.a->rows, 0,
                    d.a->rows);
    }
  });
  // Expand: y += t B^T, by column tiles of B (a view of its rows [c0, c1)).
  pool->ParallelForDynamic(tiles[num_deltas], 1, [&](int64_t b, int64_t e) {
    alignas(64) float part[kBlockRows * kTileColumns];
    int i = 0;
    for (int64_t item = b; item < e; ++item) {
      while (tiles[i + 1] <= item) ++i;
      const LoraDelta& d = deltas[i];
      const int64_t rank = d.a->rows;
      const int64_t c0 = (item - tiles[i]) * kTileColumns;
      const int64_t c1 = std::min(d.b->rows, c0 + kTileColumns);
      MatrixRef view = *d.b;
      view.data = static_cast<const float*>(d.b->data) + c0 * rank;
      view.rows = c1 - c0;
      const float* ti = t + offsets[i];
      for (int64_t r0 = d.begin; r0 < d.end; r0 += kBlockRows) {
        const int64_t m = std::min(kBlockRows, d.end - r0);
        LinearColumns(ti + (r0 - d.begin) * rank, m, rank, view, part, kTileColumns, 0, c1 - c0);
        for (int64_t r = 0; r < m; ++r) {
          float* y = d.y + (r0 + r) * d.ldy + c0;
          const float* p = part + r * kTileColumns;
          for (int64_t j = 0; j < c1 - c0; ++j) y[j] += p[j];
        }
      }
    }
  });
}

}  // namespace pdserve::kernels
