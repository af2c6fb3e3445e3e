// The router's end of a decode worker's GenerateMany stream (worker.proto): the requests this
// router runs there share one stream, and a message from the worker carries every one's output
// of an engine step (issue 62: a message a token a request cost the router most of its CPU).
//
// Each request registers a listener with Begin. Its items arrive on the stream's reader, in
// order, the last one marked `end`; Cancel asks the worker to end it, which it answers with an
// item ending CANCELLED. When the stream itself breaks (the worker died or shut down, the
// connection dropped), every listener still running hears OnStreamEnd once: UNAVAILABLE, or
// CANCELLED when this router stopped the stream, or UNIMPLEMENTED from a worker without
// GenerateMany. Thread-safe.
#ifndef PDSERVE_ROUTER_DECODE_STREAM_H_
#define PDSERVE_ROUTER_DECODE_STREAM_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/client_callback.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve {

class DecodeStreamListener {
 public:
  virtual ~DecodeStreamListener() = default;
  // On the stream's reader, one at a time; the request's last item has end set.
  virtual void OnItem(const internal::v1::DecodeStreamItem& item) = 0;
  // The stream broke before the request's last item (no item follows).
  virtual void OnStreamEnd(const grpc::Status& status) = 0;
};

class DecodeStreamClient
    : public grpc::ClientBidiReactor<internal::v1::DecodeStreamRequest, internal::v1::DecodeStreamResponse> {
 public:
  // Opens the stream on `stub`. When gRPC is done with it, `on_end` runs with its final status
  // before the listeners hear of it, and `on_done` (given this stream) after.
  static std::shared_ptr<DecodeStreamClient> Open(internal::v1::DecodeWorker::Stub* stub,
                                                  std::function<void(const grpc::Status&)> on_end,
                                                  std::function<void(DecodeStreamClient*)> on_done);

  // Starts `request` on the worker under the trace context given. False (nothing sent, the
  // listener never called) when the stream is closing or over. The id goes to Cancel.
  bool Begin(std::shared_ptr<DecodeStreamListener> listener, const internal::v1::DecodeRequest& request,
             const std::string& traceparent, const std::string& tracestate, uint64_t* id);
  // Asks the worker to end request `id` (its end item follows, or OnStreamEnd).
  void Cancel(uint64_t id);
  // Forgets request `id` (its listener hears nothing more, but for an item being delivered) and
  // asks the worker to end it. For a request that ends on its own (its deadline passed).
  void Abandon(uint64_t id);
  // No Begin after this; the stream closes when its last request ends (a worker that left).
  void Retire();
  // Ends the stream now (the router stops): its requests hear CANCELLED.
  void Stop();
  // Takes Begins.
  bool open() const;

 private:
  DecodeStreamClient() = default;
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override {}
  void OnDone(const grpc::Status& status) override;
  void WriteLocked();

  grpc::ClientContext context_;
  internal::v1::DecodeStreamResponse response_;  // The reader's.
  std::function<void(const grpc::Status&)> on_end_;
  std::function<void(DecodeStreamClient*)> on_done_;
  std::shared_ptr<DecodeStreamClient> self_;  // Held while gRPC runs the call.

  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<DecodeStreamListener>> listeners_;
  uint64_t next_id_ = 1;
  internal::v1::DecodeStreamRequest pending_, current_;  // To write; being written.
  bool has_pending_ = false;
  bool writing_ = false;
  bool retiring_ = false;
  bool closed_ = false;   // WritesDone sent.
  bool stopped_ = false;  // Stop called.
  bool done_ = false;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_DECODE_STREAM_H_
