// The quantized kernels' AVX512-VNNI path (internal to kernels/cpu; linear_quant.cc calls it).
// The same integer sums as the AVX2 path with fewer instructions: VPDPBUSD (u8 x s8, four
// products summed into an int32 lane) for the 32-element formats, and for the K-quants
// VPDPWSSD (the sub-block scales' multiply and the accumulation in one instruction) over 64
// codes at a time (256-bit VPDPBUSD for a 32-element block). Integer sums are exact, and every
// float step is the AVX2 path's, in the same order (linear_quant_group.inc, shared): the results
// are bitwise the AVX2 path's (tested).
#ifndef PDSERVE_KERNELS_CPU_LINEAR_QUANT_VNNI_H_
#define PDSERVE_KERNELS_CPU_LINEAR_QUANT_VNNI_H_

#include <cstdint>

#include "common/base/ggml_types.h"
#include "kernels/cpu/linear_quant.h"

namespace pdserve::kernels {

// Whether the CPU has AVX-512 (F, BW, DQ, VL) with VNNI and the path is not switched off
// (PDSERVE_KERNEL_ISA=avx2 in the environment, or SetQuantVnniEnabled(false) in tests).
bool QuantVnniEnabled();
void SetQuantVnniEnabled(bool enabled);  // Only takes effect where the CPU supports it.

// LinearQuantColumns' kernel for `type` on this path, or nullptr where it has none.
using QuantColumnsFn = void (*)(const QuantizedActivations&, const QuantMatrixRef&, float* y,
                                int64_t ldy, int64_t n_begin, int64_t n_end);
QuantColumnsFn QuantColumnsVnni(GgmlType type);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_QUANT_VNNI_H_
