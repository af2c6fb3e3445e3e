// What the device model runner (common/engine/device_model_runner.h) asks of a device: memory,
// stream-ordered copies, the linear layers' GEMM, the kernels of kernel_params.h and per-layer
// completion markers. One implementation per backend: CudaDeviceOps (cuda_device_ops.h: the CUDA
// runtime, cuBLASLt and the kernels of *_ops.cu on one stream) and, as test infrastructure only,
// HostDeviceOps (host_device_ops.h: the same kernel bodies run by the host execution layer), so
// the runner's logic is tested in CI against the CPU runner without a GPU. Plain C++.
#ifndef PDSERVE_KERNELS_CUDA_DEVICE_OPS_H_
#define PDSERVE_KERNELS_CUDA_DEVICE_OPS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual std::string Describe() const = 0;

  // Device memory, zeroed. ResourceExhausted when it does not fit.
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  virtual void Free(void* device) = 0;
  // Host memory the device copies from quickly (pinned on a GPU).
  virtual absl::StatusOr<void*> AllocHost(size_t bytes) = 0;
  virtual void FreeHost(void* host) = 0;
  // Stream-ordered: CopyIn may return before the copy is done (`host` must stay unchanged until
  // the next Synchronize or CopyOut); CopyOut returns when the bytes are on the host.
  virtual absl::Status CopyIn(void* device, const void* host, size_t bytes) = 0;
  virtual absl::Status CopyOut(void* host, const void* device, size_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;

  // The KV pool the kernels read and write, for a pool of `bytes` whose host mapping is
  // `host_pool`: the host mapping itself where the device reads host memory (the host execution
  // layer), else a device allocation of the same layout owned by the ops.
  virtual absl::StatusOr<uint8_t*> KvPoolMemory(uint8_t* host_pool, size_t bytes) = 0;

  virtual absl::Status Fill(const FillParams& p) = 0;
  virtual absl::Status Gemm(const GemmParams& p) = 0;
  virtual absl::Status Embedding(const EmbeddingParams& p) = 0;
  virtual absl::Status AddRmsNorm(const AddRmsNormParams& p) = 0;
  virtual absl::Status QkvRopeStore(const QkvRopeStoreParams& p) = 0;
  virtual absl::Status SiluMul(const SiluMulParams& p) = 0;
  virtual absl::Status DecodeAttention(const DecodeAttentionParams& p) = 0;
  virtual absl::Status PrefillAttention(const PrefillAttentionParams& p) = 0;

  // CUDA graphs: between BeginCapture and EndCapture(key) the ops are recorded, not run
  // (device memory they point at is read when the recording runs); Replay(key) runs the
  // recording of `key`, or answers false when there is none. Copies stay outside recordings.
  virtual absl::Status BeginCapture() = 0;
  virtual absl::Status EndCapture(int64_t key) = 0;
  virtual absl::StatusOr<bool> Replay(int64_t key) = 0;

  // Marks the point of the stream where layer `layer`'s KV is stored (a CUDA event), and waits
  // for it on the host. layer < the count given to PrepareLayerMarks.
  virtual absl::Status PrepareLayerMarks(int64_t layers) = 0;
  virtual absl::Status MarkLayer(int64_t layer) = 0;
  virtual absl::Status WaitLayer(int64_t layer) = 0;
};

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_DEVICE_OPS_H_
