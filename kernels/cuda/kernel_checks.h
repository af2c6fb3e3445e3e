// The shapes the CUDA kernels take, checked on the host before a launch (and by the CUDA runner
// when it is created, so a model the kernels cannot run is refused at start-up, naming why).
#ifndef PDSERVE_KERNELS_CUDA_KERNEL_CHECKS_H_
#define PDSERVE_KERNELS_CUDA_KERNEL_CHECKS_H_

#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

inline constexpr int kMaxKernelHeadDim = 256;  // kv_page.h's kMaxHeadDim
inline constexpr int kMaxKernelGroup = 16;     // attention_kernels.h's kMaxGroup

inline absl::Status CheckAttentionShape(int num_heads, int num_kv_heads, int head_dim,
                                        KvFormat format) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError("CUDA kernels: " + why + " (num_heads " +
                                      std::to_string(num_heads) + ", num_kv_heads " +
                                      std::to_string(num_kv_heads) + ", head_dim " +
                                      std::to_string(head_dim) + ")");
  };
  if (num_heads < 1 || num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    return bad("num_heads must be a positive multiple of num_kv_heads");
  }
  if (num_heads / num_kv_heads > kMaxKernelGroup) {
    return bad("at most " + std::to_string(kMaxKernelGroup) + " query heads per KV head");
  }
  if (head_dim < 2 || head_dim > kMaxKernelHeadDim || head_dim % 2 != 0) {
    return bad("head_dim must be even and at most " + std::to_string(kMaxKernelHeadDim));
  }
  if (format == KvFormat::kInt4 && head_dim % 4 != 0) {
    return bad("an int4 KV cache needs head_dim divisible by 4");
  }
  return absl::OkStatus();
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_KERNEL_CHECKS_H_
