#include "cli/kv_events_flags.h"

#include "common/base/strings.h"

namespace pdserve::cli {

void KvEventsFlags::Register(FlagSet& flags) {
  flags.String("kv-events-publisher", &options.publisher,
               "publish the prefix cache's stored and evicted blocks in vLLM's KV event format "
               "(msgpack over ZeroMQ): none or zmq");
  flags.String("kv-events-endpoint", &options.endpoint,
               "zmq: the PUB socket (bound when the address has a wildcard such as tcp://*:5557, "
               "else connected)");
  flags.String("kv-events-replay-endpoint", &options.replay_endpoint,
               "zmq: a ROUTER socket that replays kept batches from a sequence number (e.g. "
               "tcp://*:5558; empty: none)");
  flags.String("kv-events-topic", &options.topic, "zmq: the topic frame of every batch");
  flags.Int("kv-events-buffer-steps", &options.buffer_steps,
            "zmq: how many recent batches the replay socket keeps");
}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventsFlags::Start(
    int64_t block_size, const std::string& backend) const {
  KvEventsOptions o = options;
  o.block_size = block_size;
  o.medium = backend == "cuda" ? "GPU" : "CPU";
  return KvEventPublisher::Start(o);
}

std::string KvEventsReadyField(const KvEventPublisher* publisher) {
  if (publisher == nullptr) return "";
  std::string out = Str(" kv_events=", publisher->endpoint());
  if (!publisher->replay_endpoint().empty()) out += Str(" kv_events_replay=", publisher->replay_endpoint());
  return out;
}

}  // namespace pdserve::cli
