// TEST INFRASTRUCTURE (see host_device_ops.h): never part of the pdserve binary.
#include "kernels/cuda/host_device_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_mma_kernels.h"
#include "kernels/cuda/host_exec.h"
#include "kernels/cuda/kernel_checks.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/layer_kernels.h"

namespace pdserve::cuda {
namespace {

using host::Grid;
using host::HostCtx;

class HostDeviceOps final : public DeviceOps {
 public:
  explicit HostDeviceOps(int threads_override) : threads_override_(threads_override) {}

  std::string Describe() const override { return "host execution layer (test infrastructure)"; }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    void* p = std::calloc(bytes == 0 ? 1 : bytes, 1);
    if (p == nullptr) return absl::ResourceExhaustedError("host ops: out of memory");
    return p;
  }
  void Free(void* p) override { std::free(p); }
  absl::StatusOr<void*> AllocHost(size_t bytes) override { return Alloc(bytes); }
  void FreeHost(void* p) override { std::free(p); }
  absl::Status CopyIn(void* device, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOut(void* host, const void* device, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<uint8_t*> KvPoolMemory(uint8_t* host_pool, size_t) override { return host_pool; }

  absl::Status Fill(const FillParams& p) override {
    return Do([this, p] { return RunFill(p); });
  }
  absl::Status RunFill(const FillParams& p) {
    if (p.count > 0) {
      return Run(FillLaunch(p), "FillKernel", false, [&](HostCtx& c) { FillBody(c, p); });
    }
    return absl::OkStatus();
  }
  absl::Status Gemm(const GemmParams& p) override {
    return Do([this, p] { return RunGemm(p); });
  }
  absl::Status RunGemm(const GemmParams& p) {
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        float acc = 0.0f;
        const uint16_t* x = p.x + i * p.ldx;
        const uint16_t* w = p.w + j * p.k;
        for (int64_t c = 0; c < p.k; ++c) acc += Bf16Float(x[c]) * Bf16Float(w[c]);
        p.y[i * p.ldy + j] = acc;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Embedding(const EmbeddingParams& p) override {
    return Do([this, p] { return RunEmbedding(p); });
  }
  absl::Status RunEmbedding(const EmbeddingParams& p) {
    if (p.rows == 0) return absl::OkStatus();
    return Run(EmbeddingLaunch(p), "EmbeddingKernel", false, [&](HostCtx& c) { EmbeddingBody(c, p); });
  }
  absl::Status AddRmsNorm(const AddRmsNormParams& p) override {
    return Do([this, p] { return RunAddRmsNorm(p); });
  }
  absl::Status RunAddRmsNorm(const AddRmsNormParams& p) {
    if (p.rows == 0) return absl::OkStatus();
    return Run(AddRmsNormLaunch(p), "AddRmsNormKernel", false, [&](HostCtx& c) { AddRmsNormBody(c, p); });
  }
  absl::Status QkvRopeStore(const QkvRopeStoreParams& p) override {
    return Do([this, p] { return RunQkvRopeStore(p); });
  }
  absl::Status RunQkvRopeStore(const QkvRopeStoreParams& p) {
    if (absl::Status s = CheckAttentionShape(p.num_heads, p.num_kv_heads, p.head_dim, p.kv.format);
        !s.ok()) {
      return s;
    }
    if (p.tokens.rows == 0) return absl::OkStatus();
    return Run(QkvRopeStoreLaunch(p), "QkvRopeStoreKernel", false, [&](HostCtx& c) {
      switch (p.kv.format) {
        case KvFormat::kF32: return QkvRopeStoreBody<KvFormat::kF32>(c, p);
        case KvFormat::kBF16: return QkvRopeStoreBody<KvFormat::kBF16>(c, p);
        case KvFormat::kInt8: return QkvRopeStoreBody<KvFormat::kInt8>(c, p);
        case KvFormat::kInt4: return QkvRopeStoreBody<KvFormat::kInt4>(c, p);
      }
    });
  }
  absl::Status SiluMul(const SiluMulParams& p) override {
    return Do([this, p] { return RunSiluMul(p); });
  }
  absl::Status RunSiluMul(const SiluMulParams& p) {
    if (p.rows == 0) return absl::OkStatus();
    return Run(SiluMulLaunch(p), "SiluMulKernel", false, [&](HostCtx& c) { SiluMulBody(c, p); });
  }
  absl::Status DecodeAttention(const DecodeAttentionParams& p) override {
    return Do([this, p] { return RunDecodeAttention(p); });
  }
  absl::Status RunDecodeAttention(const DecodeAttentionParams& p) {
    const AttentionParams& a = p.a;
    if (absl::Status s = CheckAttentionShape(a.num_heads, a.kv.num_kv_heads, a.kv.head_dim, a.kv.format);
        !s.ok()) {
      return s;
    }
    if (p.num_rows == 0) return absl::OkStatus();
    absl::Status s = Run(DecodeAttentionLaunch(p), "DecodeAttentionKernel", false, [&](HostCtx& c) {
      switch (a.kv.format) {
        case KvFormat::kF32:
          return Decode<KvFormat::kF32>(c, p);
        case KvFormat::kBF16:
          return Decode<KvFormat::kBF16>(c, p);
        case KvFormat::kInt8:
          return Decode<KvFormat::kInt8>(c, p);
        case KvFormat::kInt4:
          return Decode<KvFormat::kInt4>(c, p);
      }
    });
    if (!s.ok() || p.max_splits == 1) return s;
    return Run(DecodeMergeLaunch(p), "DecodeMergeKernel", false, [&](HostCtx& c) { DecodeMergeBody(c, p); });
  }
  absl::Status PrefillAttention(const PrefillAttentionParams& p) override {
    return Do([this, p] { return RunPrefillAttention(p); });
  }
  absl::Status RunPrefillAttention(const PrefillAttentionParams& p) {
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
      return DispatchPrefillMma<PrefillMma>(a.kv.format, a.kv.head_dim, kUnsupported, p);
    }
    return Run(PrefillAttentionLaunch(p), "PrefillAttentionKernel", true, [&](HostCtx& c) {
      switch (a.kv.format) {
        case KvFormat::kF32: return PrefillAttentionBody<KvFormat::kF32>(c, p);
        case KvFormat::kBF16: return PrefillAttentionBody<KvFormat::kBF16>(c, p);
        case KvFormat::kInt8: return PrefillAttentionBody<KvFormat::kInt8>(c, p);
        case KvFormat::kInt4: return PrefillAttentionBody<KvFormat::kInt4>(c, p);
      }
    });
  }

  template <KvFormat F>
  static void Decode(HostCtx& c, const DecodeAttentionParams& p) {
    if (DecodeElemsPerLane(p.a.kv.head_dim) == 4) {
      DecodeAttentionBody<F, 4>(c, p);
    } else {
      DecodeAttentionBody<F, 8>(c, p);
    }
  }
  // The tensor-core kernel runs with its own block size always (its warps own fixed rows).
  template <KvFormat F, int DK>
  struct PrefillMma {
    static absl::Status Run(const PrefillAttentionParams& p) {
      const LaunchConfig c = PrefillMmaLaunch(p, DK);
      if (absl::Status s = CheckLaunch(c, "PrefillAttentionMmaKernel", true); !s.ok()) return s;
      Launch(c, [&](HostCtx& ctx) { PrefillAttentionMmaBody<F, DK>(ctx, p); });
      return absl::OkStatus();
    }
  };

  static void Launch(const LaunchConfig& c, const std::function<void(HostCtx&)>& body) {
    host::Launch(Grid{c.grid_x, c.grid_y, c.grid_z}, c.threads, c.shared_bytes, body);
  }

  // A launch as production makes it (launch_config.h, the same checks first); a block-size
  // override (tests of other block sizes) changes only the threads per block.
  absl::Status Run(LaunchConfig c, const char* kernel, bool may_opt_in,
                   const std::function<void(HostCtx&)>& body) const {
    if (threads_override_ > 0) c.threads = threads_override_;
    if (absl::Status s = CheckLaunch(c, kernel, may_opt_in); !s.ok()) return s;
    Launch(c, body);
    return absl::OkStatus();
  }

  absl::Status BeginCapture() override {
    if (recording_ != nullptr) return absl::FailedPreconditionError("already capturing");
    recording_ = std::make_unique<std::vector<std::function<absl::Status()>>>();
    return absl::OkStatus();
  }
  absl::Status EndCapture(int64_t key) override {
    if (recording_ == nullptr) return absl::FailedPreconditionError("not capturing");
    graphs_[key] = std::move(*recording_);
    recording_.reset();
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Replay(int64_t key) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    for (auto& op : it->second) {
      if (absl::Status s = op(); !s.ok()) return s;
    }
    return true;
  }

  absl::Status PrepareLayerMarks(int64_t layers) override {
    marks_ = layers;
    return absl::OkStatus();
  }
  absl::Status MarkLayer(int64_t layer) override {
    if (layer < 0 || layer >= marks_) return absl::OutOfRangeError("layer mark out of range");
    return Do([] { return absl::OkStatus(); });
  }
  absl::Status WaitLayer(int64_t layer) override { return MarkLayer(layer); }

 private:
  // Runs op now, or records it while capturing (its params copied, as a graph's kernel nodes).
  absl::Status Do(std::function<absl::Status()> op) {
    if (recording_ != nullptr) {
      recording_->push_back(std::move(op));
      return absl::OkStatus();
    }
    return op();
  }

  int threads_override_;
  int64_t marks_ = 0;
  std::unique_ptr<std::vector<std::function<absl::Status()>>> recording_;
  std::map<int64_t, std::vector<std::function<absl::Status()>>> graphs_;
};

}  // namespace

std::unique_ptr<DeviceOps> CreateHostDeviceOps(int threads_override) {
  return std::make_unique<HostDeviceOps>(threads_override);
}

}  // namespace pdserve::cuda
