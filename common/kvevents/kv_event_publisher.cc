#include "common/kvevents/kv_event_publisher.h"

#include <zmq.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/kvevents/kv_event_batch.h"

namespace pdserve {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string BigEndian8(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((v >> (56 - 8 * i)) & 0xff);
  return out;
}

// vLLM's rule: bind a wildcard (or ipc/inproc) address, connect to a concrete one.
bool Binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

std::string LastEndpoint(void* socket, const std::string& fallback) {
  char buf[512];
  size_t len = sizeof buf;
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &len) != 0 || len == 0) return fallback;
  return std::string(buf, strnlen(buf, len));
}

void SendFrames(void* socket, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    zmq_send(socket, frames[i].data(), frames[i].size(), flags);
  }
}

// A replay message [identity, "", sequence, payload] on the ROUTER socket (ZMQ_ROUTER_MANDATORY):
// 1 sent, 0 its pipe is full (try again later: nothing went), -1 the peer is gone. ZeroMQ
// delivers a multipart message whole once its first frame is queued.
int SendReplay(void* socket, const std::string& identity, const std::string& seq,
               std::string_view payload) {
  if (zmq_send(socket, identity.data(), identity.size(), ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
    return errno == EAGAIN ? 0 : -1;
  }
  zmq_send(socket, "", 0, ZMQ_DONTWAIT | ZMQ_SNDMORE);
  zmq_send(socket, seq.data(), seq.size(), ZMQ_DONTWAIT | ZMQ_SNDMORE);
  zmq_send(socket, payload.data(), payload.size(), ZMQ_DONTWAIT);
  return 1;
}

}  // namespace

absl::Status ValidateKvEventsOptions(const KvEventsOptions& o) {
  if (o.publisher != "none" && o.publisher != "zmq") {
    return absl::InvalidArgumentError(
        Str("--kv-events-publisher: unknown publisher '", o.publisher, "' (none or zmq)"));
  }
  if (o.publisher == "none") return absl::OkStatus();
  if (o.endpoint.empty()) return absl::InvalidArgumentError("--kv-events-endpoint: must not be empty");
  if (o.buffer_steps < 1) return absl::InvalidArgumentError("--kv-events-buffer-steps: must be >= 1");
  if (o.max_queue < 1 || o.hwm < 1 || o.block_size < 1) {
    return absl::InvalidArgumentError("kv events: queue, high-water mark and block size must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(const KvEventsOptions& o) {
  if (absl::Status s = ValidateKvEventsOptions(o); !s.ok()) return s;
  if (o.publisher == "none") return std::unique_ptr<KvEventPublisher>();
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(o));
  p->context_ = zmq_ctx_new();
  if (p->context_ == nullptr) return absl::InternalError(Str("zmq: ", zmq_strerror(errno)));
  const int linger = 0;
  p->pub_ = zmq_socket(p->context_, ZMQ_PUB);
  zmq_setsockopt(p->pub_, ZMQ_SNDHWM, &o.hwm, sizeof o.hwm);
  zmq_setsockopt(p->pub_, ZMQ_LINGER, &linger, sizeof linger);
  const bool bind = Binds(o.endpoint);
  if ((bind ? zmq_bind(p->pub_, o.endpoint.c_str()) : zmq_connect(p->pub_, o.endpoint.c_str())) != 0) {
    return absl::InvalidArgumentError(Str("--kv-events-endpoint: cannot ", bind ? "bind " : "connect to ",
                                          o.endpoint, ": ", zmq_strerror(errno)));
  }
  p->endpoint_ = bind ? LastEndpoint(p->pub_, o.endpoint) : o.endpoint;
  if (!o.replay_endpoint.empty()) {
    p->replay_ = zmq_socket(p->context_, ZMQ_ROUTER);
    zmq_setsockopt(p->replay_, ZMQ_LINGER, &linger, sizeof linger);
    // A full pipe is an error the sender sees (EAGAIN), not a message silently dropped: a
    // replay resumes where the consumer's pipe filled (ServeReplay).
    const int mandatory = 1;
    zmq_setsockopt(p->replay_, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    if (zmq_bind(p->replay_, o.replay_endpoint.c_str()) != 0) {
      return absl::InvalidArgumentError(Str("--kv-events-replay-endpoint: cannot bind ",
                                            o.replay_endpoint, ": ", zmq_strerror(errno)));
    }
    p->replay_endpoint_ = LastEndpoint(p->replay_, o.replay_endpoint);
  }
  p->queue_.push_back({NowSeconds(), {}, /*cleared=*/true});
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (pub_ != nullptr) zmq_close(pub_);
  if (replay_ != nullptr) zmq_close(replay_);
  if (context_ != nullptr) zmq_ctx_term(context_);
}

void KvEventPublisher::Publish(const std::vector<KvEvent>& events) {
  if (events.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) {
    if (dropped_.fetch_add(1) == 0) {
      PD_LOG(Warning) << "kv events: the sender is " << options_.max_queue
                      << " batches behind; dropping batches (consumers' views will diverge)";
    }
    return;
  }
  queue_.push_back({NowSeconds(), events, false});
}

void KvEventPublisher::Loop() {
  std::deque<Pending> batches;
  for (;;) {
    // Replay requests, or a short sleep (zmq_poll with no socket waits out its timeout): 1 ms
    // while a replay waits for its consumer's pipe to drain (a ROUTER socket always polls as
    // writable, so POLLOUT would spin), else 5 ms.
    zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
    zmq_poll(&item, replay_ != nullptr ? 1 : 0, /*timeout ms=*/replays_.empty() ? 5 : 1);
    if (replay_ != nullptr && (item.revents & ZMQ_POLLIN)) ServeReplay();
    if (!replays_.empty()) ContinueReplays();
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      batches.swap(queue_);
      stop = stop_;
    }
    for (const Pending& b : batches) Send(b);
    batches.clear();
    if (stop) return;  // What was queued before the stop went out above.
  }
}

void KvEventPublisher::Send(const Pending& batch) {
  std::string payload = batch.cleared
                            ? EncodeAllBlocksCleared(batch.ts)
                            : EncodeKvEventBatch(batch.ts, batch.events, options_.block_size,
                                                 options_.medium);
  const uint64_t seq = next_seq_++;
  SendFrames(pub_, {options_.topic, BigEndian8(seq), payload});
  if (replay_ == nullptr) return;
  kept_.emplace_back(seq, std::make_shared<const std::string>(std::move(payload)));
  while (static_cast<int64_t>(kept_.size()) > options_.buffer_steps) kept_.pop_front();
}

void KvEventPublisher::ServeReplay() {
  for (;;) {
    // One request: [identity, empty delimiter, start sequence] (a REQ client's envelope).
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, replay_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        if (frames.empty()) return;  // Nothing (more) waiting.
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      const bool more = zmq_msg_more(&msg) != 0;
      zmq_msg_close(&msg);
      if (!more) break;
    }
    if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) {
      PD_LOG(Warning) << "kv events: ignoring a malformed replay request of " << frames.size()
                      << " frames";
      continue;
    }
    uint64_t start = 0;
    for (char c : frames[2]) start = (start << 8) | static_cast<uint8_t>(c);
    if (replays_.size() >= kMaxReplays) {
      // Said, not hidden: the consumer gets the end marker at once and the log says why.
      ++replays_refused_;
      PD_LOG(Warning) << "kv events: " << kMaxReplays << " replays in progress; answering a replay "
                      << "request from sequence " << start << " with the end marker only";
      SendReplay(replay_, frames[0], BigEndian8(~uint64_t{0}), "");
      continue;
    }
    // The batches kept now, whatever is sent or dropped meanwhile: the payloads are shared.
    Replay r;
    r.identity = frames[0];
    r.deadline = std::chrono::steady_clock::now() + kReplayDeadline;
    for (const auto& [seq, payload] : kept_) {
      if (seq >= start) r.batches.emplace_back(seq, payload);
    }
    replays_.push_back(std::move(r));
  }
  ContinueReplays();
}

void KvEventPublisher::ContinueReplays() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = replays_.begin(); it != replays_.end();) {
    Replay& r = *it;
    bool gone = false;
    while (r.next <= r.batches.size()) {
      const bool end = r.next == r.batches.size();  // The end marker: -1, empty.
      const int sent = end ? SendReplay(replay_, r.identity, BigEndian8(~uint64_t{0}), "")
                           : SendReplay(replay_, r.identity, BigEndian8(r.batches[r.next].first),
                                        *r.batches[r.next].second);
      if (sent == 0) break;
      if (sent < 0) {
        gone = true;
        break;
      }
      ++r.next;
      r.deadline = now + kReplayDeadline;  // The consumer reads: it has another minute.
    }
    if (r.next > r.batches.size()) {
      it = replays_.erase(it);
    } else if (gone || now > r.deadline) {
      ++replays_abandoned_;
      PD_LOG(Warning) << "kv events: abandoning a replay after " << r.next << " of "
                      << r.batches.size() << " batches: the consumer "
                      << (gone ? "disconnected" : "did not read them within the deadline");
      it = replays_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pdserve
