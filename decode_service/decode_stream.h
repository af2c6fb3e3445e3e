// GenerateMany on a decode worker: the requests a router sends on one stream (worker.proto).
// Every request's outputs of a scheduler pass go out together, in one message while the stream
// keeps up (DecodeSink::Flush), and a stream behind the engine gets what piled up meanwhile in
// its next message: the cost a step, not a token a request. Each request ends with exactly one
// item that says so (its finish, its error, or CANCELLED for the router's cancel). The router
// closing its side, or going away, cancels what it left running.
#ifndef PDSERVE_DECODE_SERVICE_DECODE_STREAM_H_
#define PDSERVE_DECODE_SERVICE_DECODE_STREAM_H_

#include <grpcpp/support/server_callback.h>

#include <memory>
#include <mutex>
#include <vector>

#include "decode_service/decode_worker.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

class DecodeStreamOutbox;

// A worker's GenerateMany calls. A router keeps its stream open while it runs, so the worker
// ends them when it stops: Close, after its drain, before its server's Shutdown (which would
// otherwise wait out its deadline for calls that never end by themselves). Thread-safe.
class DecodeStreams {
 public:
  explicit DecodeStreams(DecodeWorker* worker) : worker_(worker) {}
  // The reactor for one GenerateMany call (it deletes itself when done).
  grpc::ServerBidiReactor<internal::v1::DecodeStreamRequest, internal::v1::DecodeStreamResponse>* Start(
      grpc::CallbackServerContext* context);
  // Each call finishes once its requests ended and what they produced is written; starts that
  // arrive meanwhile, or on calls opened later, end UNAVAILABLE (the router resumes them elsewhere).
  void Close();

 private:
  DecodeWorker* const worker_;
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::weak_ptr<DecodeStreamOutbox>> outboxes_;
};

}  // namespace pdserve

#endif  // PDSERVE_DECODE_SERVICE_DECODE_STREAM_H_
