// pdserve gguf inspect|dequantize|quantize: GGUF files as pdserve reads them.
//   inspect FILE                      metadata and tensors as JSON (long arrays summarized)
//   dequantize FILE --out DIR         every tensor (or --tensor NAME) as DIR/NAME.npy, f32, as
//                                     pdserve's kernels see it
//   quantize IN OUT --type q8_0       the F32/F16/BF16 matrices of IN in Q8_0 (llama.cpp's bytes),
//                                     the rest as it is
//   convert DIR OUT --type T          a Hugging Face checkpoint as GGUF, laid out as llama.cpp's
//                                     converter lays it out (names, llama's q/k row order, Llama
//                                     3.1's rope_freqs); matrices in T (f32, f16, bf16, q8_0,
//                                     q4_k, or q4_k_m: llama-quantize's mix, weight_format.h)
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/npy_writer.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/model/gguf.h"
#include "common/model/gguf_model.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/gguf_writer.h"
#include "common/model/model_weights.h"
#include "kernels/cpu/quant_blocks.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {
namespace {

using Json = nlohmann::ordered_json;

// A value as JSON; arrays longer than `max_array` as their length and first elements.
Json ValueJson(const GgufValue& v, size_t max_array) {
  switch (v.type) {
    case GgufValueType::kString: return Json(v.s);
    case GgufValueType::kBool: return Json(v.u != 0);
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64: return Json(v.f);
    case GgufValueType::kArray: {
      Json items = Json::array();
      for (size_t i = 0; i < v.array.size() && i < max_array; ++i) {
        items.push_back(ValueJson(v.array[i], max_array));
      }
      const size_t length = v.held_whole() ? v.array.size() : static_cast<size_t>(v.array_length);
      if (length <= max_array && v.held_whole()) return items;
      return Json{{"length", length}, {"first", items}};
    }
    default: return v.is_negative ? Json(v.i) : Json(v.u);
  }
}

int Inspect(const std::string& path, int64_t max_array) {
  auto g = GgufFile::Open(path);
  if (!g.ok()) return ReportError("gguf inspect", g.status());
  Json meta = Json::object();
  for (const std::string& key : (*g)->keys()) {
    meta[key] = ValueJson(*(*g)->Find(key), static_cast<size_t>(max_array));
  }
  Json tensors = Json::array();
  for (const GgufTensor& t : (*g)->tensors()) {
    tensors.push_back({{"name", t.name}, {"type", GgmlTypeName(t.type)}, {"dims", t.dims},
                       {"bytes", t.bytes}});
  }
  Json out = {{"version", (*g)->version()}, {"metadata", meta}, {"tensors", tensors}};
  std::printf("%s\n", out.dump(1, ' ', false, Json::error_handler_t::replace).c_str());
  return kExitOk;
}

int Dequantize(const std::string& path, const std::string& out, const std::string& only) {
  const char* cmd = "gguf dequantize";
  auto g = GgufFile::Open(path);
  if (!g.ok()) return ReportError(cmd, g.status());
  if (absl::Status s = MakeDirectories(out); !s.ok()) return ReportError(cmd, s);
  bool found = false;
  for (const GgufTensor& t : (*g)->tensors()) {
    if (!only.empty() && t.name != only) continue;
    found = true;
    std::vector<float> values(static_cast<size_t>(t.elements()));
    kernels::DequantizeRow(t.type, t.data, values.data(), t.elements());
    std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());  // NumPy's order: rows first.
    if (absl::Status s = WriteNpyFloat32(JoinPath(out, t.name + ".npy"), values, shape); !s.ok()) {
      return ReportError(cmd, s);
    }
  }
  if (!found) {
    return ReportError(cmd, absl::NotFoundError(Str(path, ": no tensor ", only)), kExitUsage);
  }
  return kExitOk;
}

// Copies IN with its float matrices in Q8_0: every metadata key as it is, tensors in order.
int Quantize(const std::string& in, const std::string& out, const std::string& type) {
  const char* cmd = "gguf quantize";
  if (type != "q8_0") {
    return ReportError(cmd, absl::InvalidArgumentError(Str("--type: '", type, "' (q8_0)")),
                       kExitUsage);
  }
  auto g = GgufFile::Open(in);
  if (!g.ok()) return ReportError(cmd, g.status());
  GgufWriter w;
  uint64_t alignment = 32;
  for (const std::string& key : (*g)->keys()) {
    if (key == "general.alignment") alignment = *(*g)->GetUint(key);
    w.Set(key, *(*g)->Find(key));
  }
  for (const GgufTensor& t : (*g)->tensors()) {
    const bool matrix = t.dims.size() == 2 && !GgmlQuantized(t.type) && t.dims[0] % 32 == 0;
    if (!matrix) {
      w.AddTensor(t.name, t.type, t.dims, std::string(reinterpret_cast<const char*>(t.data), t.bytes));
      continue;
    }
    std::vector<float> values(static_cast<size_t>(t.elements()));
    kernels::DequantizeRow(t.type, t.data, values.data(), t.elements());
    std::string q(static_cast<size_t>(GgmlRowBytes(GgmlType::kQ8_0, t.elements())), '\0');
    kernels::QuantizeRowQ8_0(values.data(), q.data(), t.elements());
    w.AddTensor(t.name, GgmlType::kQ8_0, t.dims, std::move(q));
  }
  if (absl::Status s = w.WriteFile(out, alignment); !s.ok()) return ReportError(cmd, s);
  return kExitOk;
}

// A matrix's rows as f32 (any dtype or block format), `permute_head_dim` > 0 reordering them into
// llama.cpp's rotary layout (GGUF row g is Hugging Face row GgufRowToHf(g)).
std::vector<float> Rows(const MatrixRef& m, int64_t permute_head_dim) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const GgmlType type = m.element_type();
  for (int64_t g = 0; g < m.rows; ++g) {
    const int64_t src = permute_head_dim > 0 ? GgufRowToHf(g, permute_head_dim) : g;
    kernels::DequantizeRow(type, m.row(src), &out[static_cast<size_t>(g * m.cols)], m.cols);
  }
  return out;
}

std::string Encode(const std::vector<float>& v, GgmlType type) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::string out(static_cast<size_t>(GgmlRowBytes(type, n)), '\0');
  kernels::EncodeRow(type, v.data(), out.data(), n);
  return out;
}

// A file of the tokenizer alone (llama.cpp's --vocab-only): its metadata, no tensors.
int ConvertVocab(const std::string& dir, const std::string& out) {
  const char* cmd = "gguf convert";
  GgufWriter g;
  g.SetString("general.architecture", "llama");
  g.SetString("general.name", BaseName(dir));
  if (absl::Status s = WriteGgufTokenizer(dir, /*bos_eos=*/true, &g); !s.ok()) {
    return ReportError(cmd, s);
  }
  if (absl::Status s = g.WriteFile(out); !s.ok()) return ReportError(cmd, s);
  return kExitOk;
}

int Convert(const std::string& dir, const std::string& out, const std::string& type_name) {
  const char* cmd = "gguf convert";
  auto parsed = ParseWeightFormat(type_name);
  if (!parsed.ok() || *parsed == WeightFormat::kAsStored) {
    return ReportError(cmd, absl::InvalidArgumentError(Str("--type: '", type_name,
                                                           "' (f32, f16, bf16, q8_0, q4_k or q4_k_m)")),
                       kExitUsage);
  }
  const WeightFormat format = *parsed;
  auto config = ModelConfig::FromFile(JoinPath(dir, "config.json"));
  if (!config.ok()) return ReportError(cmd, config.status());
  const ModelConfig& c = *config;
  auto weights = ModelWeights::Load(c, dir);
  if (!weights.ok()) return ReportError(cmd, weights.status());
  const ModelWeights& w = **weights;
  std::string arch;
  switch (c.family) {
    case ModelFamily::kLlama:
    case ModelFamily::kMistral: arch = "llama"; break;
    case ModelFamily::kQwen2: arch = "qwen2"; break;
    case ModelFamily::kQwen3: arch = "qwen3"; break;
  }
  GgufWriter g;
  const std::string a = arch + ".";
  g.SetString("general.architecture", arch);
  g.SetString("general.name", BaseName(dir));
  g.SetUint32(a + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  g.SetUint32(a + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  g.SetUint32(a + "block_count", static_cast<uint32_t>(c.num_layers));
  g.SetUint32(a + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  g.SetUint32(a + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  g.SetUint32(a + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  g.SetUint32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  g.SetUint32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  g.SetUint32(a + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  g.SetFloat32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  g.SetFloat32(a + "rope.freq_base", static_cast<float>(c.rope_theta));
  g.SetUint32(a + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  g.SetUint32("general.file_type", WeightFormatFileType(format));
  if (c.sliding_window > 0) g.SetUint32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
  if (c.bos_token_id) g.SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*c.bos_token_id));
  if (!c.eos_token_ids.empty()) {
    g.SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_ids[0]));
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    g.SetString(a + "rope.scaling.type", "linear");
    g.SetFloat32(a + "rope.scaling.factor", static_cast<float>(rs.factor));
  }
  if (FileExists(JoinPath(dir, "tokenizer.json"))) {
    if (absl::Status s = WriteGgufTokenizer(dir, /*bos_eos=*/false, &g); !s.ok()) {
      return ReportError(cmd, s);
    }
  }
  auto add_vector = [&](const std::string& name, const std::vector<float>& v) {
    g.AddTensor(name, GgmlType::kF32, {static_cast<int64_t>(v.size())}, Encode(v, GgmlType::kF32));
  };
  if (rs.type == RopeScaling::Type::kLlama3) {
    // llama.cpp's way: each frequency's divisor as an f32 tensor. pdserve reads the parameters
    // themselves (exact), llama.cpp the tensor.
    g.SetString("pdserve.rope.scaling.type", "llama3");
    g.SetFloat32("pdserve.rope.scaling.factor", static_cast<float>(rs.factor));
    g.SetFloat32("pdserve.rope.scaling.low_freq_factor", static_cast<float>(rs.low_freq_factor));
    g.SetFloat32("pdserve.rope.scaling.high_freq_factor", static_cast<float>(rs.high_freq_factor));
    g.SetUint32("pdserve.rope.scaling.original_max_position_embeddings",
                static_cast<uint32_t>(rs.original_max_position));
    std::vector<float> factors;
    const double low = rs.original_max_position / rs.low_freq_factor;
    const double high = rs.original_max_position / rs.high_freq_factor;
    for (int64_t i = 0; i < c.head_dim / 2; ++i) {
      const double freq = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
      const double wavelen = 2 * M_PI / freq;
      double f = 1;
      if (wavelen > low) {
        f = rs.factor;
      } else if (wavelen >= high) {
        const double smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = 1 / ((1 - smooth) / rs.factor + smooth);
      }
      factors.push_back(static_cast<float>(f));
    }
    add_vector("rope_freqs.weight", factors);
  }
  auto add_matrix = [&](const std::string& name, const MatrixRef& m, MatrixRole role,
                        int64_t layer = 0, int64_t permute = 0, bool tied = false) {
    const GgmlType t = MatrixType(format, role, layer, c.num_layers, m.cols, tied);
    g.AddTensor(name, t, {m.cols, m.rows}, Encode(Rows(m, permute), t));
  };
  const int64_t permute = arch == "llama" ? c.head_dim : 0;
  auto permuted = [&](const std::vector<float>& v) {
    std::vector<float> out(v.size());
    for (size_t r = 0; r < v.size(); ++r) {
      out[r] = v[static_cast<size_t>(GgufRowToHf(static_cast<int64_t>(r), c.head_dim))];
    }
    return out;
  };
  const bool tied = w.lm_head().data == w.embed_tokens().data;
  add_matrix("token_embd.weight", w.embed_tokens(), MatrixRole::kEmbedding, 0, 0, tied);
  add_vector("output_norm.weight", w.final_norm());
  if (!tied) add_matrix("output.weight", w.lm_head(), MatrixRole::kHead);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& L = w.layer(i);
    const std::string p = Str("blk.", i, ".");
    add_vector(p + "attn_norm.weight", L.input_norm);
    add_vector(p + "ffn_norm.weight", L.post_attention_norm);
    add_matrix(p + "attn_q.weight", L.q_proj, MatrixRole::kAttnQ, i, permute);
    add_matrix(p + "attn_k.weight", L.k_proj, MatrixRole::kAttnK, i, permute);
    add_matrix(p + "attn_v.weight", L.v_proj, MatrixRole::kAttnV, i);
    add_matrix(p + "attn_output.weight", L.o_proj, MatrixRole::kAttnOutput, i);
    if (!L.q_bias.empty()) {
      add_vector(p + "attn_q.bias", permute > 0 ? permuted(L.q_bias) : L.q_bias);
      add_vector(p + "attn_k.bias", permute > 0 ? permuted(L.k_bias) : L.k_bias);
      add_vector(p + "attn_v.bias", L.v_bias);
    }
    if (!L.o_bias.empty()) add_vector(p + "attn_output.bias", L.o_bias);
    if (!L.q_norm.empty()) {
      add_vector(p + "attn_q_norm.weight", L.q_norm);
      add_vector(p + "attn_k_norm.weight", L.k_norm);
    }
    add_matrix(p + "ffn_gate.weight", L.gate_proj, MatrixRole::kFfnGate, i);
    add_matrix(p + "ffn_up.weight", L.up_proj, MatrixRole::kFfnUp, i);
    add_matrix(p + "ffn_down.weight", L.down_proj, MatrixRole::kFfnDown, i);
    if (!L.gate_bias.empty()) {
      add_vector(p + "ffn_gate.bias", L.gate_bias);
      add_vector(p + "ffn_up.bias", L.up_bias);
      add_vector(p + "ffn_down.bias", L.down_bias);
    }
  }
  if (absl::Status s = g.WriteFile(out); !s.ok()) return ReportError(cmd, s);
  return kExitOk;
}

}  // namespace

int GgufCommand(int argc, char** argv) {
  const char* cmd = "gguf";
  std::string out, tensor, type = "q8_0";
  int64_t max_array = 16;
  bool vocab_only = false;
  FlagSet flags("gguf inspect|dequantize|quantize|convert FILE [OUT]",
                "GGUF files as pdserve reads them: their metadata and tensors, each tensor "
                "dequantized as the kernels see it, a float file quantized to Q8_0, a Hugging Face "
                "checkpoint converted to a GGUF file.");
  flags.String("out", &out, "dequantize: the directory for NAME.npy files");
  flags.String("tensor", &tensor, "dequantize: only this tensor");
  flags.String("type", &type,
               "quantize: the block format (q8_0); convert: f32, f16, bf16, q8_0, q4_k or q4_k_m");
  flags.Int("max-array", &max_array,
            "inspect: arrays longer than this are summarized (those no loader reads hold 16 elements)");
  flags.Bool("vocab-only", &vocab_only, "convert: the tokenizer alone (DIR holds tokenizer.json)");
  flags.AllowPositional(3);
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  const std::vector<std::string>& args = flags.positional();
  const std::string action = args.empty() ? "" : args[0];
  if (action == "inspect" && args.size() == 2) return Inspect(args[1], max_array);
  if (action == "dequantize" && args.size() == 2 && !out.empty()) {
    return Dequantize(args[1], out, tensor);
  }
  if (action == "quantize" && args.size() == 3) return Quantize(args[1], args[2], type);
  if (action == "convert" && args.size() == 3) {
    return vocab_only ? ConvertVocab(args[1], args[2]) : Convert(args[1], args[2], type);
  }
  return ReportError(cmd,
                     absl::InvalidArgumentError(
                         "usage: pdserve gguf inspect FILE | dequantize FILE --out DIR "
                         "[--tensor NAME] | quantize IN OUT --type q8_0 | convert DIR OUT "
                         "--type f32|f16|bf16|q8_0|q4_k|q4_k_m"),
                     kExitUsage);
}

}  // namespace pdserve::cli
