// Publishes a worker's KV cache events (stored and evicted prefix blocks) on a ZeroMQ PUB socket
// in vLLM's format, so that the routers of the ecosystem (llm-d's precise prefix-cache scorer,
// Dynamo's KV router) can index pdserve workers as they index vLLM ones.
//
// The wire, as vLLM's ZmqEventPublisher: each batch is a three-frame message [topic, sequence
// number (8 bytes, big-endian, from 0), msgpack payload (kv_event_batch.h)]. A worker's first
// batch (sequence 0) is an AllBlocksCleared: a consumer that sees the sequence start again knows
// the worker restarted with an empty cache. With a replay endpoint, a ROUTER socket answers a
// request [8-byte big-endian start sequence] with a [sequence, payload] message for each batch
// kept when it asked (the last `buffer_steps`) from there on, then [-1 as 8 bytes, empty]. Every
// kept batch is delivered, however many: a replay goes on as the consumer reads (its pipe's
// high-water mark is flow control, not a limit), up to 16 at once; a consumer that reads
// nothing for 60 s, or a request past the 16th, gets a logged warning (and the latter the end
// marker at once) rather than silence.
//
// Late joiners: ZeroMQ's PUB socket sends only to subscribers already connected and subscribed,
// so one that connects after a batch went out never sees it on the PUB socket, sequence 0 (the
// AllBlocksCleared that says "this worker started empty") included, even if it was started
// before the worker (its connection completes after the worker binds). A consumer therefore
// replays from the first sequence it has not seen: from 0 when the first message it hears has a
// sequence above 0, which recovers the AllBlocksCleared while the worker keeps it (until
// `buffer_steps` more batches have gone).
//
// Publish is called by the worker's scheduler thread after each step and never blocks: a
// background thread encodes and sends. Past `max_queue` batches waiting (a thread that cannot
// keep up), batches are dropped and counted; their sequence numbers are never assigned, so a
// consumer cannot see the gap: the drop is logged.
#ifndef PDSERVE_COMMON_KVEVENTS_KV_EVENT_PUBLISHER_H_
#define PDSERVE_COMMON_KVEVENTS_KV_EVENT_PUBLISHER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcache/block_manager.h"

namespace pdserve {

struct KvEventsOptions {
  std::string publisher = "none";          // none or zmq.
  std::string endpoint = "tcp://*:5557";   // Bound when it has a wildcard (*, ::), else connected.
  std::string replay_endpoint;             // Bound; empty: no replay socket.
  std::string topic;                       // vLLM's default: empty.
  int64_t buffer_steps = 10000;            // Batches kept for replay.
  int hwm = 100000;                        // The PUB socket's send high-water mark.
  int64_t max_queue = 100000;              // Batches waiting for the sender.
  int64_t block_size = 16;
  std::string medium = "CPU";              // "GPU" for the cuda backend.
};

// Checks the options that need no socket (the publisher name, sizes). The flags' names appear in
// the messages.
absl::Status ValidateKvEventsOptions(const KvEventsOptions& options);

class KvEventPublisher {
 public:
  // Null when options.publisher is "none".
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(const KvEventsOptions& options);
  ~KvEventPublisher();

  // The events of one step (drained from the BlockManager); empty ones send nothing.
  void Publish(const std::vector<KvEvent>& events);

  // Where the sockets are (a bound wildcard port resolved), for the ready line.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  int64_t dropped() const { return dropped_.load(); }

 private:
  struct Pending {
    double ts;
    std::vector<KvEvent> events;
    bool cleared;  // An AllBlocksCleared batch.
  };
  explicit KvEventPublisher(const KvEventsOptions& options) : options_(options) {}
  void Loop();
  void Send(const Pending& batch);
  void ServeReplay();
  void ContinueReplays();

  const KvEventsOptions options_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::string endpoint_, replay_endpoint_;

  std::mutex mu_;
  std::deque<Pending> queue_;
  bool stop_ = false;
  std::atomic<int64_t> dropped_{0};

  // The sender thread's own.
  static constexpr size_t kMaxReplays = 16;
  static constexpr std::chrono::seconds kReplayDeadline{60};
  struct Replay {
    std::string identity;  // The consumer's ROUTER identity.
    std::vector<std::pair<uint64_t, std::shared_ptr<const std::string>>> batches;
    size_t next = 0;  // The next batch to send; batches.size(): the end marker.
    std::chrono::steady_clock::time_point deadline;
  };
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> kept_;
  std::vector<Replay> replays_;
  int64_t replays_refused_ = 0, replays_abandoned_ = 0;
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVEVENTS_KV_EVENT_PUBLISHER_H_
