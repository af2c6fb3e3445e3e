#include "kernels/cuda/attention_ops.h"

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_mma_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_ctx.cuh"
#include "kernels/cuda/kernel_checks.h"

namespace pdserve::cuda {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kPrefillThreads = 128;

template <KvFormat F, int E>
__global__ void DecodeAttentionKernel(DecodeAttentionParams p) {
  DeviceCtx ctx;
  DecodeAttentionBody<F, E>(ctx, p);
}
__global__ void DecodeMergeKernel(DecodeAttentionParams p) {
  DeviceCtx ctx;
  DecodeMergeBody(ctx, p);
}
template <KvFormat F>
__global__ void PrefillAttentionKernel(PrefillAttentionParams p) {
  DeviceCtx ctx;
  PrefillAttentionBody<F>(ctx, p);
}

template <KvFormat F, int DK>
__global__ void __launch_bounds__(kPrefillMmaThreads)
    PrefillAttentionMmaKernel(PrefillAttentionParams p) {
  DeviceCtx ctx;
  PrefillAttentionMmaBody<F, DK>(ctx, p);
}

cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

template <KvFormat F>
absl::Status Decode(const DecodeAttentionParams& p, size_t smem, cudaStream_t stream) {
  const dim3 grid(p.a.kv.num_kv_heads, p.num_rows, p.max_splits);
  if (DecodeElemsPerLane(p.a.kv.head_dim) == 4) {
    DecodeAttentionKernel<F, 4><<<grid, kDecodeThreads, smem, stream>>>(p);
  } else {
    DecodeAttentionKernel<F, 8><<<grid, kDecodeThreads, smem, stream>>>(p);
  }
  return LaunchStatus("DecodeAttentionKernel");
}

template <KvFormat F>
absl::Status Prefill(const PrefillAttentionParams& p, size_t smem, cudaStream_t stream) {
  if (smem > 48 * 1024) {
    if (absl::Status s = CudaStatus(
            cudaFuncSetAttribute(PrefillAttentionKernel<F>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)),
            "PrefillAttentionKernel shared memory");
        !s.ok()) {
      return s;
    }
  }
  const dim3 grid(p.num_tiles, p.a.num_heads);
  PrefillAttentionKernel<F><<<grid, kPrefillThreads, smem, stream>>>(p);
  return LaunchStatus("PrefillAttentionKernel");
}

template <KvFormat F, int DK>
struct PrefillMma {
  static absl::Status Run(const PrefillAttentionParams& p, cudaStream_t stream) {
    const dim3 grid(p.num_tiles, p.a.num_heads);
    PrefillAttentionMmaKernel<F, DK>
        <<<grid, kPrefillMmaThreads, PrefillMmaSharedBytes(DK * kMmaK), stream>>>(p);
    return LaunchStatus("PrefillAttentionMmaKernel");
  }
};

absl::Status DecodeAnyFormat(const DecodeAttentionParams& p, size_t smem, cudaStream_t stream) {
  switch (p.a.kv.format) {
    case KvFormat::kF32: return Decode<KvFormat::kF32>(p, smem, stream);
    case KvFormat::kBF16: return Decode<KvFormat::kBF16>(p, smem, stream);
    case KvFormat::kInt8: return Decode<KvFormat::kInt8>(p, smem, stream);
    case KvFormat::kInt4: return Decode<KvFormat::kInt4>(p, smem, stream);
  }
  return absl::InternalError("unknown KV format");
}

}  // namespace

absl::Status LaunchDecodeAttention(const DecodeAttentionParams& p, void* stream) {
  const AttentionParams& a = p.a;
  if (absl::Status s = CheckAttentionShape(a.num_heads, a.kv.num_kv_heads, a.kv.head_dim, a.kv.format);
      !s.ok()) {
    return s;
  }
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.split_tokens < 1 || p.max_splits < 1 || (p.max_splits > 1 && p.partial == nullptr)) {
    return absl::InvalidArgumentError("decode attention: bad split plan");
  }
  const int group = a.num_heads / a.kv.num_kv_heads;
  const size_t smem = sizeof(float) * DecodeSharedFloats(group, a.kv.head_dim, p.split_tokens);
  if (smem > 48 * 1024) {
    return absl::InvalidArgumentError("decode attention: split too long for shared memory");
  }
  const absl::Status s = DecodeAnyFormat(p, smem, Stream(stream));
  if (!s.ok() || p.max_splits == 1) return s;
  DecodeMergeKernel<<<dim3(a.num_heads, p.num_rows), kDecodeThreads, 0, Stream(stream)>>>(p);
  return LaunchStatus("DecodeMergeKernel");
}

absl::Status LaunchPrefillAttention(const PrefillAttentionParams& p, void* stream) {
  const AttentionParams& a = p.a;
  if (absl::Status s = CheckAttentionShape(a.num_heads, a.kv.num_kv_heads, a.kv.head_dim, a.kv.format);
      !s.ok()) {
    return s;
  }
  if (p.num_tiles == 0) return absl::OkStatus();
  if (PrefillUsesMma(a.kv.format, a.kv.head_dim)) {
    // Made once: the dispatch returns it only for a shape PrefillUsesMma refuses.
    static const absl::Status kUnsupported =
        absl::InternalError("prefill attention on tensor cores: unsupported shape");
    return DispatchPrefillMma<PrefillMma>(a.kv.format, a.kv.head_dim, kUnsupported, p,
                                          Stream(stream));
  }
  const size_t smem = sizeof(float) * PrefillSharedFloats(a.kv.head_dim);
  switch (a.kv.format) {
    case KvFormat::kF32: return Prefill<KvFormat::kF32>(p, smem, Stream(stream));
    case KvFormat::kBF16: return Prefill<KvFormat::kBF16>(p, smem, Stream(stream));
    case KvFormat::kInt8: return Prefill<KvFormat::kInt8>(p, smem, Stream(stream));
    case KvFormat::kInt4: return Prefill<KvFormat::kInt4>(p, smem, Stream(stream));
  }
  return absl::InternalError("unknown KV format");
}

}  // namespace pdserve::cuda
