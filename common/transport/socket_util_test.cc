// ConnectionServer against peers that are not the tiers' workers: a connection flood is refused
// beyond the limit (and the server goes on serving), a silent peer is dropped at the handshake
// deadline, and a connection past its handshake may idle.
#include "common/transport/socket_util.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

using std::chrono::milliseconds;

int Connect(const std::string& endpoint) {
  auto fd = ConnectTcp(endpoint, 0);
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *fd : -1;
}

// What a read on the client side sees within `wait`: 0 the server closed, -1 nothing yet.
int ReadWithin(int fd, milliseconds wait) {
  timeval tv{static_cast<time_t>(wait.count() / 1000),
             static_cast<suseconds_t>(wait.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  const ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 ? 0 : -1;
}

// A handler that reads until the peer (or the handshake deadline) ends the connection; with
// `introduce`, the first byte is the peer's handshake.
struct Server {
  explicit Server(ConnectionServer::Limits limits, bool introduce) {
    auto sock = ListenTcp("127.0.0.1:0", "", "tcp://");
    EXPECT_TRUE(sock.ok()) << sock.status();
    endpoint = sock->endpoint;
    server = std::make_unique<ConnectionServer>(
        sock->fd,
        [this, introduce](int fd, uint64_t) {
          ++live;
          char c;
          if (introduce && ::recv(fd, &c, 1, 0) == 1) ConnectionServer::EndHandshake(fd);
          while (::recv(fd, &c, 1, 0) > 0) {
          }
          --live;
        },
        limits);
  }
  std::string endpoint;
  std::atomic<int> live{0};
  std::unique_ptr<ConnectionServer> server;
};

TEST(ConnectionServerTest, AFloodBeyondTheLimitIsRefusedAndServingGoesOn) {
  Server s({/*max_connections=*/3, milliseconds(0)}, false);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(Connect(s.endpoint));
  for (int i = 0; i < 50 && s.live.load() < 3; ++i) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(s.live.load(), 3);
  for (int i = 0; i < 5; ++i) {  // Closed at once: the server holds its three.
    const int extra = Connect(s.endpoint);
    EXPECT_EQ(ReadWithin(extra, milliseconds(5000)), 0) << "connection " << i << " was not refused";
    ::close(extra);
  }
  EXPECT_EQ(s.server->refused(), 5);
  for (int fd : held) EXPECT_EQ(ReadWithin(fd, milliseconds(50)), -1) << "a held connection was cut";
  // One held connection goes; a new one takes its place (reaped at the next accept).
  ::close(held.back());
  held.pop_back();
  for (int i = 0; i < 100 && s.live.load() > 2; ++i) std::this_thread::sleep_for(milliseconds(20));
  const int again = Connect(s.endpoint);
  EXPECT_EQ(ReadWithin(again, milliseconds(200)), -1) << "refused although a slot was free";
  held.push_back(again);
  for (int fd : held) ::close(fd);
}

TEST(ConnectionServerTest, ASilentPeerIsDroppedAtTheHandshakeDeadlineAnIntroducedOneMayIdle) {
  Server s({/*max_connections=*/8, milliseconds(300)}, true);
  const int silent = Connect(s.endpoint);
  const int introduced = Connect(s.endpoint);
  ASSERT_EQ(::send(introduced, "h", 1, MSG_NOSIGNAL), 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadWithin(silent, milliseconds(5000)), 0) << "a silent peer kept its connection";
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(250));
  // Well past the deadline, the introduced connection is still served.
  EXPECT_EQ(ReadWithin(introduced, milliseconds(900)), -1) << "an idle, introduced peer was cut";
  ::close(silent);
  ::close(introduced);
}

}  // namespace
}  // namespace pdserve
