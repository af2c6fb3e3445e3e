// One public Generate call: validates and tokenizes through the Router, streams from a decode
// worker (a DecodeAttempt), and relays tokens with their text (streaming detokenizer, stop
// strings) to the client.
//
// Resumption: when the decode stream breaks before the request finished (the worker died,
// drained, or the connection dropped) and the client is still there, the call continues on
// another decode worker, sending the prompt plus the tokens the client already has; that worker
// recomputes them and generates the rest, equal to an uninterrupted run (the seeded sampler is
// keyed by output position). At most RouterOptions::max_resumes times per request.
#ifndef PDSERVE_ROUTER_GENERATE_CALL_H_
#define PDSERVE_ROUTER_GENERATE_CALL_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "router/router.h"

namespace pdserve {

// The reactor for one Generate call (it deletes itself when done).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartGenerateCall(Router* router,
                                                              grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer& request);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_GENERATE_CALL_H_
