// GenerateMany on a decode worker: the requests a router sends on one stream (worker.proto).
// Every request's outputs of a scheduler pass go out together, in one message while the stream
// keeps up (DecodeSink::Flush), and a stream behind the engine gets what piled up meanwhile in
// its next message: the cost a step, not a token a request. Each request ends with exactly one
// item that says so (its finish, its error, or CANCELLED for the router's cancel). The router
// closing its side, or going away, cancels what it left running.
#ifndef PDSERVE_DECODE_SERVICE_DECODE_STREAM_H_
#define PDSERVE_DECODE_SERVICE_DECODE_STREAM_H_

#include <grpcpp/support/server_callback.h>

#include "decode_service/decode_worker.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

// The reactor for one GenerateMany call (it deletes itself when done).
grpc::ServerBidiReactor<internal::v1::DecodeStreamRequest, internal::v1::DecodeStreamResponse>*
StartDecodeStream(DecodeWorker* worker, grpc::CallbackServerContext* context);

}  // namespace pdserve

#endif  // PDSERVE_DECODE_SERVICE_DECODE_STREAM_H_
