#include "kernels/cuda/attention_ops.h"

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_mma_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_ctx.cuh"
#include "kernels/cuda/kernel_checks.h"
#include "kernels/cuda/launch_config.h"

namespace pdserve::cuda {
namespace {

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

dim3 Grid(const LaunchConfig& c) {
  return dim3(static_cast<unsigned>(c.grid_x), static_cast<unsigned>(c.grid_y),
              static_cast<unsigned>(c.grid_z));
}

// Raises the kernel's dynamic shared memory limit where its launch needs more than the default.
template <typename Kernel>
absl::Status OptIn(Kernel kernel, const LaunchConfig& c, const char* name) {
  if (!NeedsSharedOptIn(c)) return absl::OkStatus();
  return CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(c.shared_bytes)),
                    name);
}

template <KvFormat F>
absl::Status Decode(const DecodeAttentionParams& p, const LaunchConfig& c, cudaStream_t stream) {
  if (DecodeElemsPerLane(p.a.kv.head_dim) == 4) {
    DecodeAttentionKernel<F, 4><<<Grid(c), c.threads, c.shared_bytes, stream>>>(p);
  } else {
    DecodeAttentionKernel<F, 8><<<Grid(c), c.threads, c.shared_bytes, stream>>>(p);
  }
  return LaunchStatus("DecodeAttentionKernel");
}

template <KvFormat F>
absl::Status Prefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  const LaunchConfig c = PrefillAttentionLaunch(p);
  if (absl::Status s = CheckLaunch(c, "PrefillAttentionKernel", /*may_opt_in=*/true); !s.ok()) return s;
  if (absl::Status s = OptIn(PrefillAttentionKernel<F>, c, "PrefillAttentionKernel shared memory");
      !s.ok()) {
    return s;
  }
  PrefillAttentionKernel<F><<<Grid(c), c.threads, c.shared_bytes, stream>>>(p);
  return LaunchStatus("PrefillAttentionKernel");
}

template <KvFormat F, int DK>
struct PrefillMma {
  static absl::Status Run(const PrefillAttentionParams& p, cudaStream_t stream) {
    const LaunchConfig c = PrefillMmaLaunch(p, DK);
    if (absl::Status s = CheckLaunch(c, "PrefillAttentionMmaKernel", /*may_opt_in=*/true); !s.ok()) {
      return s;
    }
    if (absl::Status s = OptIn(PrefillAttentionMmaKernel<F, DK>, c,
                               "PrefillAttentionMmaKernel shared memory");
        !s.ok()) {
      return s;
    }
    PrefillAttentionMmaKernel<F, DK><<<Grid(c), c.threads, c.shared_bytes, stream>>>(p);
    return LaunchStatus("PrefillAttentionMmaKernel");
  }
};

absl::Status DecodeAnyFormat(const DecodeAttentionParams& p, const LaunchConfig& c,
                             cudaStream_t stream) {
  switch (p.a.kv.format) {
    case KvFormat::kF32: return Decode<KvFormat::kF32>(p, c, stream);
    case KvFormat::kBF16: return Decode<KvFormat::kBF16>(p, c, stream);
    case KvFormat::kInt8: return Decode<KvFormat::kInt8>(p, c, stream);
    case KvFormat::kInt4: return Decode<KvFormat::kInt4>(p, c, stream);
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
  const LaunchConfig c = DecodeAttentionLaunch(p);
  if (absl::Status s = CheckLaunch(c, "DecodeAttentionKernel", /*may_opt_in=*/false); !s.ok()) {
    return s;
  }
  const absl::Status s = DecodeAnyFormat(p, c, Stream(stream));
  if (!s.ok() || p.max_splits == 1) return s;
  const LaunchConfig m = DecodeMergeLaunch(p);
  DecodeMergeKernel<<<Grid(m), m.threads, m.shared_bytes, Stream(stream)>>>(p);
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
  switch (a.kv.format) {
    case KvFormat::kF32: return Prefill<KvFormat::kF32>(p, Stream(stream));
    case KvFormat::kBF16: return Prefill<KvFormat::kBF16>(p, Stream(stream));
    case KvFormat::kInt8: return Prefill<KvFormat::kInt8>(p, Stream(stream));
    case KvFormat::kInt4: return Prefill<KvFormat::kInt4>(p, Stream(stream));
  }
  return absl::InternalError("unknown KV format");
}

}  // namespace pdserve::cuda
