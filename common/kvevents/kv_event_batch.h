// KV cache events in vLLM's wire format (vllm/distributed/kv_events.py): a batch is the msgpack
// array [ts, [event, ...]] (msgspec's array_like structs; the tag, the event's class name, first):
//   ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, lora_id (nil),
//    medium, lora_name (nil for the base model; the adapter's name for a LoRA request's blocks)]
//   ["BlockRemoved", [hash, ...], medium]
//   ["AllBlocksCleared"]
// Decoders of vLLM's older five-field BlockStored ignore the trailing fields (msgspec ignores
// extra array elements unless told to forbid them).
//
// Hashes: pdserve's blocks are keyed by a 128-bit chained XXH3 of the tokens
// (kvcache/block_hash.h); an event carries its low 64 bits as an unsigned integer (vLLM's
// ExternalBlockHash is an int or bytes). Consecutive stored blocks of one sequence (each the
// parent of the next) share one BlockStored, as vLLM sends them: its parent is the first
// block's, its token_ids are the blocks' tokens in order.
#ifndef PDSERVE_COMMON_KVEVENTS_KV_EVENT_BATCH_H_
#define PDSERVE_COMMON_KVEVENTS_KV_EVENT_BATCH_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "common/kvcache/block_manager.h"

namespace pdserve {

inline uint64_t ExternalBlockHash(const BlockHash& h) { return h.lo; }

// One batch's msgpack bytes. `medium`: "GPU" or "CPU" (vLLM's names for where the blocks are),
// the pool's; an event with its own (a KV cache tier's: "DISK", "STORE") carries that.
std::string EncodeKvEventBatch(double ts, absl::Span<const KvEvent> events, int64_t block_size,
                               const std::string& medium);
// A batch holding one AllBlocksCleared (a publisher's first: its worker's cache starts empty).
std::string EncodeAllBlocksCleared(double ts);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVEVENTS_KV_EVENT_BATCH_H_
