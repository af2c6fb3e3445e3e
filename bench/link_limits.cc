#include "bench/link_limits.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/base/strings.h"

namespace pdserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status Errno(const char* what) {
  return absl::InternalError(Str("loopback stream: ", what, ": ", std::strerror(errno)));
}

// One timed pass: connect, stream, and stop when the reader has everything.
absl::StatusOr<double> OnePass(const std::vector<uint8_t>& src, size_t chunk) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  if (listener.get() < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return Errno("bind");
  if (::listen(listener.get(), 1) != 0) return Errno("listen");
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  Fd writer(::socket(AF_INET, SOCK_STREAM, 0));
  if (::connect(writer.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect");
  }
  Fd reader(::accept(listener.get(), nullptr, nullptr));
  if (reader.get() < 0) return Errno("accept");
  const int one = 1;
  ::setsockopt(writer.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  std::vector<uint8_t> dst(chunk);
  size_t received = 0;
  bool read_failed = false;
  const auto start = Clock::now();
  std::thread drain([&] {
    while (received < src.size()) {
      const ssize_t n = ::recv(reader.get(), dst.data(), dst.size(), 0);
      if (n <= 0) {
        read_failed = true;
        return;
      }
      received += static_cast<size_t>(n);
    }
  });
  size_t sent = 0;
  while (sent < src.size()) {
    const ssize_t n = ::send(writer.get(), src.data() + sent, std::min(chunk, src.size() - sent),
                             MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  if (sent < src.size()) ::shutdown(writer.get(), SHUT_RDWR);
  drain.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (read_failed || sent < src.size()) return absl::InternalError("loopback stream: connection failed");
  return static_cast<double>(src.size()) / secs;
}

}  // namespace

absl::StatusOr<double> LoopbackStreamBandwidth(size_t bytes, size_t chunk, int repeats) {
  std::vector<uint8_t> src(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto bw = OnePass(src, chunk);
    if (!bw.ok()) return bw.status();
    best = std::max(best, *bw);
  }
  return best;
}

double MemcpyBandwidth(size_t bytes, int repeats) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // Warm both.
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    src[r % bytes] = static_cast<uint8_t>(r);
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(bytes) / secs);
  }
  volatile uint8_t sink = dst[bytes / 2];
  (void)sink;
  return best;
}

}  // namespace pdserve::bench
