#include "common/model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/dtype.h"
#include "common/base/rng.h"
#include "common/base/strings.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_model.h"
#include "kernels/cpu/quant_blocks.h"

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

// Tensors of a GGUF file by llama.cpp's names, checked against the config's shapes. Matrices are
// read in place (quantized ones as their blocks); a llama file's q and k rows are put back in
// Hugging Face's order (gguf_model.h), into memory the weights own.
class GgufGetter {
 public:
  GgufGetter(const GgufFile& file, std::vector<std::unique_ptr<uint8_t[]>>* owned)
      : g_(file), owned_(owned) {}

  absl::StatusOr<const GgufTensor*> Get(const std::string& name, int64_t rows, int64_t cols) const {
    const GgufTensor* t = g_.FindTensor(name);
    if (t == nullptr) return absl::NotFoundError(Str(g_.source(), ": no tensor ", name));
    const std::vector<int64_t> want = rows == 0 ? std::vector<int64_t>{cols}
                                                : std::vector<int64_t>{cols, rows};
    if (t->dims != want) {
      return absl::InvalidArgumentError(
          Str(g_.source(), ": tensor '", name, "' has dims [", absl::StrJoin(t->dims, ", "),
              "], expected [", absl::StrJoin(want, ", "), "] from its metadata"));
    }
    return t;
  }

  // `permute_head_dim` > 0: reorder rows from llama.cpp's rotary layout (q and k of llama).
  absl::StatusOr<MatrixRef> Matrix(const std::string& name, int64_t rows, int64_t cols,
                                   int64_t permute_head_dim = 0) const {
    PD_ASSIGN_OR_RETURN(const GgufTensor* t, Get(name, rows, cols));
    MatrixRef m{DType::kF32, t->data, rows, cols};
    switch (t->type) {
      case GgmlType::kF32: m.dtype = DType::kF32; break;
      case GgmlType::kF16: m.dtype = DType::kF16; break;
      case GgmlType::kBF16: m.dtype = DType::kBF16; break;
      default: m.quant_type = t->type; break;
    }
    if (permute_head_dim > 0) {
      const size_t row_bytes = t->bytes / static_cast<size_t>(rows);
      auto copy = std::make_unique<uint8_t[]>(t->bytes);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(copy.get() + GgufRowToHf(r, permute_head_dim) * row_bytes,
                    t->data + r * row_bytes, row_bytes);
      }
      m.data = copy.get();
      owned_->push_back(std::move(copy));
    }
    return m;
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n,
                                            int64_t permute_head_dim = 0) const {
    PD_ASSIGN_OR_RETURN(const GgufTensor* t, Get(name, 0, n));
    std::vector<float> v(static_cast<size_t>(n));
    kernels::DequantizeRow(t->type, t->data, v.data(), n);
    if (permute_head_dim > 0) {
      std::vector<float> hf(v.size());
      for (int64_t r = 0; r < n; ++r) hf[GgufRowToHf(r, permute_head_dim)] = v[r];
      v = std::move(hf);
    }
    return v;
  }

 private:
  const GgufFile& g_;
  std::vector<std::unique_ptr<uint8_t[]>>* owned_;
};

}  // namespace

std::string ModelWeights::weight_format() const {
  if (!quantized_) return std::string(DTypeName(lm_head_.dtype));
  std::vector<std::string> formats;
  auto add = [&](const MatrixRef& m) {
    const std::string f(m.quantized() ? GgmlTypeName(m.quant_type) : DTypeName(m.dtype));
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
  };
  for (const LayerWeights& l : layers_) {
    for (const MatrixRef* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj,
                               &l.up_proj, &l.down_proj}) {
      add(*m);
    }
  }
  add(lm_head_);
  return absl::StrJoin(formats, "+");
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::LoadGguf(const ModelConfig& config,
                                                                     const std::string& path) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->config_ = config;
  PD_ASSIGN_OR_RETURN(w->gguf_, GgufFile::Open(path));
  const GgufGetter g(*w->gguf_, &w->owned_);
  const ModelConfig& c = config;
  const int64_t h = c.hidden_size;
  const int64_t permute = GgufPermutesQk(*w->gguf_) ? c.head_dim : 0;
  PD_ASSIGN_OR_RETURN(w->embed_tokens_, g.Matrix("token_embd.weight", c.vocab_size, h));
  if (w->gguf_->FindTensor("output.weight") == nullptr) {
    w->lm_head_ = w->embed_tokens_;
  } else {
    PD_ASSIGN_OR_RETURN(w->lm_head_, g.Matrix("output.weight", c.vocab_size, h));
  }
  PD_ASSIGN_OR_RETURN(w->final_norm_, g.Vector("output_norm.weight", h));
  w->layers_.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& L = w->layers_[i];
    const std::string p = Str("blk.", i, ".");
    PD_ASSIGN_OR_RETURN(L.input_norm, g.Vector(p + "attn_norm.weight", h));
    PD_ASSIGN_OR_RETURN(L.post_attention_norm, g.Vector(p + "ffn_norm.weight", h));
    PD_ASSIGN_OR_RETURN(L.q_proj, g.Matrix(p + "attn_q.weight", c.q_size(), h, permute));
    PD_ASSIGN_OR_RETURN(L.k_proj, g.Matrix(p + "attn_k.weight", c.kv_size(), h, permute));
    PD_ASSIGN_OR_RETURN(L.v_proj, g.Matrix(p + "attn_v.weight", c.kv_size(), h));
    PD_ASSIGN_OR_RETURN(L.o_proj, g.Matrix(p + "attn_output.weight", h, c.q_size()));
    if (c.qkv_bias) {
      PD_ASSIGN_OR_RETURN(L.q_bias, g.Vector(p + "attn_q.bias", c.q_size(), permute));
      PD_ASSIGN_OR_RETURN(L.k_bias, g.Vector(p + "attn_k.bias", c.kv_size(), permute));
      PD_ASSIGN_OR_RETURN(L.v_bias, g.Vector(p + "attn_v.bias", c.kv_size()));
    }
    if (c.o_bias) {
      PD_ASSIGN_OR_RETURN(L.o_bias, g.Vector(p + "attn_output.bias", h));
    }
    if (c.qk_norm) {
      PD_ASSIGN_OR_RETURN(L.q_norm, g.Vector(p + "attn_q_norm.weight", c.head_dim));
      PD_ASSIGN_OR_RETURN(L.k_norm, g.Vector(p + "attn_k_norm.weight", c.head_dim));
    }
    PD_ASSIGN_OR_RETURN(L.gate_proj, g.Matrix(p + "ffn_gate.weight", c.intermediate_size, h));
    PD_ASSIGN_OR_RETURN(L.up_proj, g.Matrix(p + "ffn_up.weight", c.intermediate_size, h));
    PD_ASSIGN_OR_RETURN(L.down_proj, g.Matrix(p + "ffn_down.weight", h, c.intermediate_size));
    if (c.mlp_bias) {
      PD_ASSIGN_OR_RETURN(L.gate_bias, g.Vector(p + "ffn_gate.bias", c.intermediate_size));
      PD_ASSIGN_OR_RETURN(L.up_bias, g.Vector(p + "ffn_up.bias", c.intermediate_size));
      PD_ASSIGN_OR_RETURN(L.down_bias, g.Vector(p + "ffn_down.bias", h));
    }
    for (const MatrixRef* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj,
                               &L.up_proj, &L.down_proj}) {
      w->quantized_ |= m->quantized();
    }
  }
  w->quantized_ |= w->lm_head_.quantized() || w->embed_tokens_.quantized();
  return w;
}

void ModelWeights::ReleaseMappedPages(const MatrixRef& m) const {
  if (checkpoint_ != nullptr) checkpoint_->ReleasePages(m.data, m.bytes());
  if (gguf_ != nullptr) gguf_->ReleasePages(m.data, m.bytes());
}

void ModelWeights::ConvertMatrices(WeightFormat format) {
  if (format == WeightFormat::kAsStored) return;
  const int64_t layers = static_cast<int64_t>(layers_.size());
  // A quantized format quantizes the float matrices (a block-format one stays as it is); a float
  // format converts every matrix that is in another type, block formats included (a GGUF
  // file's weights in bf16 for one tier, say). A type that falls back to a float one for a
  // quantized format (rows that are not whole blocks) leaves the matrix as it is.
  const bool to_float = format == WeightFormat::kF32 || format == WeightFormat::kF16 ||
                        format == WeightFormat::kBF16;
  auto convert = [&](MatrixRef* m, MatrixRole role, int64_t layer, bool tied) {
    const GgmlType type = MatrixType(format, role, layer, layers, m->cols, tied);
    if (to_float ? m->element_type() == type : m->quantized() || !GgmlQuantized(type)) return;
    const GgmlType from = m->element_type();
    const int64_t row_bytes = GgmlRowBytes(type, m->cols);
    auto out = std::make_unique<uint8_t[]>(static_cast<size_t>(m->rows * row_bytes));
    std::vector<float> row(static_cast<size_t>(m->cols));
    for (int64_t r = 0; r < m->rows; ++r) {
      kernels::DequantizeRow(from, m->row(r), row.data(), m->cols);
      kernels::EncodeRow(type, row.data(), out.get() + r * row_bytes, m->cols);
    }
    MatrixRef q{to_float ? MatrixRef::FloatDType(type) : DType::kF32, out.get(), m->rows, m->cols};
    if (!to_float) q.quant_type = type;
    *m = q;
    owned_.push_back(std::move(out));
  };
  const bool tied = lm_head_.data == embed_tokens_.data;
  convert(&embed_tokens_, MatrixRole::kEmbedding, 0, tied);
  if (tied) {
    lm_head_ = embed_tokens_;
  } else {
    convert(&lm_head_, MatrixRole::kHead, 0, false);
  }
  for (int64_t i = 0; i < layers; ++i) {
    LayerWeights& L = layers_[static_cast<size_t>(i)];
    const std::pair<MatrixRef*, MatrixRole> matrices[] = {
        {&L.q_proj, MatrixRole::kAttnQ},      {&L.k_proj, MatrixRole::kAttnK},
        {&L.v_proj, MatrixRole::kAttnV},      {&L.o_proj, MatrixRole::kAttnOutput},
        {&L.gate_proj, MatrixRole::kFfnGate}, {&L.up_proj, MatrixRole::kFfnUp},
        {&L.down_proj, MatrixRole::kFfnDown}};
    for (const auto& [m, role] : matrices) convert(m, role, i, false);
  }
  quantized_ = lm_head_.quantized() || embed_tokens_.quantized();
  for (const LayerWeights& L : layers_) {
    for (const MatrixRef* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj,
                               &L.up_proj, &L.down_proj}) {
      quantized_ |= m->quantized();
    }
  }
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const ModelConfig& config,
                                                                 const std::string& dir,
                                                                 WeightFormat quantize_to) {
  if (quantize_to != WeightFormat::kAsStored) {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> w, Load(config, dir));
    w->ConvertMatrices(quantize_to);
    return w;
  }
  if (IsGgufPath(dir)) return LoadGguf(config, dir);
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

std::unique_ptr<ModelWeights> ModelWeights::Synthetic(const ModelConfig& config, uint64_t seed,
                                                      bool materialize) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->config_ = config;
  const ModelConfig& c = config;
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  uint64_t stream = seed * 1000003;
  // The next matrix of the stream order: rows x cols, fan-in cols (scale 1 when `unit`).
  auto matrix = [&](int64_t rows, int64_t cols, bool unit = false) {
    ++stream;
    MatrixRef m{DType::kBF16, nullptr, rows, cols};
    if (!materialize) return m;
    const int64_t n = rows * cols;
    auto data = std::make_unique<uint16_t[]>(static_cast<size_t>(n));
    const float scale = unit ? 1.0f : static_cast<float>(std::sqrt(3.0 / static_cast<double>(cols)));
    for (int64_t i = 0; i < n; ++i) {
      data[i] = F32ToBf16(scale * SymmetricUniform24(stream, static_cast<uint64_t>(i)));
    }
    m.data = data.get();
    w->synthetic_.push_back(std::move(data));
    return m;
  };
  w->layers_.resize(c.num_layers);
  for (LayerWeights& L : w->layers_) {
    L.input_norm.assign(h, 1.0f);
    L.post_attention_norm.assign(h, 1.0f);
    L.q_proj = matrix(c.q_size(), h);
    L.k_proj = matrix(c.kv_size(), h);
    L.v_proj = matrix(c.kv_size(), h);
    L.o_proj = matrix(h, c.q_size());
    if (c.qkv_bias) {
      L.q_bias.assign(c.q_size(), 0.0f);
      L.k_bias.assign(c.kv_size(), 0.0f);
      L.v_bias.assign(c.kv_size(), 0.0f);
    }
    if (c.o_bias) L.o_bias.assign(h, 0.0f);
    if (c.qk_norm) {
      L.q_norm.assign(c.head_dim, 1.0f);
      L.k_norm.assign(c.head_dim, 1.0f);
    }
    const MatrixRef gate_up = matrix(2 * inter, h);  // One stream: gate's rows, then up's.
    L.gate_proj = MatrixRef{DType::kBF16, gate_up.data, inter, h};
    L.up_proj = MatrixRef{DType::kBF16, gate_up.data == nullptr ? nullptr : gate_up.row(inter),
                          inter, h};
    L.down_proj = matrix(h, inter);
    if (c.mlp_bias) {
      L.gate_bias.assign(inter, 0.0f);
      L.up_bias.assign(inter, 0.0f);
      L.down_bias.assign(h, 0.0f);
    }
  }
  w->lm_head_ = matrix(c.vocab_size, h);
  w->final_norm_.assign(h, 1.0f);
  w->embed_tokens_ = matrix(c.vocab_size, h, /*unit=*/true);
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
