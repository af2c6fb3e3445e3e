// The shared KV tier (kv_tier.h): prefix blocks in Redis, so a prefix any worker computed is
// loaded by any other (`--kv-store redis://HOST:PORT[,HOST:PORT...]`). Keys are sharded by block
// hash across the listed servers (each a standalone Redis; the client picks the shard, so the
// servers need not know each other). Redis enforces the size and age policy (maxmemory and an
// LRU policy, README); a block is written once (SET NX) and never changed.
//
// A stored value is a header (magic, key, payload size, XXH3-64 of the payload, and with a key
// file an HMAC-SHA256 of all that under the key) followed by the block's bytes. A load checks
// every field, so a store that others can write (or a stale one of another model) cannot make a
// worker use KV it did not ask for: a block that fails is a miss, counted, deleted, never used.
//
// Remote: what the store holds is not known here, so the engine asks it at admission (one
// pipelined round trip per shard for a request's blocks, on its I/O thread; each GETRANGE reads
// at most a block's bytes, whatever size another writer left under the name). Contains says only
// what this process stored or loaded (to skip storing a block twice).
//
// Client: hiredis (Debian's 0.14, which has no TLS: `rediss://` runs it over redis_tls.h's bridge).
// One connection per server, used under a mutex; a broken one is reconnected on the next call,
// one that cannot be is tried again a second later (calls meanwhile miss at once). Every call is
// bounded by `timeout_ms`.
#ifndef PDSERVE_COMMON_KVCACHE_REDIS_TIER_H_
#define PDSERVE_COMMON_KVCACHE_REDIS_TIER_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/kvcache/kv_tier.h"
#include "common/kvcache/redis_tls.h"

struct redisContext;

namespace pdserve {

struct RedisTierOptions {
  std::vector<std::string> servers;  // "HOST:PORT" each.
  std::string user;                  // ACL user; empty: AUTH with the password alone.
  std::string password;              // Empty: no AUTH.
  std::string hmac_key;              // Empty: no HMAC.
  int timeout_ms = 1000;             // Connect and every command.
  // Redis Cluster (`redis+cluster://`): `servers` are seeds; the masters and the hash slots each
  // serves come from CLUSTER SLOTS, and a block goes to the master of its key's slot (refreshed
  // after a MOVED or ASK reply, at most once a second).
  bool cluster = false;
  // `rediss://`: every connection is TLS (the server's certificate verified, redis_tls.h).
  bool tls = false;
  RedisTlsOptions tls_options;
};

// Parses `redis://HOST:PORT[,HOST:PORT...]` or `redis+cluster://HOST:PORT[,...]` (`--kv-store`),
// or either over TLS (`rediss://`, `rediss+cluster://`), into options.servers (and
// options.cluster, options.tls).
absl::Status ParseRedisUrl(std::string_view url, RedisTierOptions* options);
// Reads `--kv-store-password-file`: "PASSWORD" or "USER:PASSWORD" (one line; a trailing newline
// is dropped).
absl::Status ReadRedisPasswordFile(const std::string& path, RedisTierOptions* options);

class RedisTier : public KvTier {
 public:
  static constexpr size_t kHeaderBytes = 96;
  // Replies a load keeps outstanding at most (a window of a run's GETs).
  static constexpr size_t kPipelineBytes = size_t{8} << 20;

  // Connects to every server (AUTH, PING). A server that refuses the connection's AUTH or PING
  // is an error naming it; one out of reach is logged and tried again every second (calls miss
  // meanwhile), so a worker starts before its store does.
  static absl::StatusOr<std::unique_ptr<RedisTier>> Open(const RedisTierOptions& options);
  ~RedisTier() override;

  std::string_view name() const override { return "redis"; }
  const char* event_medium() const override { return "STORE"; }
  bool remote() const override { return true; }
  bool Contains(const KvTierKey& key) const override;
  absl::Status Store(const KvTierKey& key, absl::Span<const uint8_t> block) override;
  absl::Status Load(const KvTierKey& key, absl::Span<uint8_t> out) override;
  int64_t LoadRun(absl::Span<const KvTierKey> keys, size_t block_bytes,
                  absl::FunctionRef<void(size_t, absl::Span<const uint8_t>)> use) override;
  KvTierStats Stats() const override;

  // The Redis key of a block: "pdkv:" + the model key and block hash in hex.
  static std::string RedisKey(const KvTierKey& key);
  // Redis Cluster's hash slot of a key (CRC16-XMODEM of the key, or of its {hash tag}, mod 16384).
  static uint16_t KeySlot(std::string_view key);

 private:
  explicit RedisTier(const RedisTierOptions& options);
  size_t Shard(const KvTierKey& key) const;
  // Redis Cluster: the masters and their slots from CLUSTER SLOTS asked of any node it reaches
  // (connections to masters that stay are kept). At most once a second unless `force`. io_mu_ held.
  void RefreshSlotsLocked(bool force);
  // The shard's connection, (re)connected: null when it cannot be (errors_ counted).
  redisContext* Connection(size_t shard);
  void Drop(size_t shard);  // After an I/O error: reconnect on the next call.
  absl::Status Connect(size_t shard);
  // A connection to `server` ("HOST:PORT", TLS with tls_), its timeout set and AUTH done; null
  // with *status Unavailable (out of reach) or FailedPrecondition (it refused us), naming it.
  redisContext* OpenConnection(const std::string& server, absl::Status* status);
  // Header + payload's check; false: not this block.
  bool Check(const KvTierKey& key, std::string_view value, size_t block_bytes) const;
  std::string Value(const KvTierKey& key, absl::Span<const uint8_t> block) const;
  void RememberLocked(const KvTierKey& key);  // mu_ held.
  void CountError();

  const RedisTierOptions options_;
  std::unique_ptr<RedisTls> tls_;  // With options_.tls.
  // Held across a call's round trips (Store, LoadRun): the servers and their connections.
  std::mutex io_mu_;
  std::vector<std::string> servers_;  // options_.servers; with a cluster, its masters.
  std::vector<redisContext*> conns_;
  std::vector<uint16_t> slot_node_;  // Redis Cluster: slot -> index in servers_ (empty: unknown).
  bool refresh_slots_ = false;       // A MOVED or ASK reply: the map is stale.
  std::chrono::steady_clock::time_point next_refresh_{};
  std::vector<std::chrono::steady_clock::time_point> retry_after_;  // Per server, after a failed connect.
  // Held briefly, never across the network: what Contains and Stats read from the scheduler
  // thread, which must not wait for another thread's round trip. Taken after io_mu_, not before.
  mutable std::mutex mu_;
  absl::flat_hash_set<KvTierKey> known_;
  KvTierStats stats_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_REDIS_TIER_H_
