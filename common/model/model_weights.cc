#include "common/model/model_weights.h"

#include "common/base/strings.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace pdserve {
namespace {

class Getter {
 public:
  explicit Getter(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  absl::StatusOr<const SafetensorsTensor*> Get(const std::string& name,
                                               const std::vector<int64_t>& shape) const {
    PD_ASSIGN_OR_RETURN(Checkpoint::Found found, ckpt_.Find(name));
    const SafetensorsTensor& t = *found.tensor;
    if (t.shape != shape) {
      return absl::InvalidArgumentError(Str(
          *found.file, ": tensor '", name, "' has shape [", absl::StrJoin(t.shape, ", "),
          "], expected [", absl::StrJoin(shape, ", "), "] from config.json"));
    }
    if (!t.dtype) {
      return absl::InvalidArgumentError(Str(*found.file, ": tensor '", name,
                                                     "' has dtype ", t.dtype_name,
                                                     " (supported: F32, BF16, F16)"));
    }
    return &t;
  }

  absl::StatusOr<MatrixRef> Matrix(const std::string& name, int64_t rows, int64_t cols) const {
    PD_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, {rows, cols}));
    return MatrixRef{*t->dtype, t->data, rows, cols};
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) const {
    PD_ASSIGN_OR_RETURN(const SafetensorsTensor* t, Get(name, {n}));
    std::vector<float> out(n);
    for (int64_t i = 0; i < n; ++i) {
      switch (*t->dtype) {
        case DType::kF32: std::memcpy(&out[i], t->data + 4 * i, 4); break;
        case DType::kBF16: {
          uint16_t h;
          std::memcpy(&h, t->data + 2 * i, 2);
          out[i] = Bf16ToF32(h);
          break;
        }
        case DType::kF16: {
          uint16_t h;
          std::memcpy(&h, t->data + 2 * i, 2);
          out[i] = F16ToF32(h);
          break;
        }
      }
    }
    return out;
  }

 private:
  const Checkpoint& ckpt_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const ModelConfig& config,
                                                                 const std::string& dir) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->config_ = config;
  PD_ASSIGN_OR_RETURN(w->checkpoint_, Checkpoint::Open(dir));
  const Getter g(*w->checkpoint_);
  const ModelConfig& c = config;
  const int64_t h = c.hidden_size;

  PD_ASSIGN_OR_RETURN(w->embed_tokens_, g.Matrix("model.embed_tokens.weight", c.vocab_size, h));
  if (c.tie_word_embeddings && !w->checkpoint_->Has("lm_head.weight")) {
    w->lm_head_ = w->embed_tokens_;
  } else {
    PD_ASSIGN_OR_RETURN(w->lm_head_, g.Matrix("lm_head.weight", c.vocab_size, h));
  }
  PD_ASSIGN_OR_RETURN(w->final_norm_, g.Vector("model.norm.weight", h));

  w->layers_.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& L = w->layers_[i];
    const std::string p = Str("model.layers.", i, ".");
    PD_ASSIGN_OR_RETURN(L.input_norm, g.Vector(p + "input_layernorm.weight", h));
    PD_ASSIGN_OR_RETURN(L.post_attention_norm, g.Vector(p + "post_attention_layernorm.weight", h));
    const std::string a = p + "self_attn.";
    PD_ASSIGN_OR_RETURN(L.q_proj, g.Matrix(a + "q_proj.weight", c.q_size(), h));
    PD_ASSIGN_OR_RETURN(L.k_proj, g.Matrix(a + "k_proj.weight", c.kv_size(), h));
    PD_ASSIGN_OR_RETURN(L.v_proj, g.Matrix(a + "v_proj.weight", c.kv_size(), h));
    PD_ASSIGN_OR_RETURN(L.o_proj, g.Matrix(a + "o_proj.weight", h, c.q_size()));
    if (c.qkv_bias) {
      PD_ASSIGN_OR_RETURN(L.q_bias, g.Vector(a + "q_proj.bias", c.q_size()));
      PD_ASSIGN_OR_RETURN(L.k_bias, g.Vector(a + "k_proj.bias", c.kv_size()));
      PD_ASSIGN_OR_RETURN(L.v_bias, g.Vector(a + "v_proj.bias", c.kv_size()));
    }
    if (c.o_bias) {
      PD_ASSIGN_OR_RETURN(L.o_bias, g.Vector(a + "o_proj.bias", h));
    }
    if (c.qk_norm) {
      PD_ASSIGN_OR_RETURN(L.q_norm, g.Vector(a + "q_norm.weight", c.head_dim));
      PD_ASSIGN_OR_RETURN(L.k_norm, g.Vector(a + "k_norm.weight", c.head_dim));
    }
    const std::string m = p + "mlp.";
    PD_ASSIGN_OR_RETURN(L.gate_proj, g.Matrix(m + "gate_proj.weight", c.intermediate_size, h));
    PD_ASSIGN_OR_RETURN(L.up_proj, g.Matrix(m + "up_proj.weight", c.intermediate_size, h));
    PD_ASSIGN_OR_RETURN(L.down_proj, g.Matrix(m + "down_proj.weight", h, c.intermediate_size));
    if (c.mlp_bias) {
      PD_ASSIGN_OR_RETURN(L.gate_bias, g.Vector(m + "gate_proj.bias", c.intermediate_size));
      PD_ASSIGN_OR_RETURN(L.up_bias, g.Vector(m + "up_proj.bias", c.intermediate_size));
      PD_ASSIGN_OR_RETURN(L.down_bias, g.Vector(m + "down_proj.bias", h));
    }
  }
  return w;
}

size_t ModelWeights::DecodeWeightBytes() const {
  size_t total = lm_head_.bytes();
  for (const LayerWeights& L : layers_) {
    total += L.q_proj.bytes() + L.k_proj.bytes() + L.v_proj.bytes() + L.o_proj.bytes() +
             L.gate_proj.bytes() + L.up_proj.bytes() + L.down_proj.bytes();
  }
  return total;
}

}  // namespace pdserve
