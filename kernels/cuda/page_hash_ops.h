// Launcher of the page hash kernel (page_hash.h) on a CUDA stream. Plain C++.
#ifndef PDSERVE_KERNELS_CUDA_PAGE_HASH_OPS_H_
#define PDSERVE_KERNELS_CUDA_PAGE_HASH_OPS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pdserve::cuda {

// out[i] = hash of pages[i] (bytes[i] long); all three arrays in device memory.
absl::Status LaunchPageHash(const uint8_t* const* pages, const uint64_t* bytes, uint64_t* out,
                            int count, void* stream);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_PAGE_HASH_OPS_H_
