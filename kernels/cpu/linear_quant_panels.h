// Quantized weights repacked at load (MatrixLayout::kQuantPanels): every block format pdserve
// reads, on any AVX2 CPU (AVX512-VNNI kernels where the CPU has them, else AVX2 twins with the
// same bits: VPMADDUBSW + VPMADDWD, two halves of 8 columns), as llama.cpp's CPU backend repacks
// Q4_K into 8-row groups: panels of 16 weight rows whose codes sit four consecutive k per row in each 32-bit lane, so one 64-byte load is four k of 16
// outputs, and VPDPBUSD with four of x's codes broadcast adds them to 16 outputs' integer sums at
// once. The row-major kernels (linear_quant.h) unpack each block's nibbles and scales again for
// every few rows of x and sum 8-lane vectors horizontally per output and block; here the unpacking
// is shared by up to 8 rows of x and no lane ever needs summing across.
//
// Same bits as the row-major kernels: the integer sums are exact whatever their order, and each
// output's float steps per block are linear_quant.h's, in the same order (tested for every m and
// column range). The panel bytes hold what the row-major blocks hold, in another order, so memory
// is the same but for the K-quants' scales and mins, kept as bytes (Q4_K 2368 bytes per 16
// blocks of 144: +2.8%; Q5_K +2.3%).
//
// Per panel p (rows [16p, 16p + 16), rows past the last zero) and block s (of 32 k for Q8_0, 256
// for the K-quants), c a row of the panel (0-15), q the block's codes as BlockCodesK gives them
// (element order):
// Per format (bytes per panel block; each output's integer totals and float steps as
// linear_quant.h defines them):
//   Q8_0 (544 bytes, as 16 blocks of 34): codes [l 0-7][c][i 0-3] = q[c][4 l + i] + 128, unsigned
//          as VPDPBUSD wants them (the offset's part is -128 x the sum of x's codes, one number per
//          block and row of x) (512); d [c] f16 (32).
//   Q4_0 (288), Q5_0 (352): u = the signed code + 8 (Q4_0) or + 16 (Q5_0); u's low 4 bits
//          [l pair 0-3][c][i] = element 8 pair + i low nibble, 8 pair + 4 + i high nibble (256);
//          Q5_0 only: u's fifth bits [c][i], bit l = element 4 l + i's (64); d [c] f16 (32).
//   Q4_K (2368 bytes): per sub-block [sub 0-7], codes [pair 0-3][c][i 0-3] = q[c][32 sub + 8
//          pair + i] low nibble, q[c][32 sub + 8 pair + 4 + i] high nibble (256 each, 2048); then
//          scales [sub][c] (128); mins [sub pair 0-3][c][2] (128); d [c] f16 (32); dmin [c] f16 (32).
//   Q5_K (2880): Q4_K's, but each sub-block's codes (their low 4 bits) followed by their fifth
//          bits [c][i], bit 2 pair + h = element 32 sub + 8 pair + 4 h + i's (64): 320 a sub-block.
//   Q6_K (3360 bytes): per sub-block [sub 0-15] three planes [j 0-2][c][i 0-3] = q[c][16 sub +
//          4 j + i] | ((q[c][16 sub + 12 + i] >> 2 j) & 3) << 6 (64 each: groups 0-2 of 4 k whole
//          in the low 6 bits, group 3 in the planes' top bit pairs), 192 a sub-block, 3072; then
//          scales [sub pair 0-7][c][2] int8 (256); d [c] f16 (32).
//   Q8_0, Q4_0 and Q5_0 blocks end 32 bytes (their d) past whole 64-byte lines, so every other
//   block would start mid-line and all its loads straddle two lines. They are stored in pairs of
//   blocks: the first's bytes but d, the second's, then both d (two blocks' bytes in whole
//   lines); an odd last block whole. Q8_0 from memory +7-10% (bench/RESULTS.md, "blocks stored
//   in pairs"). Q6_K's blocks (3,360 bytes) would straddle too, but paired they read slower.
//   A block's bytes are read in order (a sub-block's planes side by side, not a plane after the
//   other): one stream from memory per block, not two interleaved (Q6_K from memory ~0.8 -> ~1.0
//   of Q4_K's rate; its layout also unpacks in fewer instructions, a gain not shown reliably:
//   bench/RESULTS.md, "Q6_K and Q5_K panels read in one stream").
#ifndef PDSERVE_KERNELS_CPU_LINEAR_QUANT_PANELS_H_
#define PDSERVE_KERNELS_CPU_LINEAR_QUANT_PANELS_H_

#include <cstdint>

#include "common/base/ggml_types.h"
#include "kernels/cpu/linear_quant.h"

namespace pdserve::kernels {

constexpr int64_t kQuantPanelRows = 16;

// Whether `type` has a panel layout and this CPU runs its kernels (AVX2 in this build: the VNNI
// kernels or their AVX2 twins), and PDSERVE_QUANT_PANELS=0 (the row-major kernels, for
// comparisons) is not set. What a loader asks before packing.
bool QuantPanelsSupported(GgmlType type);

// Bytes of the panels of a [rows][cols] matrix of `type` (cols a multiple of 256).
int64_t QuantPanelsBytes(GgmlType type, int64_t rows, int64_t cols);

// w (row-major blocks) repacked into dst (QuantPanelsBytes(w.type, w.rows, w.cols) bytes).
// Portable code: packing needs no particular CPU, only the kernels do.
void PackQuantPanels(const QuantMatrixRef& w, void* dst);

// One row of panels back as row-major blocks' dequantized floats: the test of the packing.
void DequantizePanelRow(GgmlType type, const void* panels, int64_t cols, int64_t row, float* out);

// Columns [n_begin, n_end) of y for all rows of xq, w.data being panels (w.panels set): the VNNI
// kernels where that path is enabled, else the AVX2 ones (same bits). Needs the CPU
// QuantPanelsSupported asked for.
void LinearQuantPanelColumns(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y,
                             int64_t ldy, int64_t n_begin, int64_t n_end);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_QUANT_PANELS_H_
