#include "common/kvevents/kv_event_publisher.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/kvevents/kv_event_batch.h"

namespace pdserve {
namespace {

using std::chrono::milliseconds;

// The frames of one message, or none within the timeout.
std::vector<std::string> Receive(void* socket, int timeout_ms) {
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return {};
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) return {};
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) return frames;
  }
}

std::string Seq(int64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(v) >> (56 - 8 * i)) & 0xff);
  return out;
}

// A payload without its timestamp (array header, float64 tag and 8 bytes).
std::string AfterTs(const std::string& payload) { return payload.substr(10); }

class Sockets {
 public:
  Sockets() : context_(zmq_ctx_new()) {}
  ~Sockets() {
    for (void* s : sockets_) zmq_close(s);
    zmq_ctx_term(context_);
  }
  void* Open(int type, const std::string& endpoint) {
    void* s = zmq_socket(context_, type);
    const int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_SUB) zmq_setsockopt(s, ZMQ_SUBSCRIBE, "kv", 2);
    EXPECT_EQ(zmq_connect(s, endpoint.c_str()), 0);
    sockets_.push_back(s);
    return s;
  }

 private:
  void* context_;
  std::vector<void*> sockets_;
};

TEST(KvEventPublisher, LiveFramesAndReplayFromAnySequence) {
  KvEventsOptions o;
  o.publisher = "zmq";
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv";
  o.block_size = 2;
  auto p = KvEventPublisher::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE((*p)->endpoint(), o.endpoint);  // The port the wildcard took.
  Sockets sockets;
  void* sub = sockets.Open(ZMQ_SUB, (*p)->endpoint());
  // A DEALER, not a REQ: a replay answers one request with many messages, which REQ's strict
  // one-reply state machine would drop after the first.
  void* req = sockets.Open(ZMQ_DEALER, (*p)->replay_endpoint());
  auto ask = [&](int64_t start) {
    ASSERT_EQ(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
    ASSERT_EQ(zmq_send(req, Seq(start).data(), 8, 0), 8);
  };
  // The reply without its empty delimiter frame.
  auto answer = [&]() {
    std::vector<std::string> m = Receive(req, 2000);
    if (m.empty() || !m[0].empty()) return std::vector<std::string>{};
    m.erase(m.begin());
    return m;
  };

  const std::vector<KvEvent> first = {{KvEvent::Type::kStored, {1, 2}, {}, {7, 8}}};
  const std::vector<KvEvent> second = {{KvEvent::Type::kRemoved, {1, 2}, {}, {}}};
  (*p)->Publish(first);
  (*p)->Publish({});  // Nothing: no batch, no sequence number.
  (*p)->Publish(second);

  // Replay from 0 until all three batches (the AllBlocksCleared first) have been sent.
  std::vector<std::vector<std::string>> replayed;
  for (int attempt = 0; attempt < 100 && replayed.size() < 3; ++attempt) {
    replayed.clear();
    ask(0);
    for (;;) {
      std::vector<std::string> m = answer();
      ASSERT_EQ(m.size(), 2u);
      if (m[0] == Seq(-1)) {
        EXPECT_TRUE(m[1].empty());
        break;
      }
      replayed.push_back(m);
    }
    if (replayed.size() < 3) std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(replayed.size(), 3u);
  EXPECT_EQ(replayed[0][0], Seq(0));
  EXPECT_EQ(AfterTs(replayed[0][1]), AfterTs(EncodeAllBlocksCleared(0)));
  EXPECT_EQ(replayed[1][0], Seq(1));
  EXPECT_EQ(AfterTs(replayed[1][1]), AfterTs(EncodeKvEventBatch(0, first, 2, "CPU")));
  EXPECT_EQ(replayed[2][0], Seq(2));
  EXPECT_EQ(AfterTs(replayed[2][1]), AfterTs(EncodeKvEventBatch(0, second, 2, "CPU")));

  // From a later sequence: only what follows.
  ask(2);
  std::vector<std::string> m = answer();
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], Seq(2));
  m = answer();
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], Seq(-1));

  // Live: the subscriber gets [topic, sequence, payload], sequences consecutive from whichever
  // it saw first (it may have caught the first batches too); wait for one published now.
  std::vector<std::string> live;
  int64_t last = -1;
  for (int attempt = 0; attempt < 50 && last < 3; ++attempt) {
    (*p)->Publish(first);
    for (live = Receive(sub, 100); !live.empty(); live = Receive(sub, 100)) {
      ASSERT_EQ(live.size(), 3u);
      EXPECT_EQ(live[0], "kv");
      if (last >= 0) EXPECT_EQ(live[1], Seq(last + 1));
      last = 0;
      for (char c : live[1]) last = (last << 8) | static_cast<uint8_t>(c);
      if (last >= 3) break;
    }
  }
  ASSERT_GE(last, 3);
  EXPECT_EQ(AfterTs(live[2]), AfterTs(EncodeKvEventBatch(0, first, 2, "CPU")));
  EXPECT_EQ((*p)->dropped(), 0);
}

// Every kept batch is replayed, and then the end marker, however many there are: more than a
// socket's high-water mark (1,000 by default) to a consumer that reads slowly, and to two
// consumers at once. A subscriber that connected before the publisher (a late joiner by
// ZeroMQ's rules) recovers sequence 0, the AllBlocksCleared, by replay.
TEST(KvEventPublisher, ReplayDeliversEveryKeptBatchThenTheEndMarker) {
  KvEventsOptions o;
  o.publisher = "zmq";
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.block_size = 2;
  o.buffer_steps = 10000;
  auto p = KvEventPublisher::Start(o);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::vector<KvEvent> batch = {{KvEvent::Type::kStored, {1, 2}, {}, {7, 8}}};
  constexpr int kBatches = 5000;
  for (int i = 0; i < kBatches; ++i) (*p)->Publish(batch);
  Sockets sockets;
  void* slow = sockets.Open(ZMQ_DEALER, (*p)->replay_endpoint());
  void* fast = sockets.Open(ZMQ_DEALER, (*p)->replay_endpoint());
  auto ask = [&](void* s, int64_t start) {
    ASSERT_EQ(zmq_send(s, "", 0, ZMQ_SNDMORE), 0);
    ASSERT_EQ(zmq_send(s, Seq(start).data(), 8, 0), 8);
  };
  // Until the publisher has sent them all (it queues what Publish handed it).
  std::this_thread::sleep_for(milliseconds(300));
  ask(slow, 0);
  ask(fast, 0);
  auto drain = [&](void* s, bool pause) {
    std::vector<int64_t> seqs;
    for (;;) {
      std::vector<std::string> m = Receive(s, 5000);
      if (m.size() != 3) break;
      int64_t seq = 0;
      for (char c : m[1]) seq = (seq << 8) | static_cast<uint8_t>(c);
      seqs.push_back(seq);
      if (seq == -1) break;
      if (pause && seqs.size() % 500 == 0) std::this_thread::sleep_for(milliseconds(50));
    }
    return seqs;
  };
  std::vector<int64_t> slow_seqs;
  std::thread reader([&] { slow_seqs = drain(slow, true); });
  const std::vector<int64_t> fast_seqs = drain(fast, false);
  reader.join();
  for (const std::vector<int64_t>* seqs : std::initializer_list<const std::vector<int64_t>*>{&slow_seqs, &fast_seqs}) {
    ASSERT_EQ(seqs->size(), static_cast<size_t>(kBatches + 2));  // AllBlocksCleared + batches + end.
    for (int64_t i = 0; i <= kBatches; ++i) EXPECT_EQ((*seqs)[static_cast<size_t>(i)], i);
    EXPECT_EQ(seqs->back(), -1);
  }
}

TEST(KvEventPublisher, BadOptionsNameTheFlag) {
  KvEventsOptions o;
  EXPECT_EQ(KvEventPublisher::Start(o).value(), nullptr);  // "none": no publisher.
  o.publisher = "nats";
  EXPECT_NE(KvEventPublisher::Start(o).status().message().find("--kv-events-publisher"),
            std::string::npos);
  o.publisher = "zmq";
  o.endpoint = "tcp://127.0.0.1:*";
  auto a = KvEventPublisher::Start(o);
  ASSERT_TRUE(a.ok());
  // The port it took, with a wildcard host (so bound, not connected): refused.
  o.endpoint = "tcp://*:" + (*a)->endpoint().substr((*a)->endpoint().rfind(':') + 1);
  auto b = KvEventPublisher::Start(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--kv-events-endpoint: cannot bind"), std::string::npos)
      << b.status();
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "bogus://x";
  auto c = KvEventPublisher::Start(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--kv-events-replay-endpoint"), std::string::npos);
  o.replay_endpoint.clear();
  o.buffer_steps = 0;
  EXPECT_NE(KvEventPublisher::Start(o).status().message().find("--kv-events-buffer-steps"),
            std::string::npos);
}

}  // namespace
}  // namespace pdserve
