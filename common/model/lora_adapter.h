// A LoRA adapter in Hugging Face PEFT's format (a directory with adapter_config.json and
// adapter_model.safetensors), loaded for one base model: per layer and projection the matrices
// A [r][in] and B [out][r] in f32, the adapter's scale (lora_alpha / r, or / sqrt(r) with
// use_rslora) folded into B, so a linear layer's output becomes W x + B (A x).
//
// Loading refuses, naming the field or tensor, what the engine would otherwise compute wrongly:
// a shape that does not fit the base model, a rank above the server's limit, and the PEFT
// features it does not run (bias, DoRA, embedding or lm_head adapters, modules_to_save,
// per-module rank or alpha patterns, fan_in_fan_out). Immutable after Load: shared by the
// engines of a process and by the requests running with it (a request keeps it alive).
#ifndef PDSERVE_COMMON_MODEL_LORA_ADAPTER_H_
#define PDSERVE_COMMON_MODEL_LORA_ADAPTER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "common/base/tensor_ref.h"
#include "common/kvcache/block_hash.h"
#include "common/model/model_config.h"

namespace pdserve {

// The projections an adapter may target, in PEFT's module names.
enum class LoraTarget : int { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
std::string_view LoraTargetName(LoraTarget t);  // "q_proj", ..., "down_proj"

// The largest rank a server accepts (vLLM's bound for --max-lora-rank).
inline constexpr int64_t kMaxLoraRankLimit = 512;

class LoraAdapter {
 public:
  // One projection of one layer: empty (rank 0) where the adapter does not target it.
  struct Matrices {
    std::vector<float> a;  // [rank][in]
    std::vector<float> b;  // [out][rank], times the adapter's scale
    MatrixRef a_ref, b_ref;
    // The same rounded to bf16 and packed in bf16 panels (PackBf16: engines computing in bf16).
    std::vector<uint16_t> a_bf16, b_bf16;
    MatrixRef a_panels, b_panels;
    int64_t rank() const { return a_ref.rows; }
  };

  // `name` is what requests call it by (their OpenAI `model`). InvalidArgument naming the file
  // and field or tensor for anything malformed or unsupported, or a rank above `max_rank`;
  // NotFound when a file is missing.
  static absl::StatusOr<std::shared_ptr<const LoraAdapter>> Load(std::string name,
                                                                 const std::string& dir,
                                                                 const ModelConfig& base,
                                                                 int64_t max_rank);

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  // adapter_config.json's base_model_name_or_path ("" when absent).
  const std::string& base_model() const { return base_model_; }
  int64_t rank() const { return rank_; }
  double alpha() const { return alpha_; }
  bool rslora() const { return rslora_; }
  double scale() const { return scale_; }
  // Null where the adapter leaves that projection of that layer alone.
  const Matrices* matrices(int64_t layer, LoraTarget t) const {
    const Matrices& m = layers_[static_cast<size_t>(layer)][static_cast<size_t>(t)];
    return m.rank() > 0 ? &m : nullptr;
  }
  // Whether any layer has a term for `t`.
  bool targets(LoraTarget t) const { return targeted_[static_cast<size_t>(t)]; }
  size_t bytes() const { return bytes_; }  // Of the f32 matrices.
  // The parent hash of the first KV block of its requests (block_hash.h): a 128-bit hash of what
  // its term computes (every matrix, the scale folded in), so the KV of one adapter never matches
  // the base model's or another adapter's, and an adapter reloaded from changed files (or the
  // same name on another worker, or in a shared KV store) never reuses its old blocks, while
  // the same files loaded again do.
  const BlockHash& kv_root() const { return kv_root_; }

  // Makes every Matrices' a_panels and b_panels: bf16 panels in `layout` (the process's
  // kernels::Bf16PanelLayout()), once, whichever engine asks first (thread-safe); later calls
  // return at once. The layout never changes within a process.
  void PackBf16(MatrixLayout layout) const;

 private:
  LoraAdapter() = default;
  static BlockHash KvRoot(const LoraAdapter& a, int64_t num_layers);

  std::string name_, path_, base_model_;
  int64_t rank_ = 0;
  double alpha_ = 0, scale_ = 0;
  bool rslora_ = false;
  // Mutable for PackBf16 only, which fills the bf16 members once under packed_once_ (nothing reads
  // them before).
  mutable std::vector<std::array<Matrices, kNumLoraTargets>> layers_;
  std::array<bool, kNumLoraTargets> targeted_{};
  size_t bytes_ = 0;
  BlockHash kv_root_;
  mutable absl::once_flag packed_once_;  // PackBf16's.
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_LORA_ADAPTER_H_
