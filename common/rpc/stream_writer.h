// A server-streaming reactor that can be fed from any thread: Push queues a message (written one
// at a time, as the callback API requires; PushOrMerge folds it into a waiting one when the
// stream lags), Close finishes the call after the queued messages.
// Subclasses handle OnCancel/OnDone specifics through the hooks. gRPC deletes nothing: the
// reactor deletes itself in OnDone once `references` reach zero.
#ifndef PDSERVE_COMMON_RPC_STREAM_WRITER_H_
#define PDSERVE_COMMON_RPC_STREAM_WRITER_H_

#include <chrono>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>

#include <grpcpp/support/byte_buffer.h>

#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

namespace pdserve {

// Tests only: a fault's delay from the environment variable `name` (milliseconds; 0 when unset).
inline std::chrono::milliseconds FaultDelayFromEnv(const char* name) {
  const char* v = std::getenv(name);
  return std::chrono::milliseconds(v == nullptr ? 0 : std::atoll(v));
}

template <typename Response>
class StreamWriter : public grpc::ServerWriteReactor<Response> {
 public:
  // Thread-safe. Returns false once the call is finished or cancelled (the message is dropped).
  bool Push(Response message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || done_) return false;
    queue_.push_back(std::move(message));
    MaybeWriteLocked();
    return true;
  }

  // Thread-safe. Like Push, but when the stream lags (a message is still waiting behind the one
  // being written), `merge(waiting, message)` may fold the message into the waiting one and return
  // true; false queues it as Push does. One write then carries what the engine produced meanwhile.
  template <typename Merge>
  bool PushOrMerge(Response message, Merge&& merge) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || done_) return false;
    if (queue_.empty() || !merge(queue_.back(), message)) queue_.push_back(std::move(message));
    MaybeWriteLocked();
    return true;
  }

  // Thread-safe. Finishes after the queued messages; later calls are ignored.
  void Close(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || done_) return;
    closing_ = true;
    final_status_ = status;
    if (!writing_) FinishLocked();
  }

  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closing_ || done_;
  }

 protected:
  // Called once when the client goes away (cancel, deadline, a failed write) before Close.
  virtual void OnClientGone() {}
  // Called once after gRPC is done with the call; the default deletes the reactor.
  virtual void OnFinished() { delete this; }

 private:
  void OnWriteDone(bool ok) override {
    bool gone = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) {
        queue_.clear();
        if (!closing_) {
          // The client went away mid-write; OnCancel may follow, but it will find the call
          // closing, so tell the subclass here (else the work behind the stream runs on).
          closing_ = true;
          gone = true;
          final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed");
        }
      }
      if (!queue_.empty() && ok) {
        MaybeWriteLocked();
      } else if (closing_ && !finished_) {
        FinishLocked();
      }
    }
    if (gone) OnClientGone();
  }

  void OnCancel() override {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = !closing_;
      closing_ = true;
      queue_.clear();
      if (!writing_ && !finished_) {
        final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        FinishLocked();
      }
    }
    if (first) OnClientGone();
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    OnFinished();
  }

  // Tests only: PDSERVE_FAULT_GRPC_DELAY_FINAL_MESSAGE_MS=N writes a stream's message that
  // carries a finish reason N ms late (a stream whose end is still on its way when the server
  // shuts down), so a test holds a call across Shutdown deterministically instead of racing it.
  // Streams that lag behind what feeds them (so that messages wait and fold):
  // PDSERVE_FAULT_GRPC_DELAY_WRITES_MS=N writes every message of a decode worker's streams N ms
  // late, PDSERVE_FAULT_GRPC_DELAY_CLIENT_WRITES_MS=N every message of a router's to its clients.
  // (decode_stream.cc gives a decode worker's GenerateMany messages the first two.)
  static std::chrono::milliseconds FaultDelay(const Response& message) {
    constexpr auto env = FaultDelayFromEnv;
    if constexpr (requires { message.finish_reason().empty(); }) {
      static const std::chrono::milliseconds final_delay = env("PDSERVE_FAULT_GRPC_DELAY_FINAL_MESSAGE_MS");
      static const std::chrono::milliseconds every_delay = env("PDSERVE_FAULT_GRPC_DELAY_WRITES_MS");
      if (!message.finish_reason().empty() && final_delay.count() > 0) return final_delay;
      return every_delay;
    } else if constexpr (std::is_same_v<Response, grpc::ByteBuffer>) {
      static const std::chrono::milliseconds client_delay = env("PDSERVE_FAULT_GRPC_DELAY_CLIENT_WRITES_MS");
      return client_delay;
    }
    return std::chrono::milliseconds(0);
  }

  void MaybeWriteLocked() {
    if (writing_ || queue_.empty()) return;
    writing_ = true;
    current_ = std::move(queue_.front());
    queue_.pop_front();
    if (const std::chrono::milliseconds delay = FaultDelay(current_); delay.count() > 0) {
      // The write counts as in flight meanwhile, so nothing finishes (or deletes) the reactor.
      std::thread([this, delay] {
        std::this_thread::sleep_for(delay);
        std::lock_guard<std::mutex> lock(mu_);
        this->StartWrite(&current_);
      }).detach();
      return;
    }
    this->StartWrite(&current_);
  }

  void FinishLocked() {
    finished_ = true;
    this->Finish(final_status_);
  }

  std::mutex mu_;
  std::deque<Response> queue_;
  Response current_;
  bool writing_ = false;
  bool closing_ = false;
  bool finished_ = false;
  bool done_ = false;
  grpc::Status final_status_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_STREAM_WRITER_H_
