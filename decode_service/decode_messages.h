// The decode worker's requests and outputs as its gRPC calls carry them (Generate and
// GenerateMany share these).
#ifndef PDSERVE_DECODE_SERVICE_DECODE_MESSAGES_H_
#define PDSERVE_DECODE_SERVICE_DECODE_MESSAGES_H_

#include <string>

#include "decode_service/decode_worker.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

// The job for a request, under the router's W3C trace context (empty: none).
DecodeJob ToDecodeJob(const internal::v1::DecodeRequest& request, std::string traceparent,
                      std::string tracestate);

// One step's output; the finish reason and usage on the last.
void ToDecodeResponse(const RequestOutput& output, internal::v1::DecodeResponse* out);

}  // namespace pdserve

#endif  // PDSERVE_DECODE_SERVICE_DECODE_MESSAGES_H_
