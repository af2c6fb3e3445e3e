// y = x W^T for the linear layers: x is [m][k] f32, W is [n][k] in f32, bf16 or f16 (read in place
// from the checkpoint mapping) or in a GGUF block format (x then quantized to int8 and multiplied
// by linear_quant.h's integer kernels), y is [m][n] f32.
//
// Batch invariance: every output element y[t][j] is computed by exactly the same sequence of
// floating-point operations whatever m, whatever the other rows of x, and whatever range of
// columns a thread was given: one 8-lane FMA accumulator walks k in steps of 8, then a fixed
// horizontal sum, then a sequential tail. So a token's result is bit-identical alone, in a batch
// of 16, or inside a 512-token prefill chunk.
//
// Cost: 2*m*n*k flops; reads W once per call (n*k*sizeof(w)) plus x from cache. At m = 1 this is
// the memory-bound decode GEMV; at m >= 8 it becomes compute-bound.
#ifndef PDSERVE_KERNELS_CPU_LINEAR_H_
#define PDSERVE_KERNELS_CPU_LINEAR_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "common/base/tensor_ref.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// Columns [n_begin, n_end) of y for all m rows, on the calling thread.
void LinearColumns(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                   int64_t ldy, int64_t n_begin, int64_t n_end);

// All columns, split across the pool's threads (thread-count invariant, see above).
void Linear(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
            ThreadPool* pool);

// Several matrices that read the same x (q/k/v, or gate/up) in one parallel region: output i is
// written to y[i] with leading dimension ldy[i].
struct LinearOutput {
  const MatrixRef* w;
  float* y;
  int64_t ldy;
  // Called with each range of columns [lo, hi) as soon as the thread that computed them has (all
  // rows), on that thread: work on those columns of y while they are in its cache (LoRA's
  // expand, kernels/cpu/lora.h). Null: none.
  const absl::FunctionRef<void(int64_t, int64_t)>* after = nullptr;
};
void LinearMulti(const float* x, int64_t m, int64_t ldx, const LinearOutput* outputs,
                 int num_outputs, ThreadPool* pool);

// The split both LinearMulti and LinearBf16Multi use: threads take chunks of the outputs'
// columns from a shared counter, in units of `grain` columns of one output (0: the f32 kernels'
// 16); `columns(o, lo, hi)` computes columns [lo, hi) of output o. Columns are independent, so
// results do not depend on the split.
void ForEachOutputColumns(const LinearOutput* outputs, int num_outputs, ThreadPool* pool,
                          absl::FunctionRef<void(const LinearOutput&, int64_t, int64_t)> columns,
                          int64_t grain = 0);
// As above, the calling thread running `first` (the columns' set-up) while the others wake; no
// columns are computed before it returns.
void ForEachOutputColumns(const LinearOutput* outputs, int num_outputs, ThreadPool* pool,
                          absl::FunctionRef<void()> first,
                          absl::FunctionRef<void(const LinearOutput&, int64_t, int64_t)> columns);

// Plain double-precision reference for tests: y[t][j] = sum_k x[t][k] * W[j][k].
void LinearReference(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, double* y);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_H_
