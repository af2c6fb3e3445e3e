// KvDType (the flags' and the pool's) to the kernels' KvFormat. Host code only.
#ifndef PDSERVE_KERNELS_CUDA_KV_FORMAT_H_
#define PDSERVE_KERNELS_CUDA_KV_FORMAT_H_

#include "common/base/dtype.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

static_assert(static_cast<int>(KvFormat::kF32) == static_cast<int>(KvDType::kF32));
static_assert(static_cast<int>(KvFormat::kBF16) == static_cast<int>(KvDType::kBF16));
static_assert(static_cast<int>(KvFormat::kInt8) == static_cast<int>(KvDType::kInt8));
static_assert(static_cast<int>(KvFormat::kInt4) == static_cast<int>(KvDType::kInt4));

inline KvFormat ToKvFormat(KvDType dtype) { return static_cast<KvFormat>(dtype); }

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_KV_FORMAT_H_
