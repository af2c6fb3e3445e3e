// pdserve kv-calc: the KV cache memory math for any config.json (GQA-aware).
#include <cmath>
#include <initializer_list>
#include <cstdio>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/dtype.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/model/gguf.h"
#include "common/model/gguf_model.h"
#include "common/model/model_config.h"
#include "common/model/weight_format.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {

int KvCalcCommand(int argc, char** argv) {
  const char* cmd = "kv-calc";
  std::string model, config_path, kv_dtype, format = "text";
  int64_t seq_len = 0, batch = 1, block_size = 16;
  double memory_gib = 0;
  FlagSet flags("kv-calc", "Prints KV cache bytes per token and what fits in a memory budget.");
  flags.String("model", &model, "model directory (reads its config.json)");
  flags.String("config", &config_path, "a config.json file");
  flags.Int("seq-len", &seq_len, "tokens per sequence (0: max_position_embeddings)");
  flags.Int("batch", &batch, "sequences");
  flags.String("kv-dtype", &kv_dtype, "f32, bf16, f16, int8 or int4 (default: the model's dtype)");
  flags.Double("memory-gib", &memory_gib, "KV memory budget in GiB (0: skip the fit)");
  flags.Int("block-size", &block_size, "block size (memory holds whole blocks)");
  flags.String("format", &format, "text or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (model.empty() == config_path.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("give exactly one of --model or --config"),
                       kExitUsage);
  }
  if (format != "text" && format != "json") {
    return ReportError(cmd, absl::InvalidArgumentError("--format: text or json"), kExitUsage);
  }
  if (batch < 1 || seq_len < 0 || !(memory_gib >= 0) || block_size < 1) {
    return ReportError(cmd, absl::InvalidArgumentError(
                                "--batch and --block-size must be positive, --seq-len and "
                                "--memory-gib non-negative"),
                       kExitUsage);
  }
  constexpr double kMaxMemoryGib = 1 << 20;  // 1 PiB.
  if (memory_gib > kMaxMemoryGib) {
    return ReportError(cmd, absl::InvalidArgumentError(Str("--memory-gib: at most ", kMaxMemoryGib)),
                       kExitUsage);
  }
  auto config = config_path.empty() ? LoadModelConfig(model) : ModelConfig::FromFile(config_path);
  if (!config.ok()) return ReportError(cmd, config.status());
  const ModelConfig& c = *config;
  if (kv_dtype.empty()) {
    kv_dtype = c.torch_dtype == "float32" ? "f32" : c.torch_dtype == "float16" ? "f16" : "bf16";
  }
  // Bits per element, and per (token, layer, K|V, kv head) row the bytes of its scale: the
  // pool's formats (KvCacheSpec), plus f16 for planning other engines' caches.
  int64_t bits = 0, row_scale = 0;
  if (kv_dtype == "f16") {
    bits = 16;
  } else if (const absl::StatusOr<KvDType> d = ParseKvDType(kv_dtype); d.ok()) {
    bits = KvDTypeBits(*d);
    row_scale = KvDTypeQuantized(*d) ? 4 : 0;
  } else {
    return ReportError(cmd, absl::InvalidArgumentError(Str(
                                "--kv-dtype: '", kv_dtype, "' is not f32, bf16, f16, int8 or int4")),
                       kExitUsage);
  }
  if (c.head_dim * bits % 8 != 0) {
    return ReportError(cmd, absl::InvalidArgumentError(Str("--kv-dtype ", kv_dtype, ": head_dim ",
                                                           c.head_dim, " is odd")),
                       kExitUsage);
  }
  if (seq_len == 0) seq_len = c.max_position_embeddings;
  // Every product is checked: --batch and --seq-len are the user's, and a total past 2^63 bytes
  // is a usage error naming them, not a negative number.
  std::string overflow;
  auto mul = [&overflow](std::initializer_list<int64_t> factors, const char* what) {
    int64_t out = 1;
    for (int64_t f : factors) {
      if (overflow.empty() && __builtin_mul_overflow(out, f, &out)) overflow = what;
    }
    return out;
  };
  // K and V, every layer, every KV head (not attention head: GQA/MQA shrink this); int8 and
  // int4 rows carry an f32 scale each (per token, layer, K|V and kv head).
  const int64_t rows_per_token = mul({2, c.num_layers, c.num_kv_heads}, "rows per token");
  const int64_t row_bytes = mul({c.head_dim, bits}, "row bits") / 8;
  const int64_t bytes_per_token = mul({rows_per_token, row_bytes + row_scale}, "bytes per token");
  const int64_t tokens = mul({batch, seq_len}, "--batch x --seq-len");
  const int64_t total_bytes = mul({tokens, bytes_per_token}, "--batch x --seq-len x bytes per token");
  const int64_t total_scale_bytes = mul({tokens, rows_per_token, row_scale}, "scale bytes");
  mul({block_size, bytes_per_token}, "--block-size x bytes per token");
  if (!overflow.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError(Str(overflow, " exceeds 2^63 bytes")),
                       kExitUsage);
  }
  // Weight memory per format: the model's matrices (embeddings and output counted once each, as
  // NumParameters does) at each format's bits per weight (blocks' scales included), and a GGUF
  // file's own tensors as they are.
  const double params = static_cast<double>(c.NumParameters());
  const std::pair<const char*, double> kFormats[] = {
      {"f32", 32}, {"bf16", 16}, {"q8_0", 8.5}, {"q6_k", 6.5625}, {"q5_k", 5.5}, {"q4_k", 4.5},
      {"q4_0", 4.5}};
  nlohmann::ordered_json weight_bytes = nlohmann::ordered_json::object();
  for (const auto& [name, bits_per_weight] : kFormats) {
    weight_bytes[name] = static_cast<int64_t>(params * bits_per_weight / 8);
  }
  {  // Q4_K_M: each matrix in llama-quantize's type for it (weight_format.h), the rest f32.
    auto bytes = [&](MatrixRole role, int64_t layer, int64_t rows, int64_t cols, bool tied = false) {
      const GgmlType t = MatrixType(WeightFormat::kQ4_K_M, role, layer, c.num_layers, cols, tied);
      return static_cast<double>(rows) * static_cast<double>(GgmlRowBytes(t, cols));
    };
    const int64_t h = c.hidden_size;
    double total = bytes(MatrixRole::kEmbedding, 0, c.vocab_size, h, c.tie_word_embeddings);
    if (!c.tie_word_embeddings) total += bytes(MatrixRole::kHead, 0, c.vocab_size, h);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      total += bytes(MatrixRole::kAttnQ, i, c.q_size(), h) + bytes(MatrixRole::kAttnK, i, c.kv_size(), h) +
               bytes(MatrixRole::kAttnV, i, c.kv_size(), h) +
               bytes(MatrixRole::kAttnOutput, i, h, c.q_size()) +
               bytes(MatrixRole::kFfnGate, i, c.intermediate_size, h) +
               bytes(MatrixRole::kFfnUp, i, c.intermediate_size, h) +
               bytes(MatrixRole::kFfnDown, i, h, c.intermediate_size) + 2.0 * h * 4;
      // The vectors stay f32: biases and q/k norms.
      total += 4.0 * ((c.qkv_bias ? c.q_size() + 2 * c.kv_size() : 0) + (c.o_bias ? h : 0) +
                      (c.mlp_bias ? 2 * c.intermediate_size + h : 0) + (c.qk_norm ? 2 * c.head_dim : 0));
    }
    weight_bytes["q4_k_m"] = static_cast<int64_t>(total + h * 4);
  }
  nlohmann::json file_bytes = nullptr;
  if (config_path.empty() && IsGgufPath(model)) {
    auto g = GgufFile::Open(model);
    if (!g.ok()) return ReportError(cmd, g.status());
    int64_t sum = 0;
    for (const GgufTensor& t : (*g)->tensors()) sum += static_cast<int64_t>(t.bytes);
    file_bytes = sum;
  }
  nlohmann::json max_tokens = nullptr, max_sequences = nullptr;
  if (memory_gib > 0) {
    const double budget = memory_gib * static_cast<double>(1ull << 30);
    // Whole blocks, as the pool allocates them.
    const double per_block = static_cast<double>(block_size * bytes_per_token);
    const int64_t fit = static_cast<int64_t>(std::floor(budget / per_block)) * block_size;
    max_tokens = fit;
    max_sequences = fit / seq_len;
  }
  if (format == "json") {
    nlohmann::ordered_json j;
    j["architecture"] = c.architecture;
    j["num_layers"] = c.num_layers;
    j["num_kv_heads"] = c.num_kv_heads;
    j["head_dim"] = c.head_dim;
    j["kv_dtype"] = kv_dtype;
    j["seq_len"] = seq_len;
    j["batch"] = batch;
    j["bytes_per_token"] = bytes_per_token;
    j["total_bytes"] = total_bytes;
    j["scale_bytes"] = total_scale_bytes;
    j["max_tokens"] = max_tokens;
    j["max_sequences"] = max_sequences;
    j["weight_bytes"] = weight_bytes;
    j["weight_bytes_of_file"] = file_bytes;
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("%s: %lld layers x %lld KV heads x 2 (K,V) x (head_dim %lld x %lld bits%s) (%s)\n",
              c.architecture.c_str(), static_cast<long long>(c.num_layers),
              static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(bits), row_scale > 0 ? " + an f32 scale" : "",
              kv_dtype.c_str());
  std::printf("bytes per token:   %lld (%.1f KiB)%s\n", static_cast<long long>(bytes_per_token),
              bytes_per_token / 1024.0,
              c.num_kv_heads < c.num_heads
                  ? Str(" -- GQA saves ", c.num_heads / c.num_kv_heads, "x").c_str()
                  : "");
  std::printf("batch %lld x %lld tokens: %lld bytes (%.2f GiB)\n", static_cast<long long>(batch),
              static_cast<long long>(seq_len), static_cast<long long>(total_bytes),
              total_bytes / static_cast<double>(1ull << 30));
  if (total_scale_bytes > 0) {
    std::printf("of which scales:   %lld bytes\n", static_cast<long long>(total_scale_bytes));
  }
  std::printf("weights:          ");
  for (const auto& [name, bytes] : weight_bytes.items()) {
    std::printf(" %s %.2f GiB", name.c_str(), bytes.get<int64_t>() / static_cast<double>(1ull << 30));
  }
  std::printf("\n");
  if (!file_bytes.is_null()) {
    std::printf("this file's tensors: %.2f GiB\n",
                file_bytes.get<int64_t>() / static_cast<double>(1ull << 30));
  }
  if (memory_gib > 0) {
    std::printf("%.2f GiB holds:     %lld tokens = %lld sequences of %lld\n", memory_gib,
                static_cast<long long>(max_tokens.get<int64_t>()),
                static_cast<long long>(max_sequences.get<int64_t>()),
                static_cast<long long>(seq_len));
  }
  return kExitOk;
}

}  // namespace pdserve::cli
