// LoRA's low-rank terms on the CPU: for the rows of a batch that run with an adapter,
// y[r] += B (A x[r]), A [rank][k] and B [n][rank] in f32 (the adapter's scale already in B).
// Rows are grouped by adapter (one LoraDelta per run of rows), each group reading its adapter's
// matrices once: the shrink x.A^T of all a group's rows, then the expand t.B^T (Punica's and
// S-LoRA's segmented shrink/expand, on the CPU).
//
// Batch invariance: both products are LinearColumns calls, whose every element is the same
// sequence of operations whatever the rows beside it and the columns a thread took, and the add
// into y is one f32 add per element. So a row's result does not depend on which other rows,
// adapters or chunk sizes share its batch.
#ifndef PDSERVE_KERNELS_CPU_LORA_H_
#define PDSERVE_KERNELS_CPU_LORA_H_

#include <cstdint>

#include "common/base/tensor_ref.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// y[r] += B (A x[r]) for rows [begin, end) of the batch (x's rows of leading dimension ldx,
// y's of ldy). a: f32 [rank][k]; b: f32 [n][rank].
struct LoraDelta {
  const MatrixRef* a = nullptr;
  const MatrixRef* b = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Scratch floats LoraAddMulti needs for these deltas (each row's A x).
int64_t LoraScratchFloats(const LoraDelta* deltas, int num_deltas);

// Every delta, the shrinks in one parallel region and the expands in another. The deltas' y
// ranges must not overlap. `t` holds LoraScratchFloats(deltas) floats.
void LoraAddMulti(const float* x, int64_t ldx, const LoraDelta* deltas, int num_deltas, float* t,
                  ThreadPool* pool);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LORA_H_
