#include "kernels/cuda/layer_ops.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_ctx.cuh"
#include "kernels/cuda/kernel_checks.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/layer_kernels.h"

namespace pdserve::cuda {
namespace {

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
dim3 Grid(const LaunchConfig& c) {
  return dim3(static_cast<unsigned>(c.grid_x), static_cast<unsigned>(c.grid_y),
              static_cast<unsigned>(c.grid_z));
}

}  // namespace

absl::Status LaunchEmbedding(const EmbeddingParams& p, void* stream) {
  if (p.rows == 0) return absl::OkStatus();
  const LaunchConfig c = EmbeddingLaunch(p);
  EmbeddingKernel<<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
  return LaunchStatus("EmbeddingKernel");
}

absl::Status LaunchAddRmsNorm(const AddRmsNormParams& p, void* stream) {
  if (p.rows == 0) return absl::OkStatus();
  const LaunchConfig c = AddRmsNormLaunch(p);
  AddRmsNormKernel<<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
  return LaunchStatus("AddRmsNormKernel");
}

absl::Status LaunchQkvRopeStore(const QkvRopeStoreParams& p, void* stream) {
  if (absl::Status s = CheckAttentionShape(p.num_heads, p.num_kv_heads, p.head_dim, p.kv.format);
      !s.ok()) {
    return s;
  }
  if (p.tokens.rows == 0) return absl::OkStatus();
  const LaunchConfig c = QkvRopeStoreLaunch(p);
  switch (p.kv.format) {
    case KvFormat::kF32:
      QkvRopeStoreKernel<KvFormat::kF32><<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
      break;
    case KvFormat::kBF16:
      QkvRopeStoreKernel<KvFormat::kBF16><<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
      break;
    case KvFormat::kInt8:
      QkvRopeStoreKernel<KvFormat::kInt8><<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
      break;
    case KvFormat::kInt4:
      QkvRopeStoreKernel<KvFormat::kInt4><<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
      break;
  }
  return LaunchStatus("QkvRopeStoreKernel");
}

absl::Status LaunchSiluMul(const SiluMulParams& p, void* stream) {
  if (p.rows == 0) return absl::OkStatus();
  const LaunchConfig c = SiluMulLaunch(p);
  SiluMulKernel<<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
  return LaunchStatus("SiluMulKernel");
}

absl::Status LaunchFill(const FillParams& p, void* stream) {
  if (p.count == 0) return absl::OkStatus();
  const LaunchConfig c = FillLaunch(p);
  FillKernel<<<Grid(c), c.threads, c.shared_bytes, Stream(stream)>>>(p);
  return LaunchStatus("FillKernel");
}

}  // namespace pdserve::cuda
