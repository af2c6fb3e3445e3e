#include "common/kvcache/block_hash.h"

#define XXH_STATIC_LINKING_ONLY  // For XXH3_state_t on the stack.
#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"

namespace pdserve {

std::string BlockHash::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens) {
  // The hashed bytes are the parent's 16 (lo, then hi) followed by the token ids' (x86-64 and
  // aarch64 are little-endian, so the ids' bytes are already in the scheme's order). A block of
  // up to 64 tokens is hashed in one call over a copy on the stack: the same bytes, so the same
  // hash as the streaming API, which costs several times more on an 80-byte input (it was 5% of
  // a decode-heavy simulation).
  constexpr size_t kHead = 16;
  const size_t body = tokens.size() * sizeof(int32_t);
  XXH128_hash_t h;
  if (body <= 64 * sizeof(int32_t)) {
    alignas(16) uint8_t bytes[kHead + 64 * sizeof(int32_t)];
    std::memcpy(bytes, &parent.lo, 8);
    std::memcpy(bytes + 8, &parent.hi, 8);
    if (body > 0) std::memcpy(bytes + kHead, tokens.data(), body);
    h = XXH3_128bits(bytes, kHead + body);
  } else {
    XXH3_state_t state;
    XXH3_128bits_reset(&state);
    uint8_t head[kHead];
    std::memcpy(head, &parent.lo, 8);
    std::memcpy(head + 8, &parent.hi, 8);
    XXH3_128bits_update(&state, head, sizeof(head));
    XXH3_128bits_update(&state, tokens.data(), body);
    h = XXH3_128bits_digest(&state);
  }
  return BlockHash{h.low64, h.high64};
}

void ExtendBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size,
                       std::vector<BlockHash>* hashes, const BlockHash& root) {
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_size;
  for (int64_t b = static_cast<int64_t>(hashes->size()); b < full; ++b) {
    const BlockHash parent = b == 0 ? root : (*hashes)[b - 1];
    hashes->push_back(HashBlock(parent, tokens.subspan(b * block_size, block_size)));
  }
}

}  // namespace pdserve
