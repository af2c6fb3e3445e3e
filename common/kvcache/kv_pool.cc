#include "common/kvcache/kv_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "common/base/strings.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvCacheSpec& spec,
                                                       int64_t num_blocks, bool reserve) {
  if (spec.dtype == KvDType::kInt4 && spec.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        Str("kv cache dtype int4 packs two elements per byte: head_dim ", spec.head_dim,
            " is odd (use int8, bf16 or f32)"));
  }
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(Str("kv cache needs at least one block, got ", num_blocks));
  }
  const size_t bytes = spec.BlockBytes() * static_cast<size_t>(num_blocks);
  std::unique_ptr<KvPool> pool(new KvPool(spec, num_blocks, bytes));
  if (reserve) {
    // Huge pages: a page's first write faults once per 2 MiB of a layer's pages instead of once
    // per 4 KiB (at batch 1 a new block's first row took ~1.5% of a decode step in faults,
    // bench/RESULTS.md), and attention's reads, a KV head's rows 4 KiB apart, miss the TLB less.
    if (absl::Status s = pool->arena_.Reserve(bytes); !s.ok()) {
      return absl::ResourceExhaustedError(
          Str("cannot map the KV cache (", num_blocks, " blocks): ", s.message()));
    }
    pool->data_ = static_cast<uint8_t*>(pool->arena_.Take(bytes));
    return pool;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(Str("cannot map ", bytes, " bytes for the KV cache (",
                                            num_blocks, " blocks): ", std::strerror(errno)));
  }
  pool->data_ = static_cast<uint8_t*>(p);
  pool->mapped_ = true;
  return pool;
}

KvPool::~KvPool() {
  if (mapped_) ::munmap(data_, bytes_);
}

}  // namespace pdserve
