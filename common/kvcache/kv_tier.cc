#include "common/kvcache/kv_tier.h"

#include <vector>

namespace pdserve {

int64_t KvTier::LoadRun(absl::Span<const KvTierKey> keys, size_t block_bytes,
                        absl::FunctionRef<void(size_t, absl::Span<const uint8_t>)> use) {
  std::vector<uint8_t> scratch(block_bytes);
  int64_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i, ++n) {
    if (!Load(keys[i], absl::MakeSpan(scratch)).ok()) break;
    use(i, scratch);
  }
  return n;
}

}  // namespace pdserve
