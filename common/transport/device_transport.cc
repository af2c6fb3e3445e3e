#include "common/transport/device_transport.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/transport/frame_reader.h"
#include "common/transport/layout_check.h"
#include "common/transport/payload_hash.h"
#include "common/transport/receive_tracker.h"
#include "common/transport/socket_util.h"
#include "common/transport/tls_stream.h"

namespace pdserve {
namespace {

using kv_wire::FrameHeader;
using kv_wire::kAbort;
using kv_wire::kEnd;
using kv_wire::kHello;
using kv_wire::kMagic;

constexpr uint32_t kPageRef = 16;  // + u64 source offset
constexpr uint32_t kAck = 17;      // offset: 0 done, 1 failed; + message

struct PageRefFrame {
  FrameHeader h;
  uint64_t src_offset;
};
static_assert(sizeof(PageRefFrame) == 40);

// XXH3-64 over the 8-byte hashes of the pages, in order (ReceiveTracker::PageArrivedHashed).
uint64_t FoldHashes(const std::vector<uint64_t>& hashes) {
  PayloadHash h;
  for (const uint64_t& v : hashes) h.Update(reinterpret_cast<const uint8_t*>(&v), sizeof(v));
  return h.Digest();
}

class DeviceKvTransport : public KvTransport {
 public:
  DeviceKvTransport(const KvTransportOptions& options, std::unique_ptr<DeviceDataPath> path,
                    std::string name)
      : layout_(options.layout),
        advertise_host_(options.advertise_host),
        timeout_ms_(options.send_timeout_ms),
        path_(std::move(path)),
        device_(&path_->device()),
        name_(std::move(name)) {}
  ~DeviceKvTransport() override;

  // Mutual TLS on every control connection when the options name a CA. The pages themselves
  // move over the data path (CUDA IPC on one host, NCCL), which TLS does not cover.
  absl::Status InitTls(const KvTransportOptions& options) {
    if (options.tls.ca.empty()) return absl::OkStatus();
    PD_ASSIGN_OR_RETURN(tls_, KvTls::Create(options.tls.cert, options.tls.key, options.tls.ca));
    return absl::OkStatus();
  }

  absl::Status Listen(const std::string& address) {
    PD_ASSIGN_OR_RETURN(const ListeningSocket sock,
                        ListenTcp(address, advertise_host_, name_ + "://"));
    endpoint_ = sock.endpoint;
    server_ = std::make_unique<ConnectionServer>(
        sock.fd, [this](int fd, uint64_t source) { ReaderLoop(fd, source); });
    return absl::OkStatus();
  }

  std::string_view name() const override { return name_; }
  absl::Status RegisterPool(uint8_t* base, size_t bytes) override {
    PD_RETURN_IF_ERROR(path_->Register(base, bytes));
    tracker_.SetPool(base, bytes);
    registered_ = true;
    return absl::OkStatus();
  }
  std::string endpoint() const override { return endpoint_; }
  std::string description() const override { return Str(endpoint_, " on ", device_->identity()); }
  absl::Status Expect(uint64_t tag, std::vector<ByteRange> allowed) override {
    return tracker_.Expect(tag, std::move(allowed));
  }
  TransferPoll Poll(uint64_t tag) override { return tracker_.Poll(tag); }
  void Release(uint64_t tag) override { tracker_.Release(tag); }

  absl::Status Submit(const std::string& peer, uint64_t tag,
                      absl::Span<const PageCopy> pages) override;
  void Finish(const std::string& peer, uint64_t tag,
              std::function<void(absl::StatusOr<TransferStats>)> done) override;
  void Abort(const std::string& peer, uint64_t tag) override;

 private:
  struct Item {
    uint32_t type;
    uint64_t tag;
    std::vector<PageCopy> pages;
    std::function<void(absl::StatusOr<TransferStats>)> done;
  };
  struct Peer {
    int fd = -1;
    std::unique_ptr<Stream> stream;  // Over fd; in the clear or TLS.
    std::unique_ptr<SenderLink> link;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    bool stop = false;
    bool broken = false;
    absl::Status error;
    // Per tag: the pages sent, hashed at END.
    absl::flat_hash_map<uint64_t, PageSpans> sent;
    std::thread writer;
  };

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const std::string& endpoint);
  void WriterLoop(std::shared_ptr<Peer> peer);
  bool WritePageRefs(Peer& peer, const Item& item);
  bool WriteEnd(Peer& peer, Item& item);
  void Enqueue(const std::shared_ptr<Peer>& peer, Item item);
  void ReaderLoop(int fd, uint64_t source);

 public:
  // One control connection as the receiver: frames from `in`, answers through `out`.
  // handshake_done: called once the peer's HELLO is accepted.
  void ServeConnection(kv_wire::ByteSource& in, const std::function<bool(iovec*, int)>& out,
                       uint64_t source, const std::function<void()>& handshake_done);

 private:

  const std::string layout_;
  const std::string advertise_host_;
  const int64_t timeout_ms_;
  std::unique_ptr<DeviceDataPath> path_;
  PoolDevice* const device_;
  std::unique_ptr<KvTls> tls_;  // Null: control connections in the clear.
  const std::string name_;
  bool registered_ = false;
  std::string endpoint_;
  ReceiveTracker tracker_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ConnectionServer> server_;  // Incoming connections: ReaderLoop each.
  std::mutex peers_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_;
};

DeviceKvTransport::~DeviceKvTransport() {
  stopping_.store(true);
  server_.reset();
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers.swap(peers_);
  }
  for (auto& [name, peer] : peers) {
    {
      std::lock_guard<std::mutex> lock(peer->mu);
      peer->stop = true;
    }
    peer->cv.notify_all();
    ::shutdown(peer->fd, SHUT_RDWR);
    if (peer->writer.joinable()) peer->writer.join();
    peer->stream.reset();
    ::close(peer->fd);
  }
}

// Frames from the connection, read as they are needed.
class StreamSource : public kv_wire::ByteSource {
 public:
  explicit StreamSource(Stream* stream) : stream_(stream) {}
  bool Read(void* buf, size_t len) override { return stream_->Read(buf, len); }

 private:
  Stream* const stream_;
};

void DeviceKvTransport::ReaderLoop(int fd, uint64_t source) {
  auto accepted = AcceptStream(tls_.get(), fd);
  if (!accepted.ok()) {
    PD_LOG(Warning) << accepted.status();  // A peer without the tiers' certificate.
    return;
  }
  std::unique_ptr<Stream> stream = std::move(*accepted);
  StreamSource in(stream.get());
  ServeConnection(
      in, [&stream](iovec* iov, int n) { return stream->Write(iov, n); }, source,
      [fd] { ConnectionServer::EndHandshake(fd); });  // Then it may idle between transfers.
}

void DeviceKvTransport::ServeConnection(kv_wire::ByteSource& in,
                                        const std::function<bool(iovec*, int)>& out,
                                        uint64_t source,
                                        const std::function<void()>& handshake_done) {
  // HELLO: layout, device identity and pool handle (NUL-separated); header.offset = pool bytes.
  FrameHeader h;
  if (!in.Read(&h, sizeof(h)) || h.magic != kMagic || h.type != kHello ||
      h.length > kv_wire::kMaxHello) {
    return;
  }
  std::string hello(h.length, '\0');
  if (!in.Read(hello.data(), hello.size())) return;
  const size_t a = hello.find('\0'), b = a == std::string::npos ? a : hello.find('\0', a + 1);
  absl::Status check;
  std::unique_ptr<ReceiverLink> link;
  const uint64_t peer_bytes = h.offset;
  if (b == std::string::npos) {
    check = absl::InvalidArgumentError("malformed hello");
  } else {
    check = CheckLayouts(layout_, hello.substr(0, a));
    const std::string theirs = hello.substr(a + 1, b - a - 1);
    if (check.ok() && theirs != device_->identity()) {
      check = absl::FailedPreconditionError(Str("device is ", device_->identity(),
                                                " here but ", theirs, " on the peer"));
    }
    if (check.ok()) {
      auto made = path_->NewReceiver(hello.substr(b + 1), peer_bytes);
      if (made.ok()) {
        link = std::move(*made);
      } else {
        check = made.status();
      }
    }
  }
  const std::string message(check.message());
  uint32_t reply[2] = {check.ok() ? 0u : 1u, static_cast<uint32_t>(message.size())};
  iovec iov[2] = {{reply, sizeof(reply)}, {const_cast<char*>(message.data()), message.size()}};
  if (!out(iov, 2) || !check.ok()) return;
  handshake_done();

  // Pages received per tag, hashed at END; and (tests) where to corrupt one.
  absl::flat_hash_map<uint64_t, PageSpans> pulled;
  absl::flat_hash_map<uint64_t, std::vector<uint8_t*>> corrupt;
  while (!stopping_.load()) {
    if (!in.Read(&h, sizeof(h)) || h.magic != kMagic) break;
    if (h.type == kPageRef) {
      uint64_t src = 0;
      if (!in.Read(&src, sizeof(src))) break;
      if (h.length > kv_wire::kMaxPage || src > peer_bytes || h.length > peer_bytes - src) {
        tracker_.Fail(h.tag, absl::OutOfRangeError(
                                 Str("transfer ", h.tag, ": source page at ", src, " (", h.length,
                                     " bytes) is outside the sender's pool of ", peer_bytes)));
        if (h.length > kv_wire::kMaxPage || !link->Discard(src, h.length).ok()) break;
        continue;
      }
      auto where = tracker_.PageDestination(h.tag, h.offset, h.length, source);
      if (!where.ok()) {  // The transfer is failed; the sender hears it at END.
        if (!link->Discard(src, h.length).ok()) break;
        continue;
      }
      if (absl::Status s = link->Receive(*where, src, h.length); !s.ok()) {
        tracker_.Fail(h.tag, s);
        break;  // The data path is out of step with the references: end the connection.
      }
      if (ShouldCorruptNextPage()) corrupt[h.tag].push_back(*where + h.length / 2);
      pulled[h.tag].emplace_back(*where, h.length);
    } else if (h.type == kEnd) {
      uint64_t v[3];
      if (h.length != sizeof(v) || !in.Read(v, sizeof(v))) break;
      PageSpans pages;
      if (auto it = pulled.find(h.tag); it != pulled.end()) {
        pages = std::move(it->second);
        pulled.erase(it);
      }
      std::vector<uint64_t> hashes;
      absl::Status received = link->Wait();
      if (received.ok()) {
        for (uint8_t* at : corrupt[h.tag]) received.Update(device_->FlipByteForTesting(at));
        corrupt.erase(h.tag);
      }
      if (!received.ok()) {
        tracker_.Fail(h.tag, received);
      } else if (absl::Status s = device_->HashPages(pages, &hashes); !s.ok()) {
        tracker_.Fail(h.tag, s);
      } else {
        for (size_t i = 0; i < pages.size(); ++i) {
          tracker_.PageArrivedHashed(h.tag, hashes[i], pages[i].second);
        }
        tracker_.Finish(h.tag, TransferStats{static_cast<int64_t>(v[0]),
                                             static_cast<int64_t>(v[1]), v[2]});
      }
      const TransferPoll poll = tracker_.Poll(h.tag);
      const bool done = poll.state == TransferState::kDone;
      const std::string why = done ? "" : (poll.state == TransferState::kPending
                                               ? Str("transfer ", h.tag, " is not expected here")
                                               : std::string(poll.status.message()));
      FrameHeader ack{kMagic, kAck, h.tag, done ? 0u : 1u, why.size()};
      iovec reply_iov[2] = {{&ack, sizeof(ack)}, {const_cast<char*>(why.data()), why.size()}};
      if (!out(reply_iov, 2)) break;
    } else if (h.type == kAbort) {
      pulled.erase(h.tag);
      corrupt.erase(h.tag);
      tracker_.Fail(h.tag, absl::AbortedError(Str("transfer ", h.tag, " aborted by sender")));
    } else {
      break;  // A broken peer.
    }
  }
  tracker_.FailSource(source, absl::UnavailableError("KV transport peer disconnected"));
  // Receives still queued may read the peer: let them end before the link goes.
  (void)link->Wait();
}

absl::StatusOr<std::shared_ptr<DeviceKvTransport::Peer>> DeviceKvTransport::GetPeer(
    const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = peers_.find(endpoint);
  if (it != peers_.end()) {
    std::lock_guard<std::mutex> plock(it->second->mu);
    if (!it->second->broken) return it->second;
  }
  if (!registered_) return absl::FailedPreconditionError("KV transport: no pool registered");
  PD_ASSIGN_OR_RETURN(std::unique_ptr<SenderLink> link, path_->NewSender());
  PD_ASSIGN_OR_RETURN(const int fd, ConnectTcp(endpoint, timeout_ms_));
  auto connected = ConnectStream(tls_.get(), fd, EndpointHost(endpoint));
  if (!connected.ok()) {
    ::close(fd);
    return connected.status();
  }
  std::unique_ptr<Stream> stream = std::move(*connected);
  auto fail = [&](absl::Status s) {
    stream.reset();
    ::close(fd);
    return s;
  };
  const std::string hello = Str(layout_, std::string(1, '\0'), device_->identity(),
                                std::string(1, '\0'), link->hello());
  FrameHeader h{kMagic, kHello, 0, tracker_.pool_bytes(), hello.size()};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(hello.data()), hello.size()}};
  uint32_t reply[2];
  if (!stream->Write(iov, 2) || !stream->Read(reply, sizeof(reply)) ||
      reply[1] > kv_wire::kMaxHello) {
    return fail(absl::UnavailableError(Str("KV transport handshake with ", endpoint, " failed")));
  }
  std::string message(reply[1], '\0');
  if (!stream->Read(message.data(), message.size()) || reply[0] != 0) {
    return fail(
        absl::FailedPreconditionError(Str("KV transport peer ", endpoint, " refused: ", message)));
  }
  if (absl::Status s = link->Start(); !s.ok()) return fail(s);
  auto peer = std::make_shared<Peer>();
  peer->fd = fd;
  peer->stream = std::move(stream);
  peer->link = std::move(link);
  peer->writer = std::thread([this, peer] { WriterLoop(peer); });
  if (it != peers_.end()) {
    std::shared_ptr<Peer> old = it->second;
    if (old->writer.joinable()) old->writer.join();
    old->stream.reset();
    ::close(old->fd);
    it->second = peer;
  } else {
    peers_.emplace(endpoint, peer);
  }
  return peer;
}

void DeviceKvTransport::Enqueue(const std::shared_ptr<Peer>& peer, Item item) {
  {
    std::lock_guard<std::mutex> lock(peer->mu);
    if (peer->broken) {
      if (item.done) item.done(peer->error);
      return;
    }
    peer->queue.push_back(std::move(item));
  }
  peer->cv.notify_one();
}

bool DeviceKvTransport::WritePageRefs(Peer& peer, const Item& item) {
  constexpr size_t kBatch = 64;
  std::vector<PageRefFrame> frames;
  frames.reserve(kBatch);
  for (size_t i = 0; i < item.pages.size();) {
    frames.clear();
    for (; i < item.pages.size() && frames.size() < kBatch; ++i) {
      const PageCopy& p = item.pages[i];
      if (const int64_t stall = StallBeforeNextPageMs(); stall > 0) {  // Tests only.
        if (!frames.empty()) break;
        PD_LOG(Warning) << "fault injection: KV transfer " << item.tag << " stalls " << stall
                        << " ms after its first " << i << " pages";
        std::this_thread::sleep_for(std::chrono::milliseconds(stall));
      }
      frames.push_back(PageRefFrame{FrameHeader{kMagic, kPageRef, item.tag, p.dst_offset, p.bytes},
                                    p.src_offset});
    }
    iovec iov{frames.data(), frames.size() * sizeof(PageRefFrame)};
    if (!peer.stream->Write(&iov, 1)) return false;
    PageSpans spans;
    for (size_t k = i - frames.size(); k < i; ++k) {
      spans.emplace_back(tracker_.pool() + item.pages[k].src_offset, item.pages[k].bytes);
    }
    if (!peer.link->Send(spans).ok()) return false;
    std::lock_guard<std::mutex> lock(peer.mu);
    auto& sent = peer.sent[item.tag];
    sent.insert(sent.end(), spans.begin(), spans.end());
  }
  return true;
}

// END with the sender's count, bytes and checksum (hashed where the pages are), then the
// receiver's ACK: done is told only once the receiver has the bytes.
bool DeviceKvTransport::WriteEnd(Peer& peer, Item& item) {
  std::vector<std::pair<const uint8_t*, uint64_t>> pages;
  {
    std::lock_guard<std::mutex> lock(peer.mu);
    if (auto it = peer.sent.find(item.tag); it != peer.sent.end()) {
      pages = std::move(it->second);
      peer.sent.erase(it);
    }
  }
  std::vector<uint64_t> hashes;
  if (absl::Status s = device_->HashPages(pages, &hashes); !s.ok()) {
    if (item.done) item.done(s);
    item.done = nullptr;
    return true;  // The receiver's transfer fails at its lease; the connection is fine.
  }
  TransferStats stats;
  stats.pages = static_cast<int64_t>(pages.size());
  for (const auto& p : pages) stats.bytes += static_cast<int64_t>(p.second);
  stats.checksum = FoldHashes(hashes);
  uint64_t v[3] = {static_cast<uint64_t>(stats.pages), static_cast<uint64_t>(stats.bytes),
                   stats.checksum};
  FrameHeader h{kMagic, kEnd, item.tag, 0, sizeof(v)};
  iovec iov[2] = {{&h, sizeof(h)}, {v, sizeof(v)}};
  FrameHeader ack;
  if (!peer.stream->Write(iov, 2) || !peer.stream->Read(&ack, sizeof(ack)) ||
      ack.magic != kMagic || ack.type != kAck || ack.tag != item.tag ||
      ack.length > kv_wire::kMaxHello) {
    return false;
  }
  std::string why(ack.length, '\0');
  if (!peer.stream->Read(why.data(), why.size())) return false;
  if (item.done) {
    if (ack.offset == 0) {
      item.done(stats);
    } else {
      item.done(absl::DataLossError(Str("the receiver refused transfer ", item.tag, ": ", why)));
    }
    item.done = nullptr;
  }
  return true;
}

void DeviceKvTransport::WriterLoop(std::shared_ptr<Peer> peer) {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(peer->mu);
      peer->cv.wait(lock, [&] { return peer->stop || !peer->queue.empty(); });
      if (peer->stop) return;
      item = std::move(peer->queue.front());
      peer->queue.pop_front();
    }
    bool ok = true;
    if (item.type == kPageRef) {
      ok = WritePageRefs(*peer, item);
    } else if (item.type == kEnd) {
      ok = WriteEnd(*peer, item);
    } else if (item.type == kAbort) {
      {
        std::lock_guard<std::mutex> lock(peer->mu);
        peer->sent.erase(item.tag);
      }
      FrameHeader h{kMagic, kAbort, item.tag, 0, 0};
      iovec iov{&h, sizeof(h)};
      ok = peer->stream->Write(&iov, 1);
    }
    if (!ok) {
      std::deque<Item> failed;
      const absl::Status error = absl::UnavailableError("KV transport connection lost");
      {
        std::lock_guard<std::mutex> lock(peer->mu);
        peer->broken = true;
        peer->error = error;
        failed.swap(peer->queue);
      }
      if (item.done) item.done(error);
      for (Item& f : failed) {
        if (f.done) f.done(error);
      }
      return;
    }
  }
}

absl::Status DeviceKvTransport::Submit(const std::string& peer_endpoint, uint64_t tag,
                                    absl::Span<const PageCopy> pages) {
  for (const PageCopy& p : pages) {
    if (p.src_offset > tracker_.pool_bytes() || p.bytes > tracker_.pool_bytes() - p.src_offset) {
      return absl::OutOfRangeError(Str("page at ", p.src_offset, " is outside the local pool"));
    }
  }
  PD_ASSIGN_OR_RETURN(std::shared_ptr<Peer> peer, GetPeer(peer_endpoint));
  Enqueue(peer, Item{kPageRef, tag, std::vector<PageCopy>(pages.begin(), pages.end()), nullptr});
  return absl::OkStatus();
}

void DeviceKvTransport::Finish(const std::string& peer_endpoint, uint64_t tag,
                            std::function<void(absl::StatusOr<TransferStats>)> done) {
  auto peer = GetPeer(peer_endpoint);
  if (!peer.ok()) {
    done(peer.status());
    return;
  }
  Enqueue(*peer, Item{kEnd, tag, {}, std::move(done)});
}

void DeviceKvTransport::Abort(const std::string& peer_endpoint, uint64_t tag) {
  auto peer = GetPeer(peer_endpoint);
  if (peer.ok()) Enqueue(*peer, Item{kAbort, tag, {}, nullptr});
}

}  // namespace

void ServeDeviceControlStreamForTesting(KvTransport* transport, kv_wire::ByteSource& in) {
  static std::atomic<uint64_t> source{1u << 30};
  static_cast<DeviceKvTransport*>(transport)->ServeConnection(
      in, [](iovec*, int) { return true; }, source.fetch_add(1), [] {});
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateDeviceKvTransport(
    const KvTransportOptions& options, std::unique_ptr<DeviceDataPath> path, const std::string& name) {
  auto t = std::make_unique<DeviceKvTransport>(options, std::move(path), name);
  PD_RETURN_IF_ERROR(t->InitTls(options));
  PD_RETURN_IF_ERROR(t->Listen(options.listen_address));
  return std::unique_ptr<KvTransport>(std::move(t));
}

}  // namespace pdserve
