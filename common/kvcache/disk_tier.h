// The `disk` KV tier: blocks as files in a local directory, under a byte budget, least recently
// used first out. A block's file is written whole under a temporary name and renamed into place,
// so a process killed mid-write leaves a temporary file (removed at the next start), never a
// torn block under a block's name; every file carries its key, size and an XXH3-64 checksum of
// its bytes, checked at each load (a file that fails is removed and counted, never used). The
// index (which keys are there, their sizes, their order of use) lives in memory and is rebuilt
// from the directory at start: the tier survives a restart of its worker.
//
// Files: <64 hex digits of the key>.kvb, a 64-byte header (magic, payload bytes, checksum, key)
// then the block's bytes. Thread-safe: the engines of one process (serve's two) share one tier,
// each storing and loading from its own I/O thread; files are read and written outside the lock.
#ifndef PDSERVE_COMMON_KVCACHE_DISK_TIER_H_
#define PDSERVE_COMMON_KVCACHE_DISK_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kvcache/kv_tier.h"

namespace pdserve {

struct DiskTierOptions {
  std::string path;        // The directory (made if missing).
  int64_t budget_bytes = 0;  // At most this many bytes of blocks (headers included).
  std::string flag = "--kv-offload-disk";  // Named in errors.
};

class DiskTier : public KvTier {
 public:
  // InvalidArgument naming the flag when the directory cannot be made or written.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);

  std::string_view name() const override { return "disk"; }
  const char* event_medium() const override { return "DISK"; }
  bool Contains(const KvTierKey& key) const override;
  absl::Status Store(const KvTierKey& key, absl::Span<const uint8_t> block) override;
  absl::Status Load(const KvTierKey& key, absl::Span<uint8_t> out) override;
  KvTierStats Stats() const override;
  std::vector<BlockHash> Held(const BlockHash& model) const override;
  void TakeRemoved(std::vector<KvTierKey>* out) override;

  static constexpr size_t kHeaderBytes = 64;

 private:
  explicit DiskTier(const DiskTierOptions& options) : options_(options) {}
  std::string PathOf(const KvTierKey& key) const;
  // Removes `key` from the index (and its file, when `unlink`). Holds mu_.
  void ForgetLocked(KvTierKey key, bool unlink);  // By value: callers pass lru_'s own entries.
  // Removes the least recently used blocks until `incoming` more bytes fit. Holds mu_.
  void MakeRoomLocked(int64_t incoming);

  struct Entry {
    int64_t bytes = 0;  // The file's.
    std::list<KvTierKey>::iterator lru;
  };
  const DiskTierOptions options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<KvTierKey, Entry> index_;
  std::list<KvTierKey> lru_;  // Oldest first.
  int64_t bytes_ = 0;
  std::deque<KvTierKey> removed_;  // Since the last TakeRemoved (the newest kMaxRemovedKept).
  KvTierStats stats_;
  std::atomic<uint64_t> temp_counter_{0};
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_DISK_TIER_H_
