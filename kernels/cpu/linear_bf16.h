// The bf16 compute path of the linear layers (--compute-dtype bf16): y = x W^T with x rounded to
// bf16 (round to nearest even, as F32ToBf16) and W in bf16, products exact in f32, sums in f32.
//
// W is read from a packed copy (MatrixLayout::kBf16Panels, made once at load by PackBf16Panels):
// panels of 16 rows, panel p holding rows [16p, 16p + 16) as [pair q][lane l][2] =
// W[16p + l][2q], W[16p + l][2q + 1], zero past the last row and column. One 64-byte load is
// then one k pair of 16 outputs, and VDPBF16PS with the pair x[2q], x[2q + 1] broadcast adds a
// pair's products to 16 outputs' accumulators at once: no horizontal sums, and a register tile of
// 8 tokens x 3 panels reaches ~0.9 of the instruction's peak where the row-major kernel it
// replaced, which summed 16 lanes per output, reached ~0.66 (bench/RESULTS.md).
//
// Every output element y[t][j] is one fixed sequence of operations, chosen by the layout of W:
// - kBf16Panels, the one VDPBF16PS performs in lane j % 16: one f32 accumulator, from zero, walks
//   the pairs q = 0, 1, ... in order and adds x[2q+1]*w[2q+1] and then x[2q]*w[2q] (a missing
//   last odd element is zero), each an f32 FMA that treats denormal inputs as zero and flushes a
//   denormal result to zero.
// - kBf16PanelsAmx (the same bytes), the one AMX-BF16's TDPBF16PS performs, measured on a
//   Sapphire Rapids-class Xeon (bench/RESULTS.md): k in tiles of 16 pairs from the start; in each
//   tile an even chain sums x[2q]*w[2q] and an odd chain x[2q+1]*w[2q+1] over its pairs in order,
//   each from zero by the same flushing FMAs, and the accumulator adds (even + odd), flushed.
// Nothing depends on m, on the other rows or on the columns a thread took, so results are
// bitwise batch-, chunk- and thread-invariant, as on the f32 path. The two orders give different
// bits (a few ulps): a process packs its weights in one layout (Bf16PanelLayout) and uses that
// order for every linear layer and for attention's sums (attention_bf16.h).
//
// Implementations, bitwise equal to the scalar reference of their order (tested): of the first,
// VDPBF16PS where the CPU has AVX512-BF16 and an AVX2 twin that performs the same FMAs with
// MXCSR's DAZ and FTZ set (so a CPU without bf16 instructions computes the same bits, slower);
// of the second, AMX tiles (linear_bf16_amx.h), used wherever the CPU has AMX-BF16 and gives the
// reference's bits in a check at start-up (PDSERVE_AMX=0 turns it off): prefill 3.9-4.0x
// VDPBF16PS's on a Xeon, attention's tiles included (bench/RESULTS.md).
#ifndef PDSERVE_KERNELS_CPU_LINEAR_BF16_H_
#define PDSERVE_KERNELS_CPU_LINEAR_BF16_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/tensor_ref.h"
#include "kernels/cpu/linear.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// Whether this CPU has the bf16 dot-product instruction (AVX512-BF16 with AVX-512 F/BW/DQ/VL)
// and it is not switched off: PDSERVE_KERNEL_ISA=avx2 in the environment, or
// SetBf16DotEnabled(false) in tests. When off, the AVX2 twin computes the same bits.
bool Bf16DotSupported();  // The CPU alone (what --compute-dtype auto asks).
bool Bf16DotEnabled();
void SetBf16DotEnabled(bool enabled);  // Only takes effect where the CPU supports it.

// out[i] = F32ToBf16(x[i]) for rows [0, m) of x (leading dimensions ldx and ldout).
void RoundRowsToBf16(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* out,
                     int64_t ldout);
// out[i] = F32ToBf16 of x[i] with a denormal x[i] read as a zero of its sign: VCVTNEPS2BF16's
// conversion (that instruction where Bf16DotEnabled()). What attention reads from an f32 KV pool.
void RoundToBf16Ftz(const float* x, int64_t n, uint16_t* out);

// Whether the AMX path is used: the CPU and kernel offer AMX-BF16, neither PDSERVE_AMX=0 nor
// PDSERVE_KERNEL_ISA=avx2 is set, and it gave the reference's bits on this CPU (decided once, at
// the first call). AmxSupported(): the CPU and kernel alone.
bool AmxSupported();
bool AmxEnabled();
// The panel layout the bf16 kernels read on this CPU: kBf16PanelsAmx when AmxEnabled().
MatrixLayout Bf16PanelLayout();

// Bytes of a rows x cols matrix packed as panels.
size_t Bf16PanelsBytes(int64_t rows, int64_t cols);
// Packs row-major W (bf16, or f32/f16 rounded to bf16 as F32ToBf16) into `dst` (Bf16PanelsBytes
// bytes, 2-byte aligned) in `layout` (a panel layout) and returns the packed view, which the
// functions below read.
MatrixRef PackBf16Panels(const MatrixRef& w, void* dst, MatrixLayout layout = Bf16PanelLayout());
// W[row][col] of a packed matrix (tests).
uint16_t Bf16PanelsAt(const MatrixRef& packed, int64_t row, int64_t col);

// A packed copy that owns its memory (tests, benchmarks; the runner packs into its arena).
class Bf16PanelMatrix {
 public:
  explicit Bf16PanelMatrix(const MatrixRef& w, MatrixLayout layout = Bf16PanelLayout())
      : storage_(Bf16PanelsBytes(w.rows, w.cols) / 2) {
    ref_ = PackBf16Panels(w, storage_.data(), layout);
  }
  const MatrixRef& ref() const { return ref_; }

 private:
  std::vector<uint16_t> storage_;
  MatrixRef ref_;
};

// Columns [n_begin, n_end) (any range) of y for all m rows of the bf16 activations `xb`; W packed
// (either panel layout: its order). With `accumulate`, each output's accumulator starts from y's
// value instead of zero and walks on: a k split into two calls gives the bits of one call over
// the whole k where the split is at an even column (kBf16Panels) or at a whole k tile, a multiple
// of 32 (kBf16PanelsAmx). Attention's P.V continues a tile's sums so.
void LinearBf16Columns(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate = false);

// Several matrices that read the same xb, in one parallel region (as LinearMulti).
void LinearBf16Multi(const uint16_t* xb, int64_t m, int64_t ldx, const LinearOutput* outputs,
                     int num_outputs, ThreadPool* pool);

// The sequence above of w's layout in plain scalar code: the portable build's path and the tests'
// reference.
void LinearBf16Reference(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                         int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate = false);

namespace internal {
// One step of the sequence above in scalar code: acc + a * b for two bf16 values, denormal
// inputs read as zero and a denormal result flushed (VDPBF16PS's product-add). The references
// (this kernel's, attention_bf16's) are written with it.
float Bf16DotStep(float acc, uint16_t a, uint16_t b);
// The end of one k tile of the kBf16PanelsAmx order: acc + (even + odd), each add flushed.
float AmxTileSum(float acc, float even, float odd);

// The panel layout's geometry: rows per panel (VDPBF16PS's f32 lanes, an AMX C tile's columns)
// and the bf16 elements of one panel of a matrix with `cols` columns (pairs rounded up).
constexpr int64_t kPanelRows = 16;
// k pairs per AMX tile: the kBf16PanelsAmx order's tile of pairs.
constexpr int64_t kAmxTilePairs = 16;
inline int64_t PanelElements(int64_t cols) { return (cols + 1) / 2 * 2 * kPanelRows; }
// Elements from one of w's panels to the next (MatrixRef::panel_stride, or end to end).
inline int64_t PanelStride(const MatrixRef& w) {
  return w.panel_stride > 0 ? w.panel_stride : PanelElements(w.cols);
}

// Panels per register tile, and the column grain of LinearBf16Multi's thread chunks (whole tiles).
constexpr int kTilePanels = 3;
constexpr int64_t kColumnGrain = 16 * kTilePanels;
// The AMX kernel's: whole pairs of panels (its two C tiles); 6 panels measured 4-6% faster
// prefill than 3 (bench/RESULTS.md), where a third of the panels ran alone.
constexpr int64_t kAmxColumnGrain = 16 * 6;

// The two vector paths, for the tests (call the first only when Bf16DotEnabled()).
void LinearBf16ColumnsAvx512(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                             float* y, int64_t ldy, int64_t n_begin, int64_t n_end,
                             bool accumulate = false);
void LinearBf16ColumnsAvx2(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                           float* y, int64_t ldy, int64_t n_begin, int64_t n_end,
                           bool accumulate = false);
// F32ToBf16 of x[0, n) on 16 lanes for a multiple of 16 elements; returns how many it did (0
// where the build has no AVX-512). Call only when Avx512Enabled().
int64_t RoundToBf16Avx512(const float* x, int64_t n, uint16_t* out);
// RoundToBf16Ftz by VCVTNE2PS2BF16 for a multiple of 16 elements; returns how many it did. Call
// only when Bf16DotEnabled().
int64_t RoundToBf16FtzAvx512(const float* x, int64_t n, uint16_t* out);
// kBf16PanelsAmx only; call only when AmxEnabled() (or from AmxEnabled's own check).
void LinearBf16ColumnsAmx(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate = false);
}  // namespace internal

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_BF16_H_
