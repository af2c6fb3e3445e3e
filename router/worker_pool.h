// One tier's workers as the router sees them: membership (static list or DNS, applied with
// SetAddresses), a WatchLoad stream per worker keeping its block counts, queue and the set of
// prefix-block hashes it can reuse, and the choice of a worker for a prompt.
//
// Events carry sequence numbers: a gap makes the router resubscribe for a snapshot. A worker whose
// block size or hash scheme differs from the router's is refused (logged, counted, never chosen).
// A worker that stops reporting for `stale_after` is left out until it reports again. In
// approximate mode (or for a worker that has not reported events yet) the router predicts a
// worker's cache from its own decisions, each prompt's blocks remembered for `approx_ttl`; with
// events, its decisions of the last `event_grace` count too.
//
// Thread-safe.
#ifndef PDSERVE_ROUTER_WORKER_POOL_H_
#define PDSERVE_ROUTER_WORKER_POOL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "common/kvcache/block_hash.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "router/routing_policy.h"

namespace pdserve {

// The arithmetic of every worker a router's pools have seen (WorkerInfo::numerics), shared by
// them: a worker whose outputs' bits would differ from the first one's is logged once.
class NumericsWatch {
 public:
  // False (and a warning the first time for this address) when `numerics` is not the first seen.
  bool Check(const std::string& address, const std::string& numerics);
  int64_t mixed() const;  // Workers that differed.

 private:
  mutable std::mutex mu_;
  std::string first_, first_address_;
  std::vector<std::string> warned_;
};

// The blocks the workers wrote to a shared KV store (LoadReport::store_stored), shared by a
// router's two pools: any worker with the store can load them. The store evicts without telling,
// so this is a hint kept for the last `capacity` blocks heard of.
class SharedStoreIndex {
 public:
  explicit SharedStoreIndex(size_t capacity = size_t{1} << 20) : capacity_(capacity) {}
  void Insert(const BlockHash& h);
  bool Contains(const BlockHash& h) const;
  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  absl::flat_hash_set<BlockHash> set_;
  std::deque<BlockHash> order_;  // Oldest first.
};

struct WorkerPoolOptions {
  bool prefill_tier = false;
  int64_t block_size = 16;
  std::string kv_dtype = "f32";  // KvDTypeName of the workers' pools; others are refused.
  std::string model_fingerprint;  // Workers serving another model are refused.
  bool use_events = true;  // false: approximate mode for every worker.
  std::chrono::milliseconds approx_ttl{120000};
  // With events, the router's own recent decisions still count for this long: a worker's events
  // for a prompt come only after it ran, and a burst of one group should not scatter meanwhile.
  std::chrono::milliseconds event_grace{2000};
  std::chrono::milliseconds recent_half_life{2000};  // Of WorkerCandidate::recent_blocks.
  std::chrono::milliseconds stale_after{5000};
  std::chrono::milliseconds reconnect_every{500};
  // For the channels to the workers (mutual TLS); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Channels to use for these addresses instead of connecting to them (`serve`: gRPC's
  // in-process channels to its own workers, no sockets or HTTP/2 framing between them).
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels;
  std::shared_ptr<NumericsWatch> numerics;  // Shared by a router's two pools; null: not watched.
  std::shared_ptr<SharedStoreIndex> store;  // Shared by a router's two pools; null: none kept.
};

class DecodeStreamClient;

class WorkerPool {
 public:
  struct Worker;
  struct Pick {
    std::shared_ptr<Worker> worker;
    int64_t cached_prefix_blocks = 0;
    int64_t tier_prefix_blocks = 0;  // The blocks after those that its KV cache tiers hold.
    bool fell_back = false;
  };
  struct WorkerStats {
    std::string address;
    bool healthy = false;
    bool refused = false;
    int64_t decisions = 0;
    int64_t inflight = 0;
    internal::v1::WorkerInfo info;
  };

  explicit WorkerPool(const WorkerPoolOptions& options);
  ~WorkerPool();
  // Ends the load watches and starts no call to a worker after it returns. Idempotent.
  void Stop();

  // Joins new addresses, drops vanished ones (their in-flight requests keep their channel).
  void SetAddresses(const std::vector<std::string>& addresses);
  // The worker for a prompt whose full blocks hash to `prompt_hashes` (prompt_blocks counts the
  // partial last block too), never one of `exclude`; nullopt when no worker is usable.
  // `lora_name`: only workers that serve that LoRA adapter (empty: any).
  std::optional<Pick> Choose(const RoutingOptions& options,
                             absl::Span<const BlockHash> prompt_hashes, int64_t prompt_blocks,
                             absl::Span<const Worker* const> exclude = {},
                             std::string_view lora_name = {});
  // Whether a usable worker serves the LoRA adapter `name`.
  bool ServesLora(std::string_view name) const;
  // The KV root (LoraAdapter::kv_root) a usable worker reports for the adapter `name`: its
  // requests' block hashes start from it. nullopt when none serves it.
  std::optional<BlockHash> LoraKvRoot(std::string_view name) const;
  // The usable workers with their latest load reports.
  std::vector<std::pair<std::shared_ptr<Worker>, internal::v1::WorkerInfo>> UsableWorkers() const;
  // A runtime adapter change the worker confirmed: applied to its view now, and laid over its
  // reports for `event_grace` (a report sent before the change may still arrive).
  void NoteLoraChange(const std::shared_ptr<Worker>& w, const internal::v1::LoraAdapterChange& change,
                      bool added);
  // The worker's report with that adapter added or removed.
  static void ApplyLoraChange(const internal::v1::LoraAdapterChange& change, bool added,
                              internal::v1::WorkerInfo* info);
  static const internal::v1::LoraAdapterState* LoraState(const internal::v1::WorkerInfo& info,
                                                         std::string_view name);
  // The LoRA adapters its usable workers serve, each once, in the order first seen.
  std::vector<v1::LoraAdapterInfo> LoraAdapters() const;
  // The request routed by Choose has ended.
  void Done(const std::shared_ptr<Worker>& worker);
  // True when every usable worker has at least `waiting` requests queued.
  bool Saturated(int64_t waiting) const;
  size_t usable() const;
  std::vector<WorkerStats> Stats() const;
  int64_t refusals() const { return refusals_.load(); }
  // Blocks until every listed worker has reported once or refused, or `timeout` passes.
  bool WaitForReports(std::chrono::milliseconds timeout) const;

  // The decode worker's shared stream (decode_stream.h), opened when none is open; null when the
  // pool stops, or the worker predates GenerateMany (its stream ended UNIMPLEMENTED).
  std::shared_ptr<DecodeStreamClient> DecodeStream(const std::shared_ptr<Worker>& w);

  // Stub of the worker's service (the pool's tier decides which one is set).
  static internal::v1::DecodeWorker::Stub* DecodeStub(const Worker& w);
  static internal::v1::PrefillWorker::Stub* PrefillStub(const Worker& w);  // Null in a decode pool.
  static const std::string& Address(const Worker& w);

 private:
  static bool HasLora(const internal::v1::WorkerInfo& info, std::string_view name);
  // WorkerCandidate::lora_load for the adapter `name` on `w` (its report and this router's
  // recent decisions).
  int LoraLoadCost(const Worker& w, std::string_view name, std::chrono::steady_clock::time_point now) const;
  class Watch;
  friend class Watch;
  void Apply(const std::shared_ptr<Worker>& w, const internal::v1::LoadReport& report);
  void WatchEnded(const std::shared_ptr<Worker>& w, Watch* watch);
  void StartWatch(const std::shared_ptr<Worker>& w);
  void Maintain();

  const WorkerPoolOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  absl::flat_hash_map<std::string, std::shared_ptr<Worker>> workers_;
  std::vector<std::shared_ptr<Worker>> order_;  // Stable order for round-robin and ties.
  std::atomic<uint64_t> round_robin_{0};
  std::atomic<int64_t> refusals_{0};
  uint64_t rng_state_ = 0x9e3779b97f4a7c15ull;
  int live_watches_ = 0;
  absl::flat_hash_set<DecodeStreamClient*> streams_;  // Those gRPC still runs; Stop stops them.
  bool stop_ = false;
  std::thread maintainer_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_WORKER_POOL_H_
