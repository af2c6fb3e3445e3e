// A tier process's life (prefill, decode, router, serve): the stop signal, the ready line, the
// drain and the exit. A stop signal (SIGTERM, SIGINT) before the ready line ends the process at
// once, exit 0 (nothing was serving: a router waiting for its workers, a worker loading its
// model); after it, the signal wakes the command's main thread, which drains.
#ifndef PDSERVE_CLI_TIER_LIFETIME_H_
#define PDSERVE_CLI_TIER_LIFETIME_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "common/rpc/server_builder.h"

namespace pdserve::cli {

// Started by each tier command before it loads anything.
void StartStopWatcher(const char* cmd);
// Prints the ready line; from then on a stop signal drains instead of exiting.
void Ready(const std::string& line);
// Blocks the command's main thread until a stop signal after Ready.
void WaitForStopSignal();

// Ends a tier process after its orderly shutdown: requests drained, servers shut down (every
// call finished or cancelled). Nothing is destroyed after that: gRPC 1.51's callback threads are
// still releasing the servers' completion queues when Shutdown returns, and freeing channels or
// servers meanwhile corrupted the heap (double free in grpc_cq_internal_unref, ~1 in 3 `serve`
// exits after a request that failed validation; and earlier SIGABRT from exit handlers). Nothing
// is left to clean up, so leave at once.
[[noreturn]] void ExitAfterShutdown(int code);

// After a drain, how long Shutdown lets calls finish writing what they have queued: a worker's
// Drain returns when the engine is done, while its stream reactors may still hold the drained
// requests' last tokens. Calls that are done end it at once; 1 s was too short on a loaded
// machine (the call was cancelled and a drained stream lost its last tokens, once in CI).
constexpr std::chrono::seconds kFlushCalls{10};

// A bad --metrics-* flag is a usage error; an address that cannot be bound is not.
int ReportFlagError(const char* cmd, const absl::Status& s);

// From the stop signal on, the gRPC health service answers NOT_SERVING, so readiness probes (a
// Kubernetes Service stops sending new connections) and health-checking clients see the drain.
void MarkNotServing(const StartedServer& server);

// --drain-seconds as the whole seconds a drain waits.
std::chrono::seconds DrainGrace(double seconds);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_TIER_LIFETIME_H_
