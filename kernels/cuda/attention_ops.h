// Launchers of the paged attention kernels (attention_kernels.h) on a CUDA stream. Plain C++:
// params hold device pointers; `stream` is a cudaStream_t (nullptr: the legacy default stream).
#ifndef PDSERVE_KERNELS_CUDA_ATTENTION_OPS_H_
#define PDSERVE_KERNELS_CUDA_ATTENTION_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

// How to split and tile: attention_plan.h.
// Decode attention, then (rows with more than one split) the merge, on one stream.
absl::Status LaunchDecodeAttention(const DecodeAttentionParams& p, void* stream);
// Tiled prefill attention over p.num_tiles tiles (kernel_params.h).
absl::Status LaunchPrefillAttention(const PrefillAttentionParams& p, void* stream);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_ATTENTION_OPS_H_
