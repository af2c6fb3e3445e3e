// The dialect our hand-written CUDA kernels are written in, so the same kernel body compiles twice:
// by nvcc as device code (DeviceCtx, in device_ctx.cuh), and by the host compiler for the host
// execution layer of the tests (HostCtx, in host_exec.h), which runs a block's threads as host
// threads. A kernel body is a template over the context `Ctx` and touches the thread hierarchy
// only through it:
//   ctx.thread(), ctx.threads()           threadIdx.x, blockDim.x (1-D blocks, a multiple of 32)
//   ctx.block(0|1|2), ctx.blocks(0|1|2)   blockIdx.{x,y,z}, gridDim.{x,y,z}
//   ctx.sync()                            __syncthreads()
//   ctx.shfl_xor(v, mask)                 __shfl_xor_sync(full mask, v, mask): every lane
//   ctx.shared<T>()                       the block's dynamic shared memory
//   ctx.mma_bf16(d, a, b)                 mma.sync m16n8k16 bf16 -> f32: d += A * B on tensor
//                                         cores, warp-wide (every lane, warp-uniform control
//                                         flow); the fragments are laid out below
// and does its math through the helpers below (one definition per side). Everything else is plain
// C++ shared by both compilers. This header includes no CUDA header.
#ifndef PDSERVE_KERNELS_CUDA_DIALECT_H_
#define PDSERVE_KERNELS_CUDA_DIALECT_H_

#include <cstdint>
#include <cstring>  // std::memcpy in the host side of PD_HD helpers (nvcc's host pass too).

#if defined(__CUDACC__)
#define PD_HD __host__ __device__ __forceinline__
#define PD_DEVICE __device__ __forceinline__
#else
#include <cmath>
#define PD_HD inline
#define PD_DEVICE inline
#endif

// Unrolls the loop that follows on the device (loops over register arrays with constant bounds:
// unrolled, the arrays stay in registers instead of local memory).
#if defined(__CUDA_ARCH__)
#define PD_UNROLL _Pragma("unroll")
#else
#define PD_UNROLL
#endif

namespace pdserve::cuda {

inline constexpr int kWarpSize = 32;

PD_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

PD_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// bf16 as its 16 bits (uint16_t on both sides; no cuda_bf16.h in shared code).
PD_HD float Bf16Float(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }
// Round to nearest even; NaN stays a quiet NaN: the same bits as common/base/dtype.h's F32ToBf16.
PD_HD uint16_t FloatBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Stores f as the element type T of an output (float, or uint16_t = bf16).
template <typename T>
PD_HD void StoreAs(T* p, float f) {
  if constexpr (sizeof(T) == 2) {
    *p = FloatBf16(f);
  } else {
    *p = f;
  }
}
template <typename T>
PD_HD float LoadAs(const T* p) {
  if constexpr (sizeof(T) == 2) {
    return Bf16Float(*p);
  } else {
    return *p;
  }
}

PD_HD float Exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
PD_HD float Sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
PD_HD float Max(float a, float b) { return a > b ? a : b; }
PD_HD int MinInt(int64_t a, int64_t b) { return static_cast<int>(a < b ? a : b); }
PD_HD int MaxInt(int64_t a, int64_t b) { return static_cast<int>(a > b ? a : b); }
// Round half to even in double (C's rint in the default rounding mode on both sides).
PD_HD double RoundEven(double x) {
#if defined(__CUDA_ARCH__)
  return rint(x);
#else
  return std::nearbyint(x);
#endif
}
PD_HD bool IsFinite(float x) { return (FloatBits(x) & 0x7f800000u) != 0x7f800000u; }
inline constexpr float kNegInf = -__builtin_huge_valf();

// Two bf16 in one 32-bit register, as the tensor-core fragments hold them: `lo` in the low half.
PD_HD uint32_t PackBf16x2(float lo, float hi) {
  return static_cast<uint32_t>(FloatBf16(lo)) | (static_cast<uint32_t>(FloatBf16(hi)) << 16);
}

// Fragments of ctx.mma_bf16 (PTX's m16n8k16 layout for .bf16). Lane l of the warp: g = l / 4,
// t = l % 4. A is 16x16 (row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
// a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]. B is 16x8 (k x n, given by columns):
// b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]. C/D is 16x8 f32: d[0..1] = D[g][2t..2t+1],
// d[2..3] = D[g+8][2t..2t+1]. Each register's lower-indexed element is in its low half.
inline constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;

// Warp reductions: every lane gets the result. Butterfly order, the same on both sides.
template <typename Ctx>
PD_DEVICE float WarpSum(Ctx& ctx, float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += ctx.shfl_xor(v, m);
  return v;
}
template <typename Ctx>
PD_DEVICE float WarpMax(Ctx& ctx, float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v = Max(v, ctx.shfl_xor(v, m));
  return v;
}

// Block reductions: every thread gets the result. `scratch` holds 32 floats of shared memory
// that no other live value uses; the call begins and ends with a sync, so it may be repeated.
template <typename Ctx>
PD_DEVICE float BlockSum(Ctx& ctx, float v, float* scratch) {
  v = WarpSum(ctx, v);
  const int warp = ctx.thread() / kWarpSize, lane = ctx.thread() % kWarpSize;
  const int warps = ctx.threads() / kWarpSize;
  ctx.sync();
  if (lane == 0) scratch[warp] = v;
  ctx.sync();
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = WarpSum(ctx, total);
  ctx.sync();
  return total;
}
template <typename Ctx>
PD_DEVICE float BlockMax(Ctx& ctx, float v, float* scratch) {
  v = WarpMax(ctx, v);
  const int warp = ctx.thread() / kWarpSize, lane = ctx.thread() % kWarpSize;
  const int warps = ctx.threads() / kWarpSize;
  ctx.sync();
  if (lane == 0) scratch[warp] = v;
  ctx.sync();
  float total = lane < warps ? scratch[lane] : kNegInf;
  total = WarpMax(ctx, total);
  ctx.sync();
  return total;
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_DIALECT_H_
