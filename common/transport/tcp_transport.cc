#include "common/transport/tcp_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/transport/frame_reader.h"
#include "common/transport/layout_check.h"
#include "common/transport/receive_tracker.h"
#include "common/transport/socket_util.h"
#include "common/transport/tls_stream.h"

namespace pdserve {
namespace {

using kv_wire::FrameHeader;
using kv_wire::FrameType;
using kv_wire::kAbort;
using kv_wire::kEnd;
using kv_wire::kHello;
using kv_wire::kMagic;
using kv_wire::kPage;

// Frames come from the connection's stream (in the clear or TLS), with read-ahead: a large read
// (a page's payload) goes straight to its destination and whatever follows it in the socket (the
// next frame headers, the start of the next page) into a small buffer, in one call. So a page
// costs about one system call instead of two, and payload bytes are copied once unless they
// arrive ahead of their header.
class StreamSource : public kv_wire::ByteSource {
 public:
  explicit StreamSource(Stream* stream) : stream_(stream), ahead_(kAhead) {}
  bool Read(void* buf, size_t len) override {
    auto* out = static_cast<uint8_t*>(buf);
    const size_t buffered = std::min(len, end_ - begin_);
    std::memcpy(out, ahead_.data() + begin_, buffered);
    begin_ += buffered;
    out += buffered;
    len -= buffered;
    while (len > 0) {
      // The buffer is empty here. Small reads refill it; large ones land in place.
      begin_ = end_ = 0;
      iovec iov[2] = {{out, len}, {ahead_.data(), ahead_.size()}};
      const bool direct = len >= kDirect;
      const ssize_t n = direct ? stream_->ReadSome(iov, 2) : stream_->ReadSome(iov + 1, 1);
      if (n <= 0) return false;
      size_t got = static_cast<size_t>(n);
      if (direct) {
        const size_t used = std::min(got, len);
        out += used;
        len -= used;
        got -= used;
        end_ = got;  // The rest went into the buffer.
      } else {
        end_ = got;
        const size_t take = std::min(len, end_);
        std::memcpy(out, ahead_.data(), take);
        begin_ = take;
        out += take;
        len -= take;
      }
    }
    return true;
  }

 private:
  static constexpr size_t kAhead = 64 << 10;
  static constexpr size_t kDirect = 4096;
  Stream* const stream_;
  std::vector<uint8_t> ahead_;
  size_t begin_ = 0, end_ = 0;  // Unread bytes in ahead_.
};

class TcpKvTransport : public KvTransport {
 public:
  explicit TcpKvTransport(const KvTransportOptions& options)
      : layout_(options.layout),
        advertise_host_(options.advertise_host),
        send_timeout_ms_(options.send_timeout_ms) {}
  // Mutual TLS on every KV connection when the options name a CA.
  absl::Status InitTls(const KvTransportOptions& options) {
    if (options.tls.ca.empty()) return absl::OkStatus();
    PD_ASSIGN_OR_RETURN(tls_, KvTls::Create(options.tls.cert, options.tls.key, options.tls.ca));
    return absl::OkStatus();
  }
  ~TcpKvTransport() override;

  absl::Status Listen(const std::string& address);

  std::string_view name() const override { return "tcp"; }
  absl::Status RegisterPool(uint8_t* base, size_t bytes) override {
    tracker_.SetPool(base, bytes);
    return absl::OkStatus();
  }
  std::string endpoint() const override { return endpoint_; }
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
  // One outgoing connection and the thread that writes to it.
  struct Item {
    FrameType type;
    uint64_t tag;
    std::vector<PageCopy> pages;
    std::function<void(absl::StatusOr<TransferStats>)> done;
  };
  struct Peer {
    int fd = -1;
    std::unique_ptr<Stream> stream;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    bool stop = false;
    bool broken = false;
    absl::Status error;
    absl::flat_hash_map<uint64_t, std::pair<TransferStats, PayloadHash>> sent;
    std::thread writer;
  };

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const std::string& endpoint);
  void WriterLoop(std::shared_ptr<Peer> peer);
  void Enqueue(const std::shared_ptr<Peer>& peer, Item item);
  void ReaderLoop(int fd, uint64_t source);
  bool WritePages(Peer& peer, const Item& item, std::vector<kv_wire::FrameHeader>& headers,
                  std::vector<iovec>& iov, std::deque<std::vector<uint8_t>>& corrupted);

  const std::string layout_;
  const std::string advertise_host_;
  const int64_t send_timeout_ms_;
  std::unique_ptr<KvTls> tls_;  // Null: in the clear.
  std::string endpoint_;
  ReceiveTracker tracker_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ConnectionServer> server_;  // Incoming connections: ReaderLoop each.
  std::mutex peers_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_;
};

absl::Status TcpKvTransport::Listen(const std::string& address) {
  PD_ASSIGN_OR_RETURN(const ListeningSocket sock, ListenTcp(address, advertise_host_, "tcp://"));
  endpoint_ = sock.endpoint;
  server_ = std::make_unique<ConnectionServer>(
      sock.fd, [this](int fd, uint64_t source) { ReaderLoop(fd, source); });
  return absl::OkStatus();
}

TcpKvTransport::~TcpKvTransport() {
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
    ::close(peer->fd);
  }
}

void TcpKvTransport::ReaderLoop(int fd, uint64_t source) {
  auto accepted = AcceptStream(tls_.get(), fd);
  if (!accepted.ok()) {
    PD_LOG(Warning) << accepted.status();  // A peer without the tiers' certificate.
    return;
  }
  std::unique_ptr<Stream> stream = std::move(*accepted);
  StreamSource in(stream.get());
  // Handshake: the sender's layout must equal ours.
  auto theirs = kv_wire::ReadHello(in);
  if (!theirs.ok()) return;
  const absl::Status check = CheckLayouts(layout_, *theirs);
  const std::string message(check.message());
  uint32_t reply[2] = {check.ok() ? 0u : 1u, static_cast<uint32_t>(message.size())};
  iovec iov[2] = {{reply, sizeof(reply)}, {const_cast<char*>(message.data()), message.size()}};
  if (!stream->Write(iov, 2) || !check.ok()) return;
  ConnectionServer::EndHandshake(fd);  // From here the connection may idle between transfers.
  kv_wire::ReceiveFrames(in, tracker_, source, stopping_);
  tracker_.FailSource(source, absl::UnavailableError("KV transport peer disconnected"));
}

absl::StatusOr<std::shared_ptr<TcpKvTransport::Peer>> TcpKvTransport::GetPeer(
    const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = peers_.find(endpoint);
  if (it != peers_.end()) {
    std::lock_guard<std::mutex> plock(it->second->mu);
    if (!it->second->broken) return it->second;
  }
  auto fd = ConnectTcp(endpoint, send_timeout_ms_);
  if (!fd.ok()) return fd.status();
  auto connected = ConnectStream(tls_.get(), *fd, EndpointHost(endpoint));
  if (!connected.ok()) {
    ::close(*fd);
    return connected.status();
  }
  std::unique_ptr<Stream> stream = std::move(*connected);
  FrameHeader h{kMagic, kHello, 0, 0, layout_.size()};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(layout_.data()), layout_.size()}};
  uint32_t reply[2];
  if (!stream->Write(iov, 2) || !stream->Read(reply, sizeof(reply))) {
    stream.reset();
    ::close(*fd);
    return absl::UnavailableError(Str("KV transport handshake with ", endpoint, " failed"));
  }
  std::string message(reply[1] <= kv_wire::kMaxHello ? reply[1] : 0, '\0');
  if (reply[1] > kv_wire::kMaxHello || !stream->Read(message.data(), message.size()) || reply[0] != 0) {
    stream.reset();
    ::close(*fd);
    return absl::FailedPreconditionError(Str("KV transport peer ", endpoint, " refused: ", message));
  }
  auto peer = std::make_shared<Peer>();
  peer->fd = *fd;
  peer->stream = std::move(stream);
  peer->writer = std::thread([this, peer] { WriterLoop(peer); });
  if (it != peers_.end()) {
    // Replace a broken connection; its writer already stopped.
    std::shared_ptr<Peer> old = it->second;
    if (old->writer.joinable()) old->writer.join();
    ::close(old->fd);
    it->second = peer;
  } else {
    peers_.emplace(endpoint, peer);
  }
  return peer;
}

void TcpKvTransport::Enqueue(const std::shared_ptr<Peer>& peer, Item item) {
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

// Sends a page item's pages, up to kPagesPerWrite headers and payloads per writev (a writev per
// 24 KB page, with two reads per page on the receiver, held tcp to ~0.66 of a loopback stream).
// A batch is hashed right after the kernel copied it, while its pages are likely still in cache;
// measured alone that made no difference beyond the noise (bench/RESULTS.md): the gain came from
// the inline AVX2 XXH3 (payload_hash.h).
bool TcpKvTransport::WritePages(Peer& peer, const Item& item, std::vector<FrameHeader>& headers,
                                std::vector<iovec>& iov,
                                std::deque<std::vector<uint8_t>>& corrupted) {
  constexpr size_t kPagesPerWrite = 16;
  headers.resize(kPagesPerWrite);
  iov.resize(2 * kPagesPerWrite);
  size_t i = 0;
  int count = 0;
  size_t unhashed = 0;  // First page not yet in the checksum.
  // Writes what is queued, then hashes the pages it carried (original bytes, in order).
  auto flush = [&]() -> bool {
    if (count > 0 && !peer.stream->Write(iov.data(), count)) return false;
    count = 0;
    std::lock_guard<std::mutex> lock(peer.mu);
    auto& [stats, hash] = peer.sent[item.tag];
    for (; unhashed < i; ++unhashed) {
      const PageCopy& p = item.pages[unhashed];
      ++stats.pages;
      stats.bytes += static_cast<int64_t>(p.bytes);
      hash.Update(tracker_.pool() + p.src_offset, p.bytes);
    }
    return true;
  };
  while (i < item.pages.size()) {
    size_t batch = 0;
    corrupted.clear();
    for (; i < item.pages.size() && batch < kPagesPerWrite; ++i, ++batch) {
      const PageCopy& p = item.pages[i];
      if (const int64_t stall = StallBeforeNextPageMs(); stall > 0) {  // Tests only.
        if (!flush()) return false;
        // Tests wait for this line to know the transfer is under way and stalled.
        PD_LOG(Warning) << "fault injection: KV transfer " << item.tag << " stalls " << stall
                        << " ms after its first " << i << " pages";
        std::this_thread::sleep_for(std::chrono::milliseconds(stall));
      }
      const uint8_t* src = tracker_.pool() + p.src_offset;
      if (ShouldCorruptNextPage()) {  // Fault injection for tests (see receive_tracker.h).
        std::vector<uint8_t>& copy = corrupted.emplace_back(src, src + p.bytes);
        copy[p.bytes / 2] ^= 0x5a;
        src = copy.data();
      }
      headers[batch] = FrameHeader{kMagic, kPage, item.tag, p.dst_offset, p.bytes};
      iov[count++] = {&headers[batch], sizeof(FrameHeader)};
      iov[count++] = {const_cast<uint8_t*>(src), p.bytes};
    }
    if (!flush()) return false;
  }
  return true;
}

void TcpKvTransport::WriterLoop(std::shared_ptr<Peer> peer) {
  std::vector<FrameHeader> headers;
  std::vector<iovec> iov;
  std::deque<std::vector<uint8_t>> corrupted;
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
    if (item.type == kPage) {
      ok = WritePages(*peer, item, headers, iov, corrupted);
    } else if (item.type == kEnd) {
      TransferStats stats;
      {
        std::lock_guard<std::mutex> lock(peer->mu);
        auto it = peer->sent.find(item.tag);
        if (it != peer->sent.end()) {
          stats = it->second.first;
          stats.checksum = it->second.second.Digest();
          peer->sent.erase(it);
        } else {
          stats.checksum = PayloadHash().Digest();
        }
      }
      uint64_t v[3] = {static_cast<uint64_t>(stats.pages), static_cast<uint64_t>(stats.bytes),
                       stats.checksum};
      FrameHeader h{kMagic, kEnd, item.tag, 0, sizeof(v)};
      iovec iov[2] = {{&h, sizeof(h)}, {v, sizeof(v)}};
      ok = peer->stream->Write(iov, 2);
      if (ok && item.done) item.done(stats);
    } else if (item.type == kAbort) {
      {
        std::lock_guard<std::mutex> lock(peer->mu);
        peer->sent.erase(item.tag);
      }
      FrameHeader h{kMagic, kAbort, item.tag, 0, 0};
      iovec iov[1] = {{&h, sizeof(h)}};
      ok = peer->stream->Write(iov, 1);
    }
    if (!ok) {
      std::deque<Item> failed;
      absl::Status error = absl::UnavailableError("KV transport connection lost while sending");
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

absl::Status TcpKvTransport::Submit(const std::string& peer_endpoint, uint64_t tag,
                                    absl::Span<const PageCopy> pages) {
  for (const PageCopy& p : pages) {
    if (p.src_offset + p.bytes > tracker_.pool_bytes()) {
      return absl::OutOfRangeError(Str("page at ", p.src_offset, " is outside the local pool"));
    }
  }
  auto peer = GetPeer(peer_endpoint);
  if (!peer.ok()) return peer.status();
  Enqueue(*peer, Item{kPage, tag, std::vector<PageCopy>(pages.begin(), pages.end()), nullptr});
  return absl::OkStatus();
}

void TcpKvTransport::Finish(const std::string& peer_endpoint, uint64_t tag,
                            std::function<void(absl::StatusOr<TransferStats>)> done) {
  auto peer = GetPeer(peer_endpoint);
  if (!peer.ok()) {
    done(peer.status());
    return;
  }
  Enqueue(*peer, Item{kEnd, tag, {}, std::move(done)});
}

void TcpKvTransport::Abort(const std::string& peer_endpoint, uint64_t tag) {
  auto peer = GetPeer(peer_endpoint);
  if (peer.ok()) Enqueue(*peer, Item{kAbort, tag, {}, nullptr});
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> CreateTcpKvTransport(
    const KvTransportOptions& options) {
  auto t = std::make_unique<TcpKvTransport>(options);
  if (absl::Status s = t->InitTls(options); !s.ok()) return s;
  if (absl::Status s = t->Listen(options.listen_address); !s.ok()) return s;
  return std::unique_ptr<KvTransport>(std::move(t));
}

}  // namespace pdserve
