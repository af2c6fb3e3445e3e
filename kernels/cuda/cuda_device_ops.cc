#include "kernels/cuda/cuda_device_ops.h"

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/attention_ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/layer_ops.h"

namespace pdserve::cuda {
namespace {

constexpr size_t kGemmWorkspace = 32u << 20;

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(s)));
}

class CudaDeviceOps final : public DeviceOps {
 public:
  ~CudaDeviceOps() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (api_ == nullptr) return;
    for (auto& [key, plan] : plans_) {
      api_->MatrixLayoutDestroy(plan.a);
      api_->MatrixLayoutDestroy(plan.b);
      api_->MatrixLayoutDestroy(plan.c);
    }
    if (op_ != nullptr) api_->MatmulDescDestroy(op_);
    if (pref_ != nullptr) api_->MatmulPreferenceDestroy(pref_);
    if (lt_ != nullptr) api_->Destroy(lt_);
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (kv_pool_ != nullptr) cudaFree(kv_pool_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(int device) {
    if (DeviceCount() == 0) return absl::UnavailableError("--device cuda: " + DescribeDevice());
    auto api = LoadCublasLt();
    if (!api.ok()) return api.status();
    api_ = *api;
    PD_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    PD_CUDA_RETURN(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device), "SM count");
    cudaDeviceProp prop;
    PD_CUDA_RETURN(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    describe_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                std::to_string(prop.minor) + ", " + std::to_string(sms_) + " SMs)";
    PD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    PD_CUDA_RETURN(cudaMalloc(&workspace_, kGemmWorkspace), "cuBLASLt workspace");
    if (absl::Status s = LtStatus(api_->Create(&lt_), "cublasLtCreate"); !s.ok()) return s;
    if (absl::Status s = LtStatus(api_->MatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                  "cublasLtMatmulDescCreate");
        !s.ok()) {
      return s;
    }
    // y^T = w x^T in cuBLAS's column-major terms: A = w (stored k x n, transposed), B = x^T.
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    api_->MatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    api_->MatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (absl::Status s = LtStatus(api_->MatmulPreferenceCreate(&pref_), "preference"); !s.ok()) {
      return s;
    }
    const size_t ws = kGemmWorkspace;
    api_->MatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    return absl::OkStatus();
  }

  std::string Describe() const override { return describe_; }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError("cudaMalloc of " + std::to_string(bytes) + " bytes failed");
    }
    PD_CUDA_RETURN(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemset");
    return p;
  }
  void Free(void* p) override { cudaFree(p); }
  absl::StatusOr<void*> AllocHost(size_t bytes) override {
    void* p = nullptr;
    PD_CUDA_RETURN(cudaMallocHost(&p, bytes == 0 ? 1 : bytes), "cudaMallocHost");
    return p;
  }
  void FreeHost(void* p) override { cudaFreeHost(p); }
  absl::Status CopyIn(void* device, const void* host, size_t bytes) override {
    return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_), "copy in");
  }
  absl::Status CopyOut(void* host, const void* device, size_t bytes) override {
    PD_CUDA_RETURN(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_), "copy out");
    return Synchronize();
  }
  absl::Status Synchronize() override {
    return CudaStatus(cudaStreamSynchronize(stream_), "stream (a kernel failed)");
  }
  absl::StatusOr<uint8_t*> KvPoolMemory(uint8_t*, size_t bytes) override {
    if (kv_pool_ != nullptr) return absl::FailedPreconditionError("one KV pool per device ops");
    absl::StatusOr<void*> p = Alloc(bytes);
    if (!p.ok()) return p.status();
    kv_pool_ = *p;
    return static_cast<uint8_t*>(*p);
  }

  absl::Status Gemm(const GemmParams& p) override {
    if (p.m == 0) return absl::OkStatus();
    auto key = std::make_tuple(p.m, p.n, p.k, p.ldx, p.ldy);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      Plan plan;
      api_->MatrixLayoutCreate(&plan.a, CUDA_R_16BF, p.k, p.n, p.k);
      api_->MatrixLayoutCreate(&plan.b, CUDA_R_16BF, p.k, p.m, p.ldx);
      api_->MatrixLayoutCreate(&plan.c, CUDA_R_32F, p.n, p.m, p.ldy);
      cublasLtMatmulHeuristicResult_t result;
      int found = 0;
      const cublasStatus_t s = api_->MatmulAlgoGetHeuristic(lt_, op_, plan.a, plan.b, plan.c,
                                                              plan.c, pref_, 1, &result, &found);
      if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        api_->MatrixLayoutDestroy(plan.a);
        api_->MatrixLayoutDestroy(plan.b);
        api_->MatrixLayoutDestroy(plan.c);
        return absl::InternalError("cuBLASLt has no bf16 algorithm for a " + std::to_string(p.m) +
                                   "x" + std::to_string(p.n) + "x" + std::to_string(p.k) + " GEMM");
      }
      plan.algo = result.algo;
      it = plans_.emplace(key, plan).first;
    }
    const float alpha = 1.0f, beta = 0.0f;
    return LtStatus(api_->Matmul(lt_, op_, &alpha, p.w, it->second.a, p.x, it->second.b, &beta,
                                   p.y, it->second.c, p.y, it->second.c, &it->second.algo,
                                   workspace_, kGemmWorkspace, stream_),
                    "cublasLtMatmul");
  }
  absl::Status Fill(const FillParams& p) override { return LaunchFill(p, stream_); }
  absl::Status Embedding(const EmbeddingParams& p) override { return LaunchEmbedding(p, stream_); }
  absl::Status AddRmsNorm(const AddRmsNormParams& p) override { return LaunchAddRmsNorm(p, stream_); }
  absl::Status QkvRopeStore(const QkvRopeStoreParams& p) override {
    return LaunchQkvRopeStore(p, stream_);
  }
  absl::Status SiluMul(const SiluMulParams& p) override { return LaunchSiluMul(p, stream_); }
  absl::Status DecodeAttention(const DecodeAttentionParams& p) override {
    return LaunchDecodeAttention(p, stream_);
  }
  absl::Status PrefillAttention(const PrefillAttentionParams& p) override {
    return LaunchPrefillAttention(p, stream_);
  }

  absl::Status BeginCapture() override {
    return CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                      "cudaStreamBeginCapture");
  }
  absl::Status EndCapture(int64_t key) override {
    cudaGraph_t graph = nullptr;
    PD_CUDA_RETURN(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    PD_CUDA_RETURN(err, "cudaGraphInstantiate");
    if (auto it = graphs_.find(key); it != graphs_.end()) cudaGraphExecDestroy(it->second);
    graphs_[key] = exec;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Replay(int64_t key) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    PD_CUDA_RETURN(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
    return true;
  }

  absl::Status PrepareLayerMarks(int64_t layers) override {
    while (static_cast<int64_t>(marks_.size()) < layers) {
      cudaEvent_t e;
      PD_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      marks_.push_back(e);
    }
    return absl::OkStatus();
  }
  absl::Status MarkLayer(int64_t layer) override {
    return CudaStatus(cudaEventRecord(marks_.at(layer), stream_), "cudaEventRecord");
  }
  absl::Status WaitLayer(int64_t layer) override {
    return CudaStatus(cudaEventSynchronize(marks_.at(layer)), "layer mark (a kernel failed)");
  }

 private:
  struct Plan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  const CublasLtApi* api_ = nullptr;
  std::string describe_;
  int sms_ = 0;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  void* kv_pool_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
  std::vector<cudaEvent_t> marks_;
  std::map<int64_t, cudaGraphExec_t> graphs_;  // Decode steps by batch size.
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(int device) {
  auto ops = std::make_unique<CudaDeviceOps>();
  if (absl::Status s = ops->Init(device); !s.ok()) return s;
  return std::unique_ptr<DeviceOps>(std::move(ops));
}

}  // namespace pdserve::cuda
