// Non-owning views of weight tensors, shared by the model loader (which produces them from the
// memory-mapped checkpoint) and the kernels (which read them). Plain data, no behaviour.
#ifndef PDSERVE_COMMON_BASE_TENSOR_REF_H_
#define PDSERVE_COMMON_BASE_TENSOR_REF_H_

#include <cstdint>

#include "common/base/dtype.h"

namespace pdserve {

// A row-major [rows][cols] matrix in one of the weight dtypes. For a linear layer rows are output
// features and cols input features (Hugging Face's nn.Linear layout), so y = W x.
struct MatrixRef {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  size_t bytes() const { return static_cast<size_t>(rows * cols) * DTypeSize(dtype); }
  const void* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r * cols) * DTypeSize(dtype);
  }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_TENSOR_REF_H_
