#include "common/transport/frame_reader.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::kv_wire {
namespace {

class MemorySource : public ByteSource {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  bool Read(void* buf, size_t len) override {
    if (len > bytes_.size() - pos_) return false;
    std::memcpy(buf, bytes_.data() + pos_, len);
    pos_ += len;
    return true;
  }

 private:
  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
};

void Frame(std::vector<uint8_t>* out, uint32_t type, uint64_t tag, uint64_t offset,
           const std::vector<uint8_t>& payload, uint64_t length = ~0ull) {
  FrameHeader h{kMagic, type, tag, offset, length == ~0ull ? payload.size() : length};
  const auto* p = reinterpret_cast<const uint8_t*>(&h);
  out->insert(out->end(), p, p + sizeof(h));
  out->insert(out->end(), payload.begin(), payload.end());
}

std::vector<uint8_t> EndPayload(int64_t pages, const std::vector<uint8_t>& data) {
  PayloadHash hash;
  hash.Update(data.data(), data.size());
  uint64_t v[3] = {static_cast<uint64_t>(pages), data.size(), hash.Digest()};
  const auto* p = reinterpret_cast<const uint8_t*>(v);
  return std::vector<uint8_t>(p, p + sizeof(v));
}

TEST(FrameReaderTest, PagesLandInTheirRangesAndBadFramesFailOnlyTheirTransfer) {
  std::vector<uint8_t> pool(256, 0);
  ReceiveTracker tracker;
  tracker.SetPool(pool.data(), pool.size());
  ASSERT_TRUE(tracker.Expect(1, {{0, 64}}).ok());
  ASSERT_TRUE(tracker.Expect(2, {{128, 160}}).ok());
  const std::vector<uint8_t> page(32, 0xab);
  std::vector<uint8_t> wire;
  Frame(&wire, kHello, 0, 0, {'l', 'a', 'y'});
  Frame(&wire, kPage, 1, 32, page);
  Frame(&wire, kPage, 2, 192, page);  // Outside transfer 2's range: skipped, transfer failed.
  Frame(&wire, kEnd, 1, 0, EndPayload(1, page));
  MemorySource in(wire);
  auto hello = ReadHello(in);
  ASSERT_TRUE(hello.ok());
  EXPECT_EQ(*hello, "lay");
  std::atomic<bool> stopping{false};
  ReceiveFrames(in, tracker, 7, stopping);
  EXPECT_EQ(tracker.Poll(1).state, TransferState::kDone);
  EXPECT_EQ(std::vector<uint8_t>(pool.begin() + 32, pool.begin() + 64), page);
  EXPECT_EQ(tracker.Poll(2).state, TransferState::kFailed);
  EXPECT_EQ(std::vector<uint8_t>(pool.begin() + 128, pool.end()), std::vector<uint8_t>(128, 0));
}

TEST(FrameReaderTest, MalformedStreamsStopWithoutTouchingThePool) {
  std::vector<uint8_t> pool(64, 0);
  ReceiveTracker tracker;
  tracker.SetPool(pool.data(), pool.size());
  ASSERT_TRUE(tracker.Expect(1, {{0, 64}}).ok());
  std::atomic<bool> stopping{false};
  for (auto make : std::vector<std::function<void(std::vector<uint8_t>*)>>{
           [](auto* w) { Frame(w, kPage, 1, 0, std::vector<uint8_t>(64, 1), 1ull << 40); },  // Huge.
           [](auto* w) { Frame(w, kPage, 1, 0, std::vector<uint8_t>(10, 1), 64); },  // Truncated.
           [](auto* w) { Frame(w, 99, 1, 0, {}); },                                  // Unknown type.
           [](auto* w) { Frame(w, kEnd, 1, 0, {1, 2, 3}); },                         // Short END.
       }) {
    std::vector<uint8_t> wire;
    make(&wire);
    MemorySource in(wire);
    ReceiveFrames(in, tracker, 1, stopping);
    EXPECT_EQ(pool, std::vector<uint8_t>(64, 0));
  }
  std::vector<uint8_t> bad_hello;
  Frame(&bad_hello, kHello, 0, 0, {}, kMaxHello + 1);
  MemorySource in(bad_hello);
  EXPECT_FALSE(ReadHello(in).ok());
}

}  // namespace
}  // namespace pdserve::kv_wire
