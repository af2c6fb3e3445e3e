// LoRA's low-rank terms on the CPU: for the rows of a batch that run with an adapter,
// y[r] += B (A x[r]), A [rank][k] and B [n][rank] (the adapter's scale already in B). Rows are
// grouped by adapter (one LoraDelta per run of rows of one adapter and projection): the shrink
// t = x A^T of every delta in one parallel region (Punica's and S-LoRA's segmented shrink, on the
// CPU), then the expand y += t B^T, column range by column range, on the thread that has just
// computed those columns of the base projection (LinearOutput::after: y is read back from its
// cache, not from memory).
//
// Two arithmetics, as the linear layers have: f32 (the matrices f32, LinearColumns; the expand's
// f32 result added to y), and bf16 (compute dtype bf16: x the layer's input as already rounded to
// bf16, the matrices packed in bf16 panels (LoraAdapter::PackBf16), t summed in f32 and rounded
// to bf16, and the expand's sums continuing y's own, LinearBf16Columns with accumulate).
//
// Batch invariance: both products are LinearColumns / LinearBf16Columns calls, whose every
// element is the same sequence of operations whatever the rows beside it and the columns a thread
// took, and the f32 path's add into y is one f32 add per element. So a row's result does not
// depend on which other rows, adapters or chunk sizes share its batch.
#ifndef PDSERVE_KERNELS_CPU_LORA_H_
#define PDSERVE_KERNELS_CPU_LORA_H_

#include <cstdint>

#include "common/base/tensor_ref.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// y[r] += B (A x[r]) for rows [begin, end) of the batch (x's rows of leading dimension ldx,
// y's of ldy). a: [rank][k]; b: [n][rank]; f32 row-major, or bf16 panels for the bf16 functions.
struct LoraDelta {
  const MatrixRef* a = nullptr;
  const MatrixRef* b = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t t_offset = 0;  // Where its rows' t are in the scratch (LoraPlanScratch).
};

// Gives each delta its place in the scratch; returns the elements needed (of t, and of tb).
int64_t LoraPlanScratch(LoraDelta* deltas, int num_deltas);

// t = x A^T for every delta, in one parallel region (row blocks of every delta).
void LoraShrink(const float* x, int64_t ldx, const LoraDelta* deltas, int num_deltas, float* t,
                ThreadPool* pool);
// The bf16 arithmetic: xb the rows rounded to bf16; t in f32, then tb = t rounded to bf16.
void LoraShrinkBf16(const uint16_t* xb, int64_t ldx, const LoraDelta* deltas, int num_deltas,
                    float* t, uint16_t* tb, ThreadPool* pool);
// y += t B^T on columns [lo, hi) of one delta, on the calling thread.
void LoraExpandColumns(const LoraDelta& d, const float* t, int64_t lo, int64_t hi);
void LoraExpandColumnsBf16(const LoraDelta& d, const uint16_t* tb, int64_t lo, int64_t hi);

// Shrink, then every expand in a second region (f32): where the base projection has no
// LinearOutput::after (OpenBLAS).
void LoraAddMulti(const float* x, int64_t ldx, LoraDelta* deltas, int num_deltas, float* t,
                  ThreadPool* pool);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LORA_H_
