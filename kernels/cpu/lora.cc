#include "kernels/cpu/lora.h"

#include <algorithm>
#include <vector>

#include "common/base/thread_pool.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve::kernels {
namespace {

// The f32 expand's partial products go through a stack buffer: column tiles, row blocks.
constexpr int64_t kTileColumns = 64;
constexpr int64_t kBlockRows = 16;
// The shrink's items: a delta's rows in blocks (a prefill chunk's one delta is split among the
// threads).
constexpr int64_t kShrinkRows = 32;

// Runs fn(delta, block) for every row block of every delta, the blocks dealt to the pool's
// threads.
template <typename Fn>
void ForEachRowBlock(const LoraDelta* deltas, int n, ThreadPool* pool, Fn fn) {
  constexpr int kInline = 64;
  int64_t first_inline[kInline + 1];
  std::vector<int64_t> first_heap;
  int64_t* first = first_inline;
  if (n > kInline) {
    first_heap.resize(static_cast<size_t>(n) + 1);
    first = first_heap.data();
  }
  first[0] = 0;
  for (int i = 0; i < n; ++i) {
    first[i + 1] = first[i] + (deltas[i].end - deltas[i].begin + kShrinkRows - 1) / kShrinkRows;
  }
  pool->ParallelForDynamic(first[n], 1, [&](int64_t b, int64_t e) {
    int i = 0;
    for (int64_t item = b; item < e; ++item) {
      while (first[i + 1] <= item) ++i;
      const LoraDelta& d = deltas[i];
      const int64_t r0 = (item - first[i]) * kShrinkRows;
      fn(d, r0, std::min(kShrinkRows, d.end - d.begin - r0));
    }
  });
}

}  // namespace

int64_t LoraPlanScratch(LoraDelta* deltas, int num_deltas) {
  int64_t n = 0;
  for (int i = 0; i < num_deltas; ++i) {
    deltas[i].t_offset = n;
    n += (deltas[i].end - deltas[i].begin) * deltas[i].a->rows;
  }
  return n;
}

void LoraShrink(const float* x, int64_t ldx, const LoraDelta* deltas, int num_deltas, float* t,
                ThreadPool* pool) {
  ForEachRowBlock(deltas, num_deltas, pool, [&](const LoraDelta& d, int64_t r0, int64_t m) {
    const int64_t rank = d.a->rows;
    LinearColumns(x + (d.begin + r0) * ldx, m, ldx, *d.a, t + d.t_offset + r0 * rank, rank, 0, rank);
  });
}

void LoraShrinkBf16(const uint16_t* xb, int64_t ldx, const LoraDelta* deltas, int num_deltas,
                    float* t, uint16_t* tb, ThreadPool* pool) {
  ForEachRowBlock(deltas, num_deltas, pool, [&](const LoraDelta& d, int64_t r0, int64_t m) {
    const int64_t rank = d.a->rows, at = d.t_offset + r0 * rank;
    LinearBf16Columns(xb + (d.begin + r0) * ldx, m, ldx, *d.a, t + at, rank, 0, rank);
    RoundRowsToBf16(t + at, m, rank, rank, tb + at, rank);
  });
}

void LoraExpandColumns(const LoraDelta& d, const float* t, int64_t lo, int64_t hi) {
  const int64_t rank = d.a->rows;
  alignas(64) float part[kBlockRows * kTileColumns];
  const float* td = t + d.t_offset;
  for (int64_t c0 = lo; c0 < hi; c0 += kTileColumns) {
    const int64_t c1 = std::min(hi, c0 + kTileColumns);
    MatrixRef view = *d.b;  // Rows [c0, c1) of B.
    view.data = static_cast<const float*>(d.b->data) + c0 * rank;
    view.rows = c1 - c0;
    for (int64_t r0 = d.begin; r0 < d.end; r0 += kBlockRows) {
      const int64_t m = std::min(kBlockRows, d.end - r0);
      LinearColumns(td + (r0 - d.begin) * rank, m, rank, view, part, kTileColumns, 0, c1 - c0);
      for (int64_t r = 0; r < m; ++r) {
        float* y = d.y + (r0 + r) * d.ldy + c0;
        const float* p = part + r * kTileColumns;
        for (int64_t j = 0; j < c1 - c0; ++j) y[j] += p[j];
      }
    }
  }
}

void LoraExpandColumnsBf16(const LoraDelta& d, const uint16_t* tb, int64_t lo, int64_t hi) {
  LinearBf16Columns(tb + d.t_offset, d.end - d.begin, d.a->rows, *d.b, d.y + d.begin * d.ldy, d.ldy,
                    lo, hi, /*accumulate=*/true);
}

void LoraAddMulti(const float* x, int64_t ldx, LoraDelta* deltas, int num_deltas, float* t,
                  ThreadPool* pool) {
  if (num_deltas == 0) return;
  LoraPlanScratch(deltas, num_deltas);
  LoraShrink(x, ldx, deltas, num_deltas, t, pool);
  // The expands by column tiles, numbered from tiles[i] for delta i.
  std::vector<int64_t> tiles(static_cast<size_t>(num_deltas) + 1, 0);
  for (int i = 0; i < num_deltas; ++i) {
    tiles[i + 1] = tiles[i] + (deltas[i].b->rows + kTileColumns - 1) / kTileColumns;
  }
  pool->ParallelForDynamic(tiles[num_deltas], 1, [&](int64_t b, int64_t e) {
    int i = 0;
    for (int64_t item = b; item < e; ++item) {
      while (tiles[i + 1] <= item) ++i;
      const int64_t c0 = (item - tiles[i]) * kTileColumns;
      LoraExpandColumns(deltas[i], t, c0, std::min(deltas[i].b->rows, c0 + kTileColumns));
    }
  });
}

}  // namespace pdserve::kernels
