#include "kernels/cuda/layer_ops.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_ctx.cuh"
#include "kernels/cuda/kernel_checks.h"
#include "kernels/cuda/layer_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kRowThreads = 256;

__global__ void EmbeddingKernel(EmbeddingParams p) {
  DeviceCtx ctx;
  EmbeddingBody(ctx, p);
}
__global__ void AddRmsNormKernel(AddRmsNormParams p) {
  DeviceCtx ctx;
  AddRmsNormBody(ctx, p);
}
template <KvFormat F>
__global__ void QkvRopeStoreKernel(QkvRopeStoreParams p) {
  DeviceCtx ctx;
  QkvRopeStoreBody<F>(ctx, p);
}
__global__ void SiluMulKernel(SiluMulParams p) {
  DeviceCtx ctx;
  SiluMulBody(ctx, p);
}

__global__ void FillKernel(FillParams p) {
  DeviceCtx ctx;
  FillBody(ctx, p);
}

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

absl::Status LaunchEmbedding(const EmbeddingParams& p, void* stream) {
  if (p.rows == 0) return absl::OkStatus();
  EmbeddingKernel<<<p.rows, kRowThreads, 0, Stream(stream)>>>(p);
  return LaunchStatus("EmbeddingKernel");
}

absl::Status LaunchAddRmsNorm(const AddRmsNormParams& p, void* stream) {
  if (p.rows == 0) return absl::OkStatus();
  AddRmsNormKernel<<<p.rows, kRowThreads, kWarpSize * sizeof(float), Stream(stream)>>>(p);
  return LaunchStatus("AddRmsNormKernel");
}

absl::Status LaunchQkvRopeStore(const QkvRopeStoreParams& p, void* stream) {
  if (absl::Status s = CheckAttentionShape(p.num_heads, p.num_kv_heads, p.head_dim, p.kv.format);
      !s.ok()) {
    return s;
  }
  if (p.tokens.rows == 0) return absl::OkStatus();
  // A warp per head: enough warps for the q, k and v heads of one row, at most 8.
  const int heads = p.num_heads + 2 * p.num_kv_heads;
  const int threads = kWarpSize * (heads < 8 ? heads : 8);
  switch (p.kv.format) {
    case KvFormat::kF32:
      QkvRopeStoreKernel<KvFormat::kF32><<<p.tokens.rows, threads, 0, Stream(stream)>>>(p);
      break;
    case KvFormat::kBF16:
      QkvRopeStoreKernel<KvFormat::kBF16><<<p.tokens.rows, threads, 0, Stream(stream)>>>(p);
      break;
    case KvFormat::kInt8:
      QkvRopeStoreKernel<KvFormat::kInt8><<<p.tokens.rows, threads, 0, Stream(stream)>>>(p);
      break;
    case KvFormat::kInt4:
      QkvRopeStoreKernel<KvFormat::kInt4><<<p.tokens.rows, threads, 0, Stream(stream)>>>(p);
      break;
  }
  return LaunchStatus("QkvRopeStoreKernel");
}

absl::Status LaunchSiluMul(const SiluMulParams& p, void* stream) {
  if (p.rows == 0) return absl::OkStatus();
  SiluMulKernel<<<p.rows, kRowThreads, 0, Stream(stream)>>>(p);
  return LaunchStatus("SiluMulKernel");
}

absl::Status LaunchFill(const FillParams& p, void* stream) {
  if (p.count == 0) return absl::OkStatus();
  const int64_t blocks = (p.count + kRowThreads - 1) / kRowThreads;
  FillKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kRowThreads, 0, Stream(stream)>>>(p);
  return LaunchStatus("FillKernel");
}

}  // namespace pdserve::cuda
