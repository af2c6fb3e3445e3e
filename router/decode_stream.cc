#include "router/decode_stream.h"

#include <utility>
#include <vector>

#include "common/base/strings.h"

namespace pdserve {

std::shared_ptr<DecodeStreamClient> DecodeStreamClient::Open(
    internal::v1::DecodeWorker::Stub* stub, std::function<void(const grpc::Status&)> on_end,
    std::function<void(DecodeStreamClient*)> on_done) {
  std::shared_ptr<DecodeStreamClient> stream(new DecodeStreamClient());
  stream->on_end_ = std::move(on_end);
  stream->on_done_ = std::move(on_done);
  stream->self_ = stream;
  stub->async()->GenerateMany(&stream->context_, stream.get());
  stream->StartRead(&stream->response_);
  stream->StartCall();
  return stream;
}

bool DecodeStreamClient::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !retiring_ && !stopped_ && !done_;
}

bool DecodeStreamClient::Begin(std::shared_ptr<DecodeStreamListener> listener,
                               const internal::v1::DecodeRequest& request, const std::string& traceparent,
                               const std::string& tracestate, uint64_t* id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (retiring_ || stopped_ || done_) return false;
  *id = next_id_++;
  listeners_[*id] = std::move(listener);
  internal::v1::DecodeStreamStart* start = pending_.add_starts();
  start->set_id(*id);
  *start->mutable_request() = request;
  start->set_traceparent(traceparent);
  start->set_tracestate(tracestate);
  has_pending_ = true;
  WriteLocked();
  return true;
}

void DecodeStreamClient::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ || !listeners_.contains(id)) return;
  pending_.add_cancels(id);
  has_pending_ = true;
  WriteLocked();
}

void DecodeStreamClient::Abandon(uint64_t id) {
  std::shared_ptr<DecodeStreamListener> forgotten;  // Released outside the lock.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = listeners_.find(id);
  if (done_ || it == listeners_.end()) return;
  forgotten = std::move(it->second);
  listeners_.erase(it);
  pending_.add_cancels(id);
  has_pending_ = true;
  WriteLocked();
}

void DecodeStreamClient::Retire() {
  std::lock_guard<std::mutex> lock(mu_);
  retiring_ = true;
  WriteLocked();
}

void DecodeStreamClient::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || done_) return;
    stopped_ = true;
  }
  context_.TryCancel();
}

// Under mu_: the next write, or the close once a retired stream has nothing left to say.
void DecodeStreamClient::WriteLocked() {
  if (writing_ || closed_ || stopped_ || done_) return;
  if (has_pending_) {
    current_.Swap(&pending_);
    pending_.Clear();
    has_pending_ = false;
    writing_ = true;
    StartWrite(&current_);
  } else if (retiring_ && listeners_.empty()) {
    closed_ = true;
    StartWritesDone();
  }
}

void DecodeStreamClient::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) return;  // The stream is broken: OnDone follows.
  WriteLocked();
}

void DecodeStreamClient::OnReadDone(bool ok) {
  if (!ok) return;  // The stream ended: OnDone follows.
  bool emptied = false;
  for (const internal::v1::DecodeStreamItem& item : response_.items()) {
    std::shared_ptr<DecodeStreamListener> listener;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = listeners_.find(item.id());
      if (it == listeners_.end()) continue;  // Abandoned.
      listener = it->second;
      if (item.end()) {
        listeners_.erase(it);
        emptied = listeners_.empty();
      }
    }
    listener->OnItem(item);
  }
  if (emptied) {
    std::lock_guard<std::mutex> lock(mu_);
    if (retiring_) WriteLocked();
  }
  StartRead(&response_);
}

void DecodeStreamClient::OnDone(const grpc::Status& status) {
  absl::flat_hash_map<uint64_t, std::shared_ptr<DecodeStreamListener>> left;
  bool stopped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    stopped = stopped_;
    left.swap(listeners_);
  }
  // The requests still running hear why: a worker from before GenerateMany as such (the router
  // falls back to a stream a request), this router's own stop as CANCELLED, anything else as
  // UNAVAILABLE (the request may continue on another worker).
  if (on_end_) on_end_(status);
  grpc::Status end = status;
  if (stopped) {
    end = grpc::Status(grpc::StatusCode::CANCELLED, "the router is stopping");
  } else if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
    end = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       Str("the decode stream ended (", status.ok() ? "OK" : status.error_message(), ")"));
  }
  for (auto& [id, listener] : left) listener->OnStreamEnd(end);
  left.clear();
  if (on_done_) on_done_(this);
  std::shared_ptr<DecodeStreamClient> self = std::move(self_);  // May delete this on return.
}

}  // namespace pdserve
