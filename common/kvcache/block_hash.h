// Chained block hashes: the hash of block i covers its tokens and the hash of block i-1, so equal
// hashes mean equal whole prefixes. Scheme "xxh3-128-chained-v1": 128-bit XXH3 over
// (parent hash, token ids as little-endian int32). 128 bits make an accidental collision (which
// would hand one request another's KV) negligible at any cache size.
#ifndef PDSERVE_COMMON_KVCACHE_BLOCK_HASH_H_
#define PDSERVE_COMMON_KVCACHE_BLOCK_HASH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/types/span.h"

namespace pdserve {

inline constexpr char kBlockHashScheme[] = "xxh3-128-chained-v1";

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const BlockHash& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
  std::string ToHex() const;
};

// Hash of one block given its parent's (the root parent is BlockHash{}).
BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens);

// Appends hashes of the full blocks of `tokens` beyond those already in *hashes (so a growing
// sequence is hashed incrementally). `root` is the first block's parent: BlockHash{} for the base
// model, its adapter's LoraAdapter::kv_root for a request that runs with a LoRA adapter, whose KV
// differs from the base model's for the same tokens.
void ExtendBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size,
                       std::vector<BlockHash>* hashes, const BlockHash& root = BlockHash{});

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_BLOCK_HASH_H_
