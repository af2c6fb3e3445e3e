#include "common/kvcache/block_hash.h"

#define XXH_STATIC_LINKING_ONLY  // For XXH3_state_t on the stack.
#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"

namespace pdserve {

std::string BlockHash::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  uint8_t head[16];
  std::memcpy(head, &parent.lo, 8);
  std::memcpy(head + 8, &parent.hi, 8);
  XXH3_128bits_update(&state, head, sizeof(head));
  // x86-64 and aarch64 are little-endian, so the ids' bytes are already in the scheme's order.
  XXH3_128bits_update(&state, tokens.data(), tokens.size() * sizeof(int32_t));
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

void ExtendBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size,
                       std::vector<BlockHash>* hashes) {
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_size;
  for (int64_t b = static_cast<int64_t>(hashes->size()); b < full; ++b) {
    const BlockHash parent = b == 0 ? BlockHash{} : (*hashes)[b - 1];
    hashes->push_back(HashBlock(parent, tokens.subspan(b * block_size, block_size)));
  }
}

}  // namespace pdserve
