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
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (reserve ? 0 : MAP_NORESERVE), -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(Str("cannot map ", bytes, " bytes for the KV cache (",
                                            num_blocks, " blocks): ", std::strerror(errno)));
  }
  return std::unique_ptr<KvPool>(new KvPool(spec, num_blocks, static_cast<uint8_t*>(p), bytes));
}

KvPool::~KvPool() { ::munmap(data_, bytes_); }

}  // namespace pdserve
