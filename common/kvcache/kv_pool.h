// The memory of a worker's KV cache: num_blocks blocks of every layer, laid out
// [layer][block][K|V][kv_head][slot][head_dim], so one (layer, block) page is contiguous and can
// be sent to another worker as soon as its layer is computed.
//
// Host memory from an anonymous mapping (zero pages until touched), on transparent huge pages
// where the kernel has them. Thread-safety: the pool is a plain buffer; who may write which page
// is decided by the BlockManager's owner.
#ifndef PDSERVE_COMMON_KVCACHE_KV_POOL_H_
#define PDSERVE_COMMON_KVCACHE_KV_POOL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/base/huge_page_arena.h"
#include "common/kvcache/kv_cache_spec.h"

namespace pdserve {

class KvPool {
 public:
  // ResourceExhausted when the memory cannot be mapped. `reserve` false: the mapping is only the
  // pool's address space (MAP_NORESERVE), for a runner that keeps the pages in its own device
  // memory and never touches these.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvCacheSpec& spec,
                                                        int64_t num_blocks, bool reserve = true);
  // How many blocks fit in `bytes`.
  static int64_t BlocksForBytes(const KvCacheSpec& spec, size_t bytes) {
    return static_cast<int64_t>(bytes / spec.BlockBytes());
  }
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvCacheSpec& spec() const { return spec_; }
  int64_t num_blocks() const { return num_blocks_; }
  size_t size_bytes() const { return bytes_; }
  uint8_t* data() { return data_; }
  // First byte of layer `layer`'s pages; page of block b is at LayerBase(layer) + b * PageBytes().
  uint8_t* LayerBase(int64_t layer) {
    return data_ + static_cast<size_t>(layer * num_blocks_) * spec_.PageBytes();
  }
  size_t PageOffset(int64_t layer, int64_t block) const {
    return static_cast<size_t>(layer * num_blocks_ + block) * spec_.PageBytes();
  }

 private:
  KvPool(const KvCacheSpec& spec, int64_t num_blocks, size_t bytes)
      : spec_(spec), num_blocks_(num_blocks), bytes_(bytes) {}
  KvCacheSpec spec_;
  int64_t num_blocks_;
  uint8_t* data_ = nullptr;
  size_t bytes_;
  HugePageArena arena_;  // The memory, unless `reserve` was false.
  bool mapped_ = false;  // data_ is a MAP_NORESERVE mapping of its own (reserve false).
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_KV_POOL_H_
