#include "common/rpc/proto_convert.h"

#include <xxhash.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/kvcache/block_hash.h"

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

absl::StatusOr<std::string> ModelFingerprint(const std::string& model_dir) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  PD_ASSIGN_OR_RETURN(std::string config, ReadFileToString(JoinPath(model_dir, "config.json")));
  XXH64_update(state, config.data(), config.size());
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(model_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  for (const std::string& name : files) {
    std::ifstream in(JoinPath(model_dir, name), std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    if (!in || header_len > (100u << 20)) continue;
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    XXH64_update(state, name.data(), name.size());
    XXH64_update(state, header.data(), header.size());
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return absl::StrFormat("%016x", h);
}

void FillTopLogprobs(const TokenOutput& t, v1::TokenLogprobs* out) {
  for (const auto& [id, logprob] : t.top_logprobs) {
    v1::TopLogprob* top = out->add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
}

}  // namespace pdserve
