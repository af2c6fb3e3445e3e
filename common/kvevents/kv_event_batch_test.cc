#include "common/kvevents/kv_event_batch.h"

#include <gtest/gtest.h>

#include <string>

#include "common/kvevents/msgpack_writer.h"

namespace pdserve {
namespace {

BlockHash H(uint64_t lo) { return BlockHash{lo, lo * 31 + 7}; }

KvEvent Stored(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens) {
  return KvEvent{KvEvent::Type::kStored, H(hash), parent == 0 ? BlockHash{} : H(parent),
                 std::move(tokens)};
}

KvEvent Removed(uint64_t hash) { return KvEvent{KvEvent::Type::kRemoved, H(hash), {}, {}}; }

// The expected bytes are built field by field from the layout kv_event_batch.h documents (vLLM's
// array_like structs), so a change of the layout must change both.
TEST(KvEventBatch, StoredChainsShareAnEventRemovedBlocksToo) {
  const std::vector<KvEvent> events = {
      Stored(10, 0, {1, 2}), Stored(11, 10, {3, 4}),  // A prompt's first two blocks: one event.
      Stored(20, 99, {5, 6}),                          // Another sequence's block.
      Removed(30), Removed(31),
  };
  const std::string got = EncodeKvEventBatch(2.5, events, 2, "CPU");

  MsgpackWriter w;
  w.Array(2);
  w.Double(2.5);
  w.Array(3);
  w.Array(8);
  w.Str("BlockStored");
  w.Array(2);
  w.Uint(10);
  w.Uint(11);
  w.Nil();
  w.Array(4);
  for (int t : {1, 2, 3, 4}) w.Int(t);
  w.Int(2);
  w.Nil();
  w.Str("CPU");
  w.Nil();
  w.Array(8);
  w.Str("BlockStored");
  w.Array(1);
  w.Uint(20);
  w.Uint(99);
  w.Array(2);
  w.Int(5);
  w.Int(6);
  w.Int(2);
  w.Nil();
  w.Str("CPU");
  w.Nil();
  w.Array(3);
  w.Str("BlockRemoved");
  w.Array(2);
  w.Uint(30);
  w.Uint(31);
  w.Str("CPU");
  EXPECT_EQ(got, w.bytes());
}

// A LoRA request's blocks carry its adapter's name (vLLM's lora_name); a base block and an
// adapter's block never share an event, even where one's hash is the other's parent.
TEST(KvEventBatch, AnAdaptersBlocksCarryItsName) {
  KvEvent adapted = Stored(10, 0, {1, 2});
  adapted.lora_name = "psalms";
  KvEvent next = Stored(11, 10, {3, 4});
  next.lora_name = "psalms";
  const KvEvent base = Stored(12, 11, {5, 6});
  const std::string got = EncodeKvEventBatch(1.0, {adapted, next, base}, 2, "CPU");
  MsgpackWriter w;
  w.Array(2);
  w.Double(1.0);
  w.Array(2);
  auto stored = [&w](std::vector<uint64_t> hashes, uint64_t parent, std::vector<int> tokens,
                     const char* lora) {
    w.Array(8);
    w.Str("BlockStored");
    w.Array(static_cast<uint32_t>(hashes.size()));
    for (uint64_t h : hashes) w.Uint(h);
    if (parent == 0) {
      w.Nil();
    } else {
      w.Uint(parent);
    }
    w.Array(static_cast<uint32_t>(tokens.size()));
    for (int t : tokens) w.Int(t);
    w.Int(2);
    w.Nil();
    w.Str("CPU");
    if (lora == nullptr) {
      w.Nil();
    } else {
      w.Str(lora);
    }
  };
  stored({10, 11}, 0, {1, 2, 3, 4}, "psalms");
  stored({12}, 11, {5, 6}, nullptr);
  EXPECT_EQ(got, w.bytes());
}

// A KV cache tier's events carry its medium, and events of different media never share one: a
// block stored in the pool and its child stored on disk are two BlockStored events.
TEST(KvEventBatch, TierEventsCarryTheirMediumAndDoNotMixWithThePools) {
  KvEvent disk_child = Stored(11, 10, {});
  disk_child.medium = "DISK";
  KvEvent disk_removed = Removed(30);
  disk_removed.medium = "DISK";
  KvEvent store_stored = Stored(12, 11, {});
  store_stored.medium = "STORE";
  const std::vector<KvEvent> events = {Stored(10, 0, {}), disk_child, store_stored, disk_removed, Removed(31)};
  const std::string got = EncodeKvEventBatch(1.0, events, 4, "GPU");

  MsgpackWriter w;
  w.Array(2);
  w.Double(1.0);
  w.Array(5);
  auto stored = [&w](uint64_t hash, uint64_t parent, const char* medium) {
    w.Array(8);
    w.Str("BlockStored");
    w.Array(1);
    w.Uint(hash);
    if (parent == 0) {
      w.Nil();
    } else {
      w.Uint(parent);
    }
    w.Array(0);
    w.Int(4);
    w.Nil();
    w.Str(medium);
    w.Nil();
  };
  auto removed = [&w](uint64_t hash, const char* medium) {
    w.Array(3);
    w.Str("BlockRemoved");
    w.Array(1);
    w.Uint(hash);
    w.Str(medium);
  };
  stored(10, 0, "GPU");
  stored(11, 10, "DISK");
  stored(12, 11, "STORE");
  removed(30, "DISK");
  removed(31, "GPU");
  EXPECT_EQ(got, w.Take());
}

TEST(KvEventBatch, HashesAreTheLow64BitsAndClearedIsATaggedEmptyArray) {
  EXPECT_EQ(ExternalBlockHash(BlockHash{0x1122334455667788ULL, 5}), 0x1122334455667788ULL);
  const std::string cleared = EncodeAllBlocksCleared(0.0);
  // [0.0, [["AllBlocksCleared"]]]
  const std::string want = std::string("\x92\xcb", 2) + std::string(8, '\0') + "\x91\x91\xb0" +
                           "AllBlocksCleared";
  EXPECT_EQ(cleared, want);
}

}  // namespace
}  // namespace pdserve
