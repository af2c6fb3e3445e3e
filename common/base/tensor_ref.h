// Non-owning views of weight tensors, shared by the model loader (which produces them from the
// memory-mapped checkpoint) and the kernels (which read them). Plain data, no behaviour.
#ifndef PDSERVE_COMMON_BASE_TENSOR_REF_H_
#define PDSERVE_COMMON_BASE_TENSOR_REF_H_

#include <cstdint>

#include "common/base/dtype.h"
#include "common/base/ggml_types.h"

namespace pdserve {

// How a MatrixRef's elements are laid out in memory.
enum class MatrixLayout : uint8_t {
  kRowMajor,    // [rows][cols]: the checkpoint's layout.
  kBf16Panels,  // bf16 in panels of 16 rows, for the bf16 compute path (kernels/cpu/linear_bf16.h).
  // The same bytes, summed in AMX-BF16's order (linear_bf16.h): weights packed for that path.
  kBf16PanelsAmx,
  // A quantized matrix repacked in panels of 16 rows for the AVX512-VNNI kernels
  // (kernels/cpu/linear_quant_panels.h): the same codes and scales, four k of 16 rows per lane.
  kQuantPanels,
};

// A [rows][cols] matrix in one of the weight dtypes. For a linear layer rows are output features
// and cols input features (Hugging Face's nn.Linear layout), so y = W x.
struct MatrixRef {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  MatrixLayout layout = MatrixLayout::kRowMajor;
  // Panel layouts: bf16 elements from one 16-row panel to the next; 0: the panels of `cols`
  // columns packed end to end. A larger stride views the first `cols` columns of wider panels
  // (attention_bf16 reads a range of keys of its packed values this way).
  int64_t panel_stride = 0;
  // A llama.cpp block format (GgmlQuantized: kernels/cpu/quant_blocks.h) when the matrix is
  // quantized, row-major, each row GgmlRowBytes(quant_type, cols) bytes; `dtype` is then unused.
  // The float GgmlTypes mean "not quantized".
  GgmlType quant_type = GgmlType::kF32;

  bool quantized() const { return GgmlQuantized(quant_type); }
  // The element type as GGUF names it: the block format, or the float dtype.
  GgmlType element_type() const {
    if (quantized()) return quant_type;
    if (dtype == DType::kF32) return GgmlType::kF32;
    return dtype == DType::kBF16 ? GgmlType::kBF16 : GgmlType::kF16;
  }
  // A float GgmlType as the DType of an unquantized matrix.
  static DType FloatDType(GgmlType t) {
    return t == GgmlType::kF32 ? DType::kF32 : t == GgmlType::kBF16 ? DType::kBF16 : DType::kF16;
  }
  size_t bytes() const {
    if (layout == MatrixLayout::kQuantPanels) {
      return static_cast<size_t>((rows + 15) / 16 * (cols / GgmlBlockElements(quant_type)) *
                                 GgmlPanelBlockBytes(quant_type));
    }
    if (quantized()) return static_cast<size_t>(rows * GgmlRowBytes(quant_type, cols));
    if (layout != MatrixLayout::kRowMajor) {  // Panels: rows rounded up to 16, columns to 2.
      return static_cast<size_t>((rows + 15) / 16 * 16 * ((cols + 1) / 2 * 2)) * 2;
    }
    return static_cast<size_t>(rows * cols) * DTypeSize(dtype);
  }
  // Row-major matrices only.
  const void* row(int64_t r) const {
    if (quantized()) return static_cast<const uint8_t*>(data) + r * GgmlRowBytes(quant_type, cols);
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r * cols) * DTypeSize(dtype);
  }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_TENSOR_REF_H_
