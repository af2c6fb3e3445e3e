// Streams a worker's load and prefix-cache events to the routers watching it (WatchLoad).
//
// The scheduler thread calls Publish after each step with the WorkerInfo snapshot and the KV
// events the engine logged. The publisher numbers the events, keeps the recent ones, mirrors the
// set of reusable block hashes, and every `interval` sends each watcher what it has not seen: the
// new events, or a snapshot when it subscribed from 0 or from an event no longer kept. A report
// also goes out at least every second as a heartbeat.
//
// Thread-safe.
#ifndef PDSERVE_COMMON_RPC_LOAD_PUBLISHER_H_
#define PDSERVE_COMMON_RPC_LOAD_PUBLISHER_H_

#include <chrono>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <grpcpp/support/server_callback.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/kvcache/block_manager.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

class LoadPublisher {
 public:
  explicit LoadPublisher(std::chrono::milliseconds interval = std::chrono::milliseconds(20),
                         size_t max_kept_events = 1 << 16);
  ~LoadPublisher();

  void Publish(const internal::v1::WorkerInfo& info, const std::vector<KvEvent>& events);
  // A reactor for a WatchLoad call; it streams until the router goes away or Shutdown.
  grpc::ServerWriteReactor<internal::v1::LoadReport>* Watch(
      const internal::v1::WatchLoadRequest& request);
  // Ends every watch (the worker is shutting down).
  void Shutdown();

  class Watcher;

 private:
  friend class Watcher;
  void Loop();
  void Remove(Watcher* w);
  // Fills `report` for a watcher that applied events up to *applied; advances it.
  bool BuildReport(uint64_t* applied, bool force, internal::v1::LoadReport* report);

  const std::chrono::milliseconds interval_;
  const size_t max_kept_events_;
  std::mutex mu_;
  internal::v1::WorkerInfo info_;
  uint64_t last_seq_ = 0;                             // Of the newest event.
  std::deque<std::pair<uint64_t, KvEvent>> recent_;   // Oldest first.
  absl::flat_hash_set<BlockHash> indexed_;
  absl::flat_hash_set<BlockHash> tier_indexed_;  // Its own KV cache tiers' (not a shared store's).
  // The blocks it wrote to a shared store lately (the newest kMaxStoreHashes), for snapshots: a
  // router that subscribes (or resyncs) after they were written still hears of them.
  static constexpr size_t kMaxStoreHashes = size_t{1} << 14;
  absl::flat_hash_set<BlockHash> store_written_;
  std::deque<BlockHash> store_order_;  // Oldest first.
  absl::flat_hash_map<Watcher*, uint64_t> watchers_;  // -> last event sequence sent.
  bool stop_ = false;
  std::thread thread_;
};

std::string EncodeBlockHash(const BlockHash& h);
bool DecodeBlockHash(const std::string& bytes, BlockHash* h);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_LOAD_PUBLISHER_H_
