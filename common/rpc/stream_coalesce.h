// Folding a lagging stream's messages into one (issue 62): a decode worker's stream to the
// router, and with --stream-interval above 1 a router's stream to its client. Only messages not yet
// written are folded, so what a reader receives is the same tokens in the same order, fewer
// messages.
#ifndef PDSERVE_COMMON_RPC_STREAM_COALESCE_H_
#define PDSERVE_COMMON_RPC_STREAM_COALESCE_H_

#include <vector>

#include "pdserve/internal/v1/worker.pb.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

// A message takes no more folding once it carries this many tokens (the next one queues): it
// stays far below the gRPC message limit, and re-serializing a client's waiting message at each
// fold costs a bounded amount however long the client lags.
inline constexpr int kMaxFoldedTokens = 256;

// Appends `next` to `waiting` (the decode worker's message still queued) and records each one's
// token count in step_tokens. False, changing nothing, when `waiting` ends the stream or is full.
bool CoalesceDecodeResponse(internal::v1::DecodeResponse& waiting,
                            const internal::v1::DecodeResponse& next);

// The messages folded into `folded`, one an engine step, in order (the finish reason and usage on
// the last); `folded` itself when it was not folded or its step_tokens do not add up.
std::vector<internal::v1::DecodeResponse> SplitDecodeResponse(const internal::v1::DecodeResponse& folded);

// Appends `next` to `waiting` (the router's message to its client): tokens, logprobs and text;
// the finish reason and usage when `next` has them. False, changing nothing, when `waiting` ends
// the stream or is full.
bool CoalesceGenerateResponse(v1::GenerateResponse& waiting, const v1::GenerateResponse& next);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_STREAM_COALESCE_H_
