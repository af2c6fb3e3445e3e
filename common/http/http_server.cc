#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/strings.h"

namespace pdserve::http {
namespace internal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kListenId = 0, kWakeId = 1;
constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kBusyReadCap = 64 << 10;  // Bytes read ahead while a response is in flight.
constexpr std::chrono::milliseconds kSweepEvery{50};
constexpr size_t kTrimAfterBytes = size_t{1} << 20;  // Bodies this large are trimmed after...
constexpr std::chrono::milliseconds kTrimEvery{500};  // ...every this long...
constexpr std::chrono::milliseconds kTrimFor{3000};   // ...for this long after their handler.
constexpr std::chrono::milliseconds kLingerFor{
    2000};  // After the last response of a closing connection.

std::string PeerAddress(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return Str(host, ":", port);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  port = ntohs(in6->sin6_port);
  return Str("[", host, "]:", port);
}

// Each connection is a descriptor: the soft limit (often 1,024) is raised toward the hard one so
// that max_connections fit beside the process's other descriptors.
void RaiseDescriptorLimit(size_t connections) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t want = static_cast<rlim_t>(connections) + 1024;
  if (r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= want) return;
  r.rlim_cur = r.rlim_max == RLIM_INFINITY ? want : std::min(want, r.rlim_max);
  setrlimit(RLIMIT_NOFILE, &r);
}

std::string SslError() {
  const unsigned long e = ERR_get_error();
  char buf[256] = {};
  ERR_error_string_n(e, buf, sizeof(buf));
  return e == 0 ? "unknown error" : buf;
}

// A connection's buffer that grew for one large request gives its memory back once emptied
// enough, so a keep-alive connection does not hold a body's worth for its whole life.
void ReleaseSpare(std::string* buffer) {
  constexpr size_t kKeep = size_t{64} << 10;
  if (buffer->capacity() > kKeep && buffer->size() < kKeep) buffer->shrink_to_fit();
}

}  // namespace

struct Op {
  uint64_t connection;
  std::string bytes;
  bool end = false;          // The response is complete.
  bool close_after = false;  // Close once it is written.
};

class Loop : public std::enable_shared_from_this<Loop> {
 public:
  Loop(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)), handler_(std::move(handler)) {}

  ~Loop() {
    if (epoll_ >= 0) close(epoll_);
    if (wake_ >= 0) close(wake_);
    if (listen_ >= 0) close(listen_);
    if (tls_ != nullptr) SSL_CTX_free(tls_);
  }

  absl::Status Init(std::string* address);
  void Start();
  void Stop();
  void Post(Op op);
  size_t connections() const { return count_.load(std::memory_order_relaxed); }
  void CountResponse(int status) {
    if (status >= 100 && status < static_cast<int>(responses_.size())) {
      responses_[status].fetch_add(1, std::memory_order_relaxed);
    }
  }
  int64_t keep_alive_seconds() const {
    return std::chrono::duration_cast<std::chrono::seconds>(options_.idle_timeout).count();
  }
  void BeginDrain() {
    if (draining_.exchange(true)) return;
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
  }
  // -1 until the loop has counted since the drain began.
  int64_t in_flight() const { return in_flight_.load(); }
  HttpStats Stats() const {
    HttpStats st;
    st.connections = connections();
    st.accepted = accepted_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < responses_.size(); ++i) {
      const uint64_t n = responses_[i].load(std::memory_order_relaxed);
      if (n > 0) st.responses.emplace_back(static_cast<int>(i), n);
    }
    return st;
  }

 private:
  enum class State { kHead, kBody, kBusy, kClosing, kDraining };

  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    SSL* ssl = nullptr;
    std::string remote;
    State state = State::kHead;
    std::string in;
    size_t scanned = 0;  // Bytes of `in` searched for the head's end.
    std::string out;
    size_t out_off = 0;
    HttpRequest req;
    size_t head_len = 0;
    std::optional<ChunkedDecoder> chunked;  // While a chunked body arrives.
    bool request_started = false;  // A byte of the current request has arrived (or: first request).
    bool got_bytes = false;        // Since request_started.
    Clock::time_point deadline;  // kHead/kBody: of the request (or idle); kDraining: of the linger.
    Clock::time_point last_progress;
    std::shared_ptr<HttpResponder> responder;  // While kBusy.
    size_t reserved = 0;  // Body bytes counted in buffered_ while the body arrives.
    bool tls_read_wants_write = false, tls_write_wants_read = false;
    uint32_t events = 0;
  };

  void Run();
  void RunHandlers();
  void Accept();
  void HandleEvent(Conn* c, uint32_t events);
  bool ReadAvailable(Conn* c);  // false: closed.
  bool Flush(Conn* c);          // false: closed.
  bool Advance(Conn* c);        // false: closed.
  void ApplyOps();
  void Sweep(Clock::time_point now);
  void Refuse(Conn* c, int status, std::string_view message);
  void Close(Conn* c);
  void UpdateInterest(Conn* c);
  size_t ReadCap(const Conn& c) const;
  std::string ErrorResponse(int status, std::string_view message);  // Counted.
  // Counts `bytes` more of c's body in buffered_; false (nothing counted) past the bound.
  bool Reserve(Conn* c, size_t bytes);
  void Unreserve(size_t bytes) { buffered_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Draining: closes idle keep-alive connections and counts what is still in flight.
  void DrainStep();

  const HttpServerOptions options_;
  const HttpHandler handler_;
  int epoll_ = -1, wake_ = -1, listen_ = -1;
  SSL_CTX* tls_ = nullptr;
  std::thread thread_;
  std::vector<std::thread> handler_threads_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> count_{0};
  std::atomic<uint64_t> accepted_{0};
  std::array<std::atomic<uint64_t>, 600> responses_{};
  std::atomic<size_t> buffered_{0};  // Request bodies held (Reserve), all connections.
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{-1};

  // Owned by the loop thread.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  uint64_t next_id_ = 2;
  bool accepting_ = true;
  Clock::time_point accept_again_, next_sweep_;
  // When a large body's handler last returned (0: none lately), and the last malloc_trim.
  std::atomic<int64_t> large_body_at_{0};
  Clock::time_point last_trim_;

  std::mutex ops_mu_;
  std::vector<Op> ops_;

  struct Task {
    HttpRequest req;
    std::shared_ptr<HttpResponder> res;
    size_t reserved = 0;  // Of buffered_: released once the handler is done with the body.
  };
  std::mutex tasks_mu_;
  std::condition_variable tasks_cv_;
  std::deque<Task> tasks_;
  bool tasks_stop_ = false;
};

absl::Status Loop::Init(std::string* address) {
  auto hp = ParseHostPort(options_.listen, options_.flag, PortUse::kListen);
  if (!hp.ok()) return hp.status();
  RaiseDescriptorLimit(options_.max_connections);
  if (!options_.tls_cert.empty()) {
    tls_ = SSL_CTX_new(TLS_server_method());
    if (tls_ == nullptr) return absl::InternalError("cannot create a TLS context");
    SSL_CTX_set_min_proto_version(tls_, TLS1_2_VERSION);
    SSL_CTX_set_mode(tls_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(tls_, options_.tls_cert.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(tls_, options_.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(tls_) != 1) {
      return absl::InvalidArgumentError(Str("--tls-cert/--tls-key: cannot load ", options_.tls_cert,
                                            " and ", options_.tls_key, " for ", options_.flag, ": ",
                                            SslError()));
    }
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string port = std::to_string(hp->port);
  if (getaddrinfo(hp->host.empty() ? nullptr : hp->host.c_str(), port.c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    return absl::InvalidArgumentError(Str(options_.flag, ": cannot resolve ", options_.listen));
  }
  listen_ = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int yes = 1;
  setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  const bool bound = listen_ >= 0 && bind(listen_, res->ai_addr, res->ai_addrlen) == 0 &&
                     listen(listen_, 1024) == 0;
  freeaddrinfo(res);
  if (!bound) {
    return absl::UnavailableError(
        Str(options_.flag, ": cannot listen on ", options_.listen, ": ", strerror(errno)));
  }
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string peer = PeerAddress(a);
  *address = HostPort{hp->host, std::stoi(peer.substr(peer.rfind(':') + 1))}.ToString();

  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_ < 0 || wake_ < 0) {
    return absl::InternalError(Str(options_.flag, ": epoll: ", strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, listen_, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  return absl::OkStatus();
}

void Loop::Start() {
  thread_ = std::thread([this] { Run(); });
  for (int i = 0; i < std::max(1, options_.handler_threads); ++i) {
    handler_threads_.emplace_back([this] { RunHandlers(); });
  }
}

void Loop::Stop() {
  stop_.store(true);
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_stop_ = true;
  }
  tasks_cv_.notify_all();
  for (auto& t : handler_threads_) t.join();
  handler_threads_.clear();
}

void Loop::Post(Op op) {
  if (stop_.load(std::memory_order_relaxed)) return;
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    was_empty = ops_.empty();
    ops_.push_back(std::move(op));
  }
  if (was_empty) {
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
  }
}

void Loop::RunHandlers() {
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(tasks_mu_);
      tasks_cv_.wait(lock, [this] { return tasks_stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      t = std::move(tasks_.front());
      tasks_.pop_front();
    }
    if (t.res->gone()) {
      Unreserve(t.reserved);
      continue;
    }
    try {
      handler_(std::move(t.req), t.res);
    } catch (const std::exception& e) {
      PD_LOG(Error) << options_.flag << ": a handler failed: " << e.what();
      auto [body, type] = options_.error_body
                              ? options_.error_body(500, "internal error")
                              : std::pair<std::string, std::string>("internal error", "text/plain");
      t.res->Send(500, type, body);
    }
    Unreserve(t.reserved);  // The handler has returned: the body it was given is gone.
    if (t.reserved >= kTrimAfterBytes) large_body_at_.store(Clock::now().time_since_epoch().count());
  }
}

void Loop::Run() {
  // This thread does all the sockets' I/O. SSL_write and SSL_shutdown write with write(2), which
  // raises SIGPIPE on a connection the client has closed; its default action would end the
  // process. Blocked here, a write fails with EPIPE instead and the connection is closed.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  pthread_setname_np(pthread_self(), kLoopThreadName);  // In top, gdb, and the tests.
  epoll_event events[256];
  next_sweep_ = Clock::now() + kSweepEvery;
  while (!stop_.load()) {
    const int n = epoll_wait(epoll_, events, 256, static_cast<int>(kSweepEvery.count()));
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kListenId) {
        Accept();
      } else if (id == kWakeId) {
        uint64_t v;
        (void)!read(wake_, &v, sizeof(v));
      } else {
        auto it = conns_.find(id);
        if (it != conns_.end()) HandleEvent(it->second.get(), events[i].events);
      }
    }
    ApplyOps();
    if (draining_.load(std::memory_order_relaxed)) DrainStep();
    const auto now = Clock::now();
    if (now >= next_sweep_) {
      Sweep(now);
      next_sweep_ = now + kSweepEvery;
    }
  }
  while (!conns_.empty()) Close(conns_.begin()->second.get());
}

std::string Loop::ErrorResponse(int status, std::string_view message) {
  CountResponse(status);
  auto [body, type] = options_.error_body
                          ? options_.error_body(status, message)
                          : std::pair<std::string, std::string>(std::string(message), "text/plain");
  return Str("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\nContent-Type: ", type,
             "\r\nContent-Length: ", body.size(), status == 503 ? "\r\nRetry-After: 1" : "",
             "\r\nConnection: close\r\n\r\n", body);
}

bool Loop::Reserve(Conn* c, size_t bytes) {
  const size_t limit = std::max(options_.max_buffered_body_bytes, options_.limits.max_body_bytes);
  size_t held = buffered_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit || held > limit - bytes) return false;
  } while (!buffered_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  c->reserved += bytes;
  return true;
}

void Loop::DrainStep() {
  std::vector<Conn*> idle;
  int64_t busy = 0;
  for (auto& [id, c] : conns_) {
    const bool writing = c->out_off < c->out.size();
    if (c->state == State::kHead && !c->request_started && !writing && c->in.empty()) {
      idle.push_back(c.get());  // A kept-alive connection between requests.
    } else if (c->state == State::kBusy || c->state == State::kBody || writing ||
               (c->state == State::kHead && c->got_bytes)) {
      ++busy;
    }
  }
  for (Conn* c : idle) Close(c);
  in_flight_.store(busy);
}

void Loop::Accept() {
  for (;;) {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    const int fd =
        accept4(listen_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop listening a moment rather than spin on a readable socket.
        PD_LOG(Warning) << options_.flag << ": cannot accept: " << strerror(errno);
        epoll_ctl(epoll_, EPOLL_CTL_DEL, listen_, nullptr);
        accepting_ = false;
        accept_again_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    accepted_.fetch_add(1, std::memory_order_relaxed);
    if (conns_.size() >= options_.max_connections) {
      if (tls_ == nullptr) {
        const std::string r =
            ErrorResponse(503, Str("the server holds its limit of ", options_.max_connections,
                                   " connections; retry later"));
        (void)!send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      close(fd);
      continue;
    }
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    auto c = std::make_unique<Conn>();
    c->id = next_id_++;
    c->fd = fd;
    c->remote = PeerAddress(a);
    const auto now = Clock::now();
    c->request_started =
        true;  // The first request's clock starts at accept (TLS handshake included).
    c->deadline = now + options_.request_timeout;
    c->last_progress = now;
    if (tls_ != nullptr) {
      c->ssl = SSL_new(tls_);
      SSL_set_fd(c->ssl, fd);
      SSL_set_accept_state(c->ssl);
    }
    Conn* raw = c.get();
    conns_.emplace(c->id, std::move(c));
    count_.store(conns_.size(), std::memory_order_relaxed);
    UpdateInterest(raw);
  }
}

size_t Loop::ReadCap(const Conn& c) const {
  switch (c.state) {
    case State::kHead:
      return options_.limits.max_head_bytes + 1;
    case State::kBody:
      return c.chunked ? kBusyReadCap : c.head_len + c.req.content_length;
    case State::kBusy:
      return kBusyReadCap;
    case State::kClosing:
      return 0;
    case State::kDraining:
      return SIZE_MAX;  // Read and dropped.
  }
  return 0;
}

void Loop::UpdateInterest(Conn* c) {
  uint32_t want = EPOLLRDHUP;
  if (c->in.size() < ReadCap(*c)) want |= EPOLLIN;
  if (c->out_off < c->out.size() || c->tls_read_wants_write) want |= EPOLLOUT;
  if (c->tls_write_wants_read) want |= EPOLLIN;
  if (want == c->events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c->id;
  epoll_ctl(epoll_, c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
  c->events = want;
}

void Loop::HandleEvent(Conn* c, uint32_t events) {
  if ((events & (EPOLLERR | EPOLLHUP)) != 0) return Close(c);
  const bool read_ready = (events & (EPOLLIN | EPOLLRDHUP)) != 0;
  if (read_ready || (c->tls_read_wants_write && (events & EPOLLOUT) != 0)) {
    const bool reading =
        c->state == State::kHead || c->state == State::kBody || c->state == State::kBusy;
    if ((events & EPOLLRDHUP) != 0 && reading && c->in.size() >= ReadCap(*c)) {
      return Close(c);  // The client finished sending while we do not read: it is gone.
    }
    if (!ReadAvailable(c)) return;
  }
  if (!Flush(c)) return;
  if (!Advance(c)) return;
  // TLS may hold decrypted bytes that a lower read cap left behind (the head's), which no epoll
  // event will announce: read them now that the state allows more.
  while (c->ssl != nullptr && SSL_pending(c->ssl) > 0 && c->in.size() < ReadCap(*c) &&
         (c->state == State::kHead || c->state == State::kBody)) {
    const int pending = SSL_pending(c->ssl);
    if (!ReadAvailable(c) || !Advance(c)) return;
    if (SSL_pending(c->ssl) >= pending) break;  // No progress: wait for the socket.
  }
  UpdateInterest(c);
}

bool Loop::ReadAvailable(Conn* c) {
  c->tls_read_wants_write = false;
  char buf[kReadChunk];
  for (;;) {
    const size_t cap = ReadCap(*c);
    if (c->in.size() >= cap) return true;
    const size_t want = std::min(sizeof(buf), cap - c->in.size());
    ssize_t n;
    if (c->ssl != nullptr) {
      ERR_clear_error();
      n = SSL_read(c->ssl, buf, static_cast<int>(want));
      if (n <= 0) {
        const int err = SSL_get_error(c->ssl, static_cast<int>(n));
        if (err == SSL_ERROR_WANT_READ) return true;
        if (err == SSL_ERROR_WANT_WRITE) {
          c->tls_read_wants_write = true;
          return true;
        }
        Close(c);  // Closed (close_notify or not), or a TLS error.
        return false;
      }
    } else {
      n = recv(c->fd, buf, want, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) {
        Close(c);
        return false;
      }
    }
    if (c->state == State::kDraining) continue;
    c->in.append(buf, static_cast<size_t>(n));
    if (c->state == State::kHead && !c->request_started) {
      c->request_started = true;
      c->deadline = Clock::now() + options_.request_timeout;
    }
    c->got_bytes = true;
  }
}

bool Loop::Flush(Conn* c) {
  c->tls_write_wants_read = false;
  while (c->out_off < c->out.size()) {
    const size_t left = c->out.size() - c->out_off;
    ssize_t n;
    if (c->ssl != nullptr) {
      ERR_clear_error();
      n = SSL_write(c->ssl, c->out.data() + c->out_off,
                    static_cast<int>(std::min<size_t>(left, 1 << 20)));
      if (n <= 0) {
        const int err = SSL_get_error(c->ssl, static_cast<int>(n));
        if (err == SSL_ERROR_WANT_WRITE) break;
        if (err == SSL_ERROR_WANT_READ) {
          c->tls_write_wants_read = true;
          break;
        }
        Close(c);
        return false;
      }
    } else {
      n = send(c->fd, c->out.data() + c->out_off, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) {
        Close(c);
        return false;
      }
    }
    c->out_off += static_cast<size_t>(n);
    c->last_progress = Clock::now();
  }
  if (c->out_off == c->out.size()) {
    c->out.clear();
    ReleaseSpare(&c->out);
    c->out_off = 0;
    if (c->state == State::kClosing) {
      // Lingering close: stop sending, read (and drop) until the client closes, so that unread
      // request bytes do not turn our close into a reset that destroys the response in flight.
      if (c->ssl != nullptr) SSL_shutdown(c->ssl);
      shutdown(c->fd, SHUT_WR);
      c->state = State::kDraining;
      c->deadline = Clock::now() + kLingerFor;
      c->in.clear();
    }
  } else if (c->out_off > (1 << 20) && c->out_off * 2 > c->out.size()) {
    c->out.erase(0, c->out_off);
    c->out_off = 0;
  }
  return true;
}

void Loop::Refuse(Conn* c, int status, std::string_view message) {
  Unreserve(c->reserved);
  c->reserved = 0;
  c->out += ErrorResponse(status, message);
  c->chunked.reset();
  c->state = State::kClosing;
  std::string().swap(c->in);  // Its memory too, not just its bytes.
  c->responder.reset();
}

bool Loop::Advance(Conn* c) {
  for (;;) {
    if (c->state == State::kHead) {
      if (c->in.empty()) return true;
      if (!c->request_started) {
        c->request_started = true;
        c->deadline = Clock::now() + options_.request_timeout;
      }
      const size_t from = c->scanned > 3 ? c->scanned - 3 : 0;
      const size_t end = FindHeadEnd(std::string_view(c->in).substr(from));
      if (end == 0) {
        c->scanned = c->in.size();
        if (c->in.size() > options_.limits.max_head_bytes) {
          Refuse(c, 431,
                 Str("the request head is larger than ", options_.limits.max_head_bytes, " bytes"));
          return Flush(c);
        }
        return true;
      }
      c->head_len = from + end;
      c->scanned = 0;
      RequestError error;
      c->req = HttpRequest();
      if (!ParseRequestHead(std::string_view(c->in).substr(0, c->head_len), options_.limits,
                            &c->req, &error)) {
        Refuse(c, error.status, error.message);
        return Flush(c);
      }
      c->req.remote = c->remote;
      if (options_.check_head) {
        if (auto refusal = options_.check_head(c->req)) {
          Refuse(c, refusal->first, refusal->second);
          return Flush(c);
        }
      }
      if (!c->req.chunked && !Reserve(c, c->req.content_length)) {
        Refuse(c, 503, "the server holds too many request bodies at once; retry later");
        return Flush(c);
      }
      c->state = State::kBody;
      if (c->req.chunked) {  // Decoded as it arrives: `in` holds only what is not yet decoded.
        c->in.erase(0, c->head_len);
        c->head_len = 0;
        c->chunked.emplace(options_.limits.max_body_bytes);
      }
      const bool body_missing =
          c->req.chunked ? c->in.empty() : c->in.size() - c->head_len < c->req.content_length;
      if (c->req.expect_continue && c->req.minor_version >= 1 && body_missing) {
        c->out += "HTTP/1.1 100 Continue\r\n\r\n";
        if (!Flush(c)) return false;
      }
    }
    if (c->state != State::kBody) return true;
    if (c->chunked) {
      RequestError error;
      const ChunkedDecoder::Result r = c->chunked->Feed(&c->in, &c->req.body, &error);
      if (r == ChunkedDecoder::Result::kError) {
        Refuse(c, error.status, error.message);
        return Flush(c);
      }
      if (c->req.body.size() > c->reserved && !Reserve(c, c->req.body.size() - c->reserved)) {
        Refuse(c, 503, "the server holds too many request bodies at once; retry later");
        return Flush(c);
      }
      if (r == ChunkedDecoder::Result::kMore) return true;
      c->chunked.reset();
    } else {
      if (c->in.size() - c->head_len < c->req.content_length) return true;
      c->req.body = c->in.substr(c->head_len, c->req.content_length);
      c->in.erase(0, c->head_len + c->req.content_length);
      c->head_len = 0;
      ReleaseSpare(&c->in);
    }
    c->state = State::kBusy;
    c->responder = std::make_shared<HttpResponder>(shared_from_this(), c->id, c->req.keep_alive,
                                                   c->req.minor_version);
    if (c->req.method == "HEAD") c->responder->head_only_ = true;
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      tasks_.push_back(Task{std::move(c->req), c->responder, c->reserved});
      c->reserved = 0;  // The task's now.
    }
    tasks_cv_.notify_one();
    return true;
  }
}

void Loop::ApplyOps() {
  std::vector<Op> ops;
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    ops.swap(ops_);
  }
  for (Op& op : ops) {
    auto it = conns_.find(op.connection);
    if (it == conns_.end()) continue;  // Gone: the responder was cancelled.
    Conn* c = it->second.get();
    if (c->state != State::kBusy) continue;
    if (c->out_off == c->out.size()) c->last_progress = Clock::now();
    c->out += op.bytes;
    if (c->out.size() - c->out_off > options_.max_queued_bytes) {
      PD_LOG(Warning) << options_.flag << ": closing " << c->remote
                      << ": it reads its response too slowly (" << options_.max_queued_bytes
                      << " bytes waiting)";
      Close(c);
      continue;
    }
    if (op.end) {
      c->responder.reset();
      if (op.close_after || draining_.load(std::memory_order_relaxed)) {
        c->state = State::kClosing;
      } else {
        c->state = State::kHead;
        c->request_started = false;
        c->got_bytes = false;
        c->deadline = Clock::now() + options_.idle_timeout;
      }
    }
    if (!Flush(c)) continue;
    if (op.end && c->state == State::kHead) {
      // Bytes read ahead (pipelined requests; TLS records already decrypted) get their turn.
      if (!ReadAvailable(c) || !Advance(c)) continue;
    }
    UpdateInterest(c);
  }
}

void Loop::Sweep(Clock::time_point now) {
  // A large body's copies (its bytes, its parse tree, the gRPC request made of it) are freed
  // over the moments after its handler returns, on other threads, and glibc keeps freed memory
  // in their arenas: for a few seconds after one, give it back every half second, or a few
  // 10 MB bodies leave the process holding their peak for good.
  const int64_t large = large_body_at_.load();
  if (large != 0 && now - last_trim_ >= kTrimEvery) {
    const Clock::duration since = now.time_since_epoch() - Clock::duration(large);
    if (since >= kTrimEvery) {
      malloc_trim(0);
      last_trim_ = now;
      int64_t seen = large;
      if (since > kTrimFor) large_body_at_.compare_exchange_strong(seen, 0);
    }
  }
  if (!accepting_ && now >= accept_again_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenId;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, listen_, &ev);
    accepting_ = true;
  }
  std::vector<Conn*> expired;
  for (auto& [id, c] : conns_) {
    const bool writing = c->out_off < c->out.size();
    switch (c->state) {
      case State::kHead:
      case State::kBody:
        if (writing) {
          // The last response is still on its way: the write timeout applies, and the clock of
          // the idle wait (or of the next request) starts once it is out.
          if (now - c->last_progress > options_.write_timeout) {
            expired.push_back(c.get());
          } else {
            c->deadline = std::max(c->deadline, now + (c->request_started ? options_.request_timeout
                                                                          : options_.idle_timeout));
          }
        } else if (now >= c->deadline) {
          expired.push_back(c.get());
        }
        break;
      case State::kBusy:
      case State::kClosing:
        if (writing && now - c->last_progress > options_.write_timeout) expired.push_back(c.get());
        break;
      case State::kDraining:
        if (now >= c->deadline) expired.push_back(c.get());
        break;
    }
  }
  for (Conn* c : expired) {
    const bool handshaken = c->ssl == nullptr || SSL_is_init_finished(c->ssl);
    const bool writing = c->out_off < c->out.size();  // Then it is the write timeout.
    if ((c->state == State::kHead || c->state == State::kBody) && c->got_bytes && handshaken &&
        !writing) {
      Refuse(c, 408,
             Str("the request did not arrive within ", options_.request_timeout.count(), " ms"));
      c->last_progress = now;
      if (Flush(c)) UpdateInterest(c);
    } else {
      Close(c);
    }
  }
}

void Loop::Close(Conn* c) {
  epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
  if (c->ssl != nullptr) SSL_free(c->ssl);
  close(c->fd);
  std::shared_ptr<HttpResponder> responder = std::move(c->responder);
  Unreserve(c->reserved);
  conns_.erase(c->id);
  count_.store(conns_.size(), std::memory_order_relaxed);
  if (responder != nullptr) responder->Cancel();
}

}  // namespace internal

HttpResponder::HttpResponder(std::shared_ptr<internal::Loop> loop, uint64_t connection,
                             bool keep_alive, int minor_version)
    : loop_(std::move(loop)),
      connection_(connection),
      keep_alive_(keep_alive),
      minor_version_(minor_version) {}

HttpResponder::~HttpResponder() = default;

std::string HttpResponder::Head(int status, std::string_view content_type, const Headers& extra,
                                const std::string* length) {
  std::string h = Str("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n");
  if (!content_type.empty()) StrAppendTo(&h, "Content-Type: ", content_type, "\r\n");
  for (const auto& [name, value] : extra) StrAppendTo(&h, name, ": ", value, "\r\n");
  if (length != nullptr) {
    StrAppendTo(&h, "Content-Length: ", *length, "\r\n");
  } else if (minor_version_ >= 1) {
    h += "Transfer-Encoding: chunked\r\n";
  }
  const bool close = !keep_alive_ || (length == nullptr && minor_version_ == 0);
  if (close) {
    h += "Connection: close\r\n";
  } else {
    if (minor_version_ == 0) h += "Connection: keep-alive\r\n";
    StrAppendTo(&h, "Keep-Alive: timeout=", loop_->keep_alive_seconds(), "\r\n");
  }
  h += "\r\n";
  return h;
}

void HttpResponder::Send(int status, std::string_view content_type, std::string body,
                         const Headers& extra) {
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ || gone_) return;
    started_ = ended_ = true;
    loop_->CountResponse(status);
    const std::string length = std::to_string(body.size());
    bytes = Head(status, content_type, extra, &length);
    if (!head_only_) bytes += body;
  }
  loop_->Post(internal::Op{connection_, std::move(bytes), true, !keep_alive_});
}

void HttpResponder::StartStream(int status, std::string_view content_type, const Headers& extra) {
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ || gone_) return;
    started_ = true;
    loop_->CountResponse(status);
    bytes = Head(status, content_type, extra, nullptr);
  }
  loop_->Post(internal::Op{connection_, std::move(bytes), false, false});
}

void HttpResponder::Write(std::string_view data) {
  if (data.empty()) return;
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || ended_ || gone_ || head_only_) return;
    if (minor_version_ >= 1) {
      char size[24];
      snprintf(size, sizeof(size), "%zx\r\n", data.size());
      bytes = Str(size, data, "\r\n");
    } else {
      bytes = std::string(data);
    }
  }
  loop_->Post(internal::Op{connection_, std::move(bytes), false, false});
}

void HttpResponder::End() {
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || ended_ || gone_) return;
    ended_ = true;
    if (minor_version_ >= 1 && !head_only_) bytes = "0\r\n\r\n";
  }
  loop_->Post(
      internal::Op{connection_, std::move(bytes), true, !keep_alive_ || minor_version_ == 0});
}

void HttpResponder::OnCancel(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!gone_) {
      on_cancel_ = std::move(f);
      return;
    }
    if (ended_) return;
  }
  f();
}

bool HttpResponder::gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

void HttpResponder::Cancel() {
  std::function<void()> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_) return;
    gone_ = true;
    if (ended_) return;  // Answered; the bytes were still in flight.
    f = std::move(on_cancel_);
  }
  if (f) f();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  server->loop_ = std::make_shared<internal::Loop>(options, std::move(handler));
  absl::Status s = server->loop_->Init(&server->address_);
  if (!s.ok()) return s;
  server->loop_->Start();
  return server;
}

HttpServer::~HttpServer() {
  if (loop_ != nullptr) loop_->Stop();
}

size_t HttpServer::connections() const { return loop_->connections(); }

HttpStats HttpServer::stats() const { return loop_->Stats(); }

void HttpServer::BeginDrain() { loop_->BeginDrain(); }

bool HttpServer::WaitDrained(std::chrono::steady_clock::time_point deadline) {
  loop_->BeginDrain();
  for (;;) {
    if (loop_->in_flight() == 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace pdserve::http
