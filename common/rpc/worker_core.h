// What every worker process is built from, shared by the prefill and decode tiers: the engine,
// the KV transport with the engine's pool registered, the KV layout both ends must agree on, the
// command queue of the scheduler thread, and the WorkerInfo snapshot.
#ifndef PDSERVE_COMMON_RPC_WORKER_CORE_H_
#define PDSERVE_COMMON_RPC_WORKER_CORE_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/llm_engine.h"
#include "common/transport/kv_transport.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

struct WorkerCore {
  std::unique_ptr<LLMEngine> engine;
  std::unique_ptr<KvTransport> transport;
  internal::v1::KvLayout layout;
  std::string layout_string;  // The transport handshake's form of `layout`.

  static absl::StatusOr<WorkerCore> Create(const std::string& model_dir,
                                           const EngineOptions& engine,
                                           const std::string& transport,
                                           KvTransportOptions transport_options = {});
};

struct TransferCounters {
  int64_t completed = 0;
  int64_t failures = 0;
  int64_t pages = 0;
  int64_t bytes = 0;
};

// Block counts, queue lengths and transfer counters (`waiting_extra` adds requests the engine
// does not see, e.g. remote prefills in flight). Call on the scheduler thread.
internal::v1::WorkerInfo MakeWorkerInfo(const std::string& role, const WorkerCore& core,
                                        const TransferCounters& transfers, int64_t waiting_extra);

// The scheduler thread's inbox. Thread-safe.
class CommandQueue {
 public:
  void Post(std::function<void()> command);
  // Posts `command` and waits until the scheduler thread has run it, or `timeout` (a stopped
  // thread): false then.
  bool Run(std::function<void()> command, std::chrono::milliseconds timeout);
  // Returns the commands posted so far. When there are none and `busy` is false, waits for one,
  // for Stop, or for `poll` (when positive). `stopped` is set once Stop was called.
  std::deque<std::function<void()>> Take(bool busy, std::chrono::milliseconds poll, bool* stopped);
  void Stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> commands_;
  bool stop_ = false;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_WORKER_CORE_H_
