// --kv-events-* for the worker commands: the prefix cache's events in vLLM's format on ZeroMQ.
#ifndef PDSERVE_CLI_KV_EVENTS_FLAGS_H_
#define PDSERVE_CLI_KV_EVENTS_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "common/kvevents/kv_event_publisher.h"

namespace pdserve::cli {

struct KvEventsFlags {
  KvEventsOptions options;

  void Register(FlagSet& flags);
  // The checks that need no socket (before the model loads).
  absl::Status Check() const { return ValidateKvEventsOptions(options); }
  // Null with --kv-events-publisher none; else the sockets, bound or connected.
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(int64_t block_size,
                                                          const std::string& backend) const;
};

// " kv_events=ENDPOINT[ kv_events_replay=ENDPOINT]" for the ready line, or "".
std::string KvEventsReadyField(const KvEventPublisher* publisher);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_KV_EVENTS_FLAGS_H_
