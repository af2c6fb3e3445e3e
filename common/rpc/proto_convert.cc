#include "common/rpc/proto_convert.h"

#include <xxhash.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/kvcache/block_hash.h"
#include "common/model/gguf_model.h"

namespace pdserve {

internal::v1::KvLayout MakeKvLayout(const LLMEngine& engine, const std::string& fingerprint) {
  internal::v1::KvLayout l;
  const KvCacheSpec& spec = engine.kv_spec();
  l.set_model_fingerprint(fingerprint);
  l.set_block_size(static_cast<int32_t>(spec.block_size));
  l.set_kv_dtype(std::string(KvDTypeName(spec.dtype)));
  l.set_num_layers(static_cast<int32_t>(spec.num_layers));
  l.set_num_kv_heads(static_cast<int32_t>(spec.num_kv_heads));
  l.set_head_dim(static_cast<int32_t>(spec.head_dim));
  // Quantized pages end with their rows' f32 scales (KvCacheSpec::PageBytes).
  l.set_layout(KvDTypeQuantized(spec.dtype) ? "layer,block,kv,head,slot,dim+scale_f32:kv,head,slot"
                                            : "layer,block,kv,head,slot,dim");
  l.set_hash_scheme(kBlockHashScheme);
  l.set_device(engine.device());
  return l;
}

std::string LayoutString(const internal::v1::KvLayout& l) {
  return Str("model_fingerprint=", l.model_fingerprint(), ";block_size=", l.block_size(),
             ";kv_dtype=", l.kv_dtype(), ";num_layers=", l.num_layers(),
             ";num_kv_heads=", l.num_kv_heads(), ";head_dim=", l.head_dim(),
             ";layout=", l.layout(), ";hash_scheme=", l.hash_scheme(), ";device=", l.device());
}

absl::StatusOr<std::string> ModelFingerprint(const std::string& model_path) {
  PD_ASSIGN_OR_RETURN(const ModelConfig c, LoadModelConfig(model_path));
  const RopeScaling& rs = c.rope_scaling;
  std::string canonical =
      Str(ModelFamilyName(c.family), "|", c.vocab_size, "|", c.hidden_size, "|",
          c.intermediate_size, "|", c.num_layers, "|", c.num_heads, "|", c.num_kv_heads, "|",
          // As floats: a GGUF file stores them in f32, and the kernels compute with the float.
          c.head_dim, "|", absl::StrFormat("%a|%a", static_cast<float>(c.rms_norm_eps),
                                           static_cast<float>(c.rope_theta)), "|",
          static_cast<int>(rs.type), "|",
          absl::StrFormat("%a|%a|%a", static_cast<float>(rs.factor),
                          static_cast<float>(rs.low_freq_factor),
                          static_cast<float>(rs.high_freq_factor)), "|",
          rs.original_max_position, "|", c.tie_word_embeddings, c.qkv_bias, c.o_bias, c.mlp_bias,
          c.qk_norm, "|", c.sliding_window);
  for (float f : rs.freq_factors) canonical += absl::StrFormat("|%a", f);
  return absl::StrFormat("%016x", XXH64(canonical.data(), canonical.size(), 0));
}

void FillTopLogprobs(const TokenOutput& t, v1::TokenLogprobs* out) {
  for (const auto& [id, logprob] : t.top_logprobs) {
    v1::TopLogprob* top = out->add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
}

}  // namespace pdserve
