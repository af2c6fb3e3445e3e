#include "common/kvevents/kv_event_batch.h"

#include <string_view>
#include <vector>

#include "common/kvevents/msgpack_writer.h"

namespace pdserve {
namespace {

bool SameMedium(const KvEvent& a, const KvEvent& b) {
  if (a.medium == nullptr || b.medium == nullptr) return a.medium == b.medium;
  return std::string_view(a.medium) == b.medium;
}

// A run of events that becomes one msgpack event: [begin, end) of the batch.
struct Run {
  size_t begin, end;
};

// Events of one medium share an event: stored blocks when each is the next one's parent and
// all carry tokens or none do, removed blocks always.
std::vector<Run> Runs(absl::Span<const KvEvent> events) {
  std::vector<Run> runs;
  for (size_t i = 0; i < events.size(); ++i) {
    const KvEvent& e = events[i];
    if (!runs.empty()) {
      const KvEvent& prev = events[i - 1];
      const bool chains = e.type == prev.type && SameMedium(e, prev) &&
                          (e.type == KvEvent::Type::kRemoved ||
                           (e.parent == prev.hash && e.tokens.empty() == prev.tokens.empty() &&
                            e.lora_name == prev.lora_name));
      if (chains) {
        runs.back().end = i + 1;
        continue;
      }
    }
    runs.push_back({i, i + 1});
  }
  return runs;
}

}  // namespace

std::string EncodeKvEventBatch(double ts, absl::Span<const KvEvent> events, int64_t block_size,
                               const std::string& medium) {
  const std::vector<Run> runs = Runs(events);
  MsgpackWriter w;
  w.Array(2);
  w.Double(ts);
  w.Array(static_cast<uint32_t>(runs.size()));
  for (const Run& r : runs) {
    const KvEvent& first = events[r.begin];
    const std::string_view where = first.medium != nullptr ? std::string_view(first.medium) : medium;
    const uint32_t n = static_cast<uint32_t>(r.end - r.begin);
    if (first.type == KvEvent::Type::kRemoved) {
      w.Array(3);
      w.Str("BlockRemoved");
      w.Array(n);
      for (size_t i = r.begin; i < r.end; ++i) w.Uint(ExternalBlockHash(events[i].hash));
      w.Str(where);
      continue;
    }
    w.Array(8);
    w.Str("BlockStored");
    w.Array(n);
    for (size_t i = r.begin; i < r.end; ++i) w.Uint(ExternalBlockHash(events[i].hash));
    if (first.parent == BlockHash{}) {
      w.Nil();
    } else {
      w.Uint(ExternalBlockHash(first.parent));
    }
    size_t tokens = 0;
    for (size_t i = r.begin; i < r.end; ++i) tokens += events[i].tokens.size();
    w.Array(static_cast<uint32_t>(tokens));
    for (size_t i = r.begin; i < r.end; ++i) {
      for (int32_t t : events[i].tokens) w.Int(t);
    }
    w.Int(block_size);
    w.Nil();  // lora_id
    w.Str(where);
    if (first.lora_name.empty()) {
      w.Nil();  // lora_name: the base model
    } else {
      w.Str(first.lora_name);
    }
  }
  return w.Take();
}

std::string EncodeAllBlocksCleared(double ts) {
  MsgpackWriter w;
  w.Array(2);
  w.Double(ts);
  w.Array(1);
  w.Array(1);
  w.Str("AllBlocksCleared");
  return w.Take();
}

}  // namespace pdserve
