#include "decode_service/decode_stream.h"

#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/base/strings.h"
#include "common/rpc/stream_writer.h"
#include "decode_service/decode_messages.h"

namespace pdserve {
namespace {

using Request = internal::v1::DecodeStreamRequest;
using Response = internal::v1::DecodeStreamResponse;

// A message takes no more items past this size (the next one starts): far below the channels'
// message limit however far a router falls behind.
constexpr size_t kMaxMessageBytes = size_t{1} << 20;

class Session;

}  // namespace

// What the stream's requests produced and not yet written, and which of them run. Shared by the
// reactor and its requests' sinks, which the worker may call after gRPC is done with the call.
class DecodeStreamOutbox : public std::enable_shared_from_this<DecodeStreamOutbox> {
 public:
  explicit DecodeStreamOutbox(Session* session) : session_(session) {}

  // A request started on the stream. Cancelled: the router is gone (nothing to run it for);
  // Unavailable: the worker closed its streams (the request is answered so); InvalidArgument:
  // the id runs already (the router broke the protocol: both end, see OnReadDone).
  absl::Status Add(uint64_t id, const std::string& request_id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_) return absl::CancelledError("the router went away");
    if (closing_) {
      AppendEndLocked(id, grpc::StatusCode::UNAVAILABLE, "decode worker is shutting down");
      WriteLocked();
      return absl::UnavailableError("decode worker is shutting down");
    }
    if (!live_.emplace(id, request_id).second) return absl::InvalidArgumentError("id runs already");
    return absl::OkStatus();
  }
  // DecodeStreams::Close: the call finishes once nothing runs and everything is written.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    MaybeFinishLocked();
  }
  // A step's output of request `id` (ending it when finished); written at the next Flush.
  void Output(uint64_t id, const RequestOutput& output);
  // Ends request `id` with `code` (and writes at once: errors and cancels are not per step).
  // Returns its request id, empty when it had ended already.
  std::string End(uint64_t id, grpc::StatusCode code, absl::string_view message);
  void Flush() {
    std::lock_guard<std::mutex> lock(mu_);
    WriteLocked();
  }
  // The router closed its side: the requests still running are cancelled (their ids returned),
  // and the call finishes after what is queued.
  std::vector<std::string> ReadsDone();
  // The router went away (a cancelled call, a failed write): nothing more is written.
  std::vector<std::string> Gone();
  void WriteDone(bool ok);
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    session_ = nullptr;
  }

 private:
  internal::v1::DecodeStreamItem* AppendLocked();
  void AppendEndLocked(uint64_t id, grpc::StatusCode code, absl::string_view message);
  void WriteLocked();
  void MaybeFinishLocked();
  std::vector<std::string> TakeLiveLocked() {
    std::vector<std::string> ids;
    for (auto& [id, request_id] : live_) ids.push_back(std::move(request_id));
    live_.clear();
    return ids;
  }

  std::mutex mu_;
  Session* session_;  // Null once gRPC is done with the call.
  absl::flat_hash_map<uint64_t, std::string> live_;  // Running requests: id -> request id.
  std::deque<Response> queue_;  // Not yet written; the last one takes new items.
  size_t back_bytes_ = 0;      // Of queue_.back().
  Response current_;           // Being written.
  bool writing_ = false;
  bool reads_done_ = false;
  bool closing_ = false;
  bool gone_ = false;
  bool finished_ = false;
};

namespace {

using Outbox = DecodeStreamOutbox;

class ItemSink : public DecodeSink {
 public:
  ItemSink(std::shared_ptr<Outbox> outbox, uint64_t id) : outbox_(std::move(outbox)), id_(id) {}
  void OnOutput(const RequestOutput& output) override { outbox_->Output(id_, output); }
  void OnError(const absl::Status& status) override {
    outbox_->End(id_, static_cast<grpc::StatusCode>(status.code()), status.message());
  }
  void Flush() override { outbox_->Flush(); }

 private:
  const std::shared_ptr<Outbox> outbox_;
  const uint64_t id_;
};

class Session : public grpc::ServerBidiReactor<Request, Response> {
 public:
  Session(DecodeWorker* worker, std::shared_ptr<Outbox>* outbox) : worker_(worker) {
    outbox_ = std::make_shared<Outbox>(this);
    *outbox = outbox_;
    // Tests only: PDSERVE_FAULT_NO_GENERATE_MANY=1 answers as a worker from before GenerateMany
    // (UNIMPLEMENTED), for the router's fallback to a stream a request.
    static const bool refuse = std::getenv("PDSERVE_FAULT_NO_GENERATE_MANY") != nullptr;
    if (refuse) {
      outbox_->Detach();
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GenerateMany: not served (fault injected)"));
      return;
    }
    StartRead(&request_);
  }

  // Under the outbox's lock.
  void Write(const Response* message) { StartWrite(message); }
  void End(const grpc::Status& status) { Finish(status); }

 private:
  void OnReadDone(bool ok) override {
    if (!ok) {
      for (const std::string& id : outbox_->ReadsDone()) worker_->Cancel(id);
      return;
    }
    for (internal::v1::DecodeStreamStart& start : *request_.mutable_starts()) {
      const absl::Status added = outbox_->Add(start.id(), start.request().request_id());
      if (!added.ok() && !absl::IsInvalidArgument(added)) continue;  // Gone, or answered.
      if (!added.ok()) {
        // An id already running: the request under it ends too, so that neither side keeps one
        // the other has forgotten.
        const std::string running = outbox_->End(
            start.id(), grpc::StatusCode::INVALID_ARGUMENT,
            Str("GenerateMany: id ", start.id(), " was started while a request with it runs"));
        if (!running.empty()) worker_->Cancel(running);
        continue;
      }
      // Not under the outbox's lock: a worker that refuses ends the request before Submit returns.
      worker_->Submit(ToDecodeJob(start.request(), std::move(*start.mutable_traceparent()),
                                  std::move(*start.mutable_tracestate())),
                      std::make_shared<ItemSink>(outbox_, start.id()));
    }
    for (uint64_t id : request_.cancels()) {
      const std::string request_id = outbox_->End(id, grpc::StatusCode::CANCELLED, "cancelled");
      if (!request_id.empty()) worker_->Cancel(request_id);
    }
    StartRead(&request_);
  }
  void OnWriteDone(bool ok) override { outbox_->WriteDone(ok); }
  void OnCancel() override {
    for (const std::string& id : outbox_->Gone()) worker_->Cancel(id);
  }
  void OnDone() override {
    outbox_->Detach();
    delete this;
  }

  DecodeWorker* const worker_;
  std::shared_ptr<Outbox> outbox_;
  Request request_;
};

}  // namespace

void Outbox::AppendEndLocked(uint64_t id, grpc::StatusCode code, absl::string_view message) {
  internal::v1::DecodeStreamItem* item = AppendLocked();
  item->set_id(id);
  item->set_end(true);
  item->set_status_code(code);
  item->set_status_message(std::string(message));
  back_bytes_ += item->ByteSizeLong();
}

internal::v1::DecodeStreamItem* Outbox::AppendLocked() {
  if (queue_.empty() || back_bytes_ >= kMaxMessageBytes) {
    queue_.emplace_back();
    back_bytes_ = 0;
  }
  return queue_.back().add_items();
}

void Outbox::Output(uint64_t id, const RequestOutput& output) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;  // Cancelled meanwhile: its end went out.
  internal::v1::DecodeStreamItem* item = AppendLocked();
  item->set_id(id);
  ToDecodeResponse(output, item->mutable_response());
  if (output.finished) {
    item->set_end(true);
    live_.erase(it);
  }
  back_bytes_ += item->ByteSizeLong();
}

std::string Outbox::End(uint64_t id, grpc::StatusCode code, absl::string_view message) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return "";
  std::string request_id = std::move(it->second);
  live_.erase(it);
  AppendEndLocked(id, code, message);
  WriteLocked();
  MaybeFinishLocked();
  return request_id;
}

std::vector<std::string> Outbox::ReadsDone() {
  std::lock_guard<std::mutex> lock(mu_);
  reads_done_ = true;
  std::vector<std::string> left = TakeLiveLocked();  // Before: the call finishes once none runs.
  MaybeFinishLocked();
  return left;
}

std::vector<std::string> Outbox::Gone() {
  std::lock_guard<std::mutex> lock(mu_);
  gone_ = true;
  queue_.clear();
  MaybeFinishLocked();
  return TakeLiveLocked();
}

void Outbox::WriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) {  // The router went away mid-write; OnCancel cancels what runs.
    gone_ = true;
    queue_.clear();
  }
  WriteLocked();
  MaybeFinishLocked();
}

// Tests only, as a Generate stream's (stream_writer.h): PDSERVE_FAULT_GRPC_DELAY_WRITES_MS=N
// writes every message N ms late, PDSERVE_FAULT_GRPC_DELAY_FINAL_MESSAGE_MS=N a message that ends
// a request with its finish reason (a lagging stream; a stream still writing at shutdown).
std::chrono::milliseconds FaultDelay(const internal::v1::DecodeStreamResponse& message) {
  static const std::chrono::milliseconds every = FaultDelayFromEnv("PDSERVE_FAULT_GRPC_DELAY_WRITES_MS");
  static const std::chrono::milliseconds final = FaultDelayFromEnv("PDSERVE_FAULT_GRPC_DELAY_FINAL_MESSAGE_MS");
  if (final.count() > 0) {
    for (const internal::v1::DecodeStreamItem& item : message.items()) {
      if (!item.response().finish_reason().empty()) return final;
    }
  }
  return every;
}

void Outbox::WriteLocked() {
  if (writing_ || gone_ || finished_ || session_ == nullptr || queue_.empty()) return;
  current_ = std::move(queue_.front());
  queue_.pop_front();
  if (queue_.empty()) back_bytes_ = 0;
  writing_ = true;
  if (const std::chrono::milliseconds delay = FaultDelay(current_); delay.count() > 0) {
    // The write counts as in flight meanwhile, so nothing finishes the call.
    std::thread([self = shared_from_this(), delay] {
      std::this_thread::sleep_for(delay);
      std::lock_guard<std::mutex> lock(self->mu_);
      if (self->session_ != nullptr) {
        self->session_->Write(&self->current_);
      } else {
        self->writing_ = false;
      }
    }).detach();
    return;
  }
  session_->Write(&current_);
}

void Outbox::MaybeFinishLocked() {
  if (finished_ || writing_ || session_ == nullptr) return;
  if (gone_) {
    finished_ = true;
    session_->End(grpc::Status(grpc::StatusCode::CANCELLED, "the router went away"));
  } else if ((reads_done_ || closing_) && live_.empty() && queue_.empty()) {
    finished_ = true;
    session_->End(grpc::Status::OK);
  }
}

grpc::ServerBidiReactor<internal::v1::DecodeStreamRequest, internal::v1::DecodeStreamResponse>*
DecodeStreams::Start(grpc::CallbackServerContext* context) {
  std::shared_ptr<Outbox> outbox;
  auto* session = new Session(worker_, &outbox);
  bool closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed = closed_;
    std::erase_if(outboxes_, [](const std::weak_ptr<Outbox>& o) { return o.expired(); });
    outboxes_.push_back(outbox);
  }
  if (closed) outbox->Close();
  return session;
}

void DecodeStreams::Close() {
  std::vector<std::shared_ptr<Outbox>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (const std::weak_ptr<Outbox>& o : outboxes_) {
      if (auto outbox = o.lock()) open.push_back(std::move(outbox));
    }
  }
  for (const std::shared_ptr<Outbox>& outbox : open) outbox->Close();
}

}  // namespace pdserve
