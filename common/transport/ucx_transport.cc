#include "common/transport/ucx_transport.h"

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/base/hex.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/transport/layout_check.h"
#include "common/transport/payload_hash.h"
#include "common/transport/receive_tracker.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr unsigned kAmId = 17;
constexpr char kMagic[] = "PDU1";
// Pages coalesced into one put at most (contiguous on both sides).
constexpr uint64_t kMaxPutBytes = uint64_t{64} << 20;

enum MsgType : uint8_t {
  kBegin = 1,   // S->R: sender id, tag, sender worker address
  kGo,          // R->S: receiver id, tag, allowed ranges
  kRefuse,      // R->S: receiver id, tag, reason
  kDone,        // S->R: sender id, tag, pages, bytes, checksum, page list
  kAbort,       // S->R: sender id, tag, status code, message (after a flush)
  kCancel,      // R->S: receiver id, tag
  kCancelled,   // S->R: sender id, tag (after a flush)
  kFlushing,    // S->R: sender id, tag; the sender's final flush follows (the receiver's
                //   acknowledgements pace it, so the receiver polls hard until the end)
  kPutting,     // S->R: sender id, tag; puts are being posted now (at most every millisecond):
                //   the receiver polls hard for the next 2 ms, as their completion needs it
  kBye,         // either way: id, role (0 sender, 1 receiver), tag 0; the transport is closing
                // (a sender's puts are flushed first)
};

class Writer {
 public:
  Writer& U8(uint8_t v) { s_.push_back(static_cast<char>(v)); return *this; }
  Writer& U64(uint64_t v) { s_.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Writer& Bytes(const void* p, size_t n) {
    U64(n);
    s_.append(static_cast<const char*>(p), n);
    return *this;
  }
  Writer& Str(std::string_view v) { return Bytes(v.data(), v.size()); }
  std::string Take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  uint8_t U8() {
    if (!Need(1)) return 0;
    const uint8_t v = static_cast<uint8_t>(s_[0]);
    s_.remove_prefix(1);
    return v;
  }
  uint64_t U64() {
    if (!Need(8)) return 0;
    uint64_t v;
    std::memcpy(&v, s_.data(), 8);
    s_.remove_prefix(8);
    return v;
  }
  std::string_view Bytes() {
    const uint64_t n = U64();
    if (!ok_ || !Need(n)) return {};
    std::string_view v = s_.substr(0, n);
    s_.remove_prefix(n);
    return v;
  }
  bool ok() const { return ok_; }
  size_t left() const { return s_.size(); }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || s_.size() < n) ok_ = false;
    return ok_;
  }
  std::string_view s_;
  bool ok_ = true;
};


absl::Status UcxError(std::string_view what, ucs_status_t status) {
  return absl::UnavailableError(Str("ucx: ", what, ": ", ucs_status_string(status)));
}

// Who a peer process is, so that a peer on this host whose endpoint has no UCX failure detection
// (shared memory: "no peer failure handler") can still be found dead: same boot and pid
// namespace, then pid and start time. A process that is gone can put nothing more into our
// pool. Peers in another pid namespace (another container) are treated as another host: UCX's
// own failure detection, which rules out its shared-memory transports between them.
struct ProcessId {
  std::string boot_id;
  // The pid namespace ("pid:[4026531836]"): two containers on one node share the boot id but
  // not their pids, and cannot see each other's /proc.
  std::string pid_ns;
  uint64_t pid = 0;
  uint64_t start_time = 0;
};

std::string ReadSmallFile(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[1024];
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    out.assign(buf, n);
    std::fclose(f);
  }
  return out;
}

// Field 22 of /proc/PID/stat (after the parenthesised command name); 0 if unreadable. *zombie
// is set for a process that has exited but was not reaped.
uint64_t StartTime(uint64_t pid, bool* zombie) {
  const std::string stat = ReadSmallFile(Str("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string_view> fields;
  std::string_view rest = std::string_view(stat).substr(close + 2);
  while (!rest.empty()) {
    const size_t space = rest.find(' ');
    fields.push_back(rest.substr(0, space));
    if (space == std::string_view::npos) break;
    rest.remove_prefix(space + 1);
  }
  if (fields.size() < 20) return 0;
  if (zombie != nullptr) *zombie = fields[0] == "Z" || fields[0] == "X";
  return std::strtoull(std::string(fields[19]).c_str(), nullptr, 10);  // Field 22.
}

const ProcessId& Self() {
  static const ProcessId self = [] {
    ProcessId p;
    p.boot_id = ReadSmallFile("/proc/sys/kernel/random/boot_id");
    char ns[128] = {0};
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    if (n > 0) p.pid_ns.assign(ns, static_cast<size_t>(n));
    p.pid = static_cast<uint64_t>(::getpid());
    p.start_time = StartTime(p.pid, nullptr);
    return p;
  }();
  return self;
}

// This host and this pid namespace: its pid can be looked up in our /proc.
// Tests only: PDSERVE_FAULT_UCX_REMOTE_PEERS=1 treats every peer as on another host, so that the
// cross-host path (UCX's own peer-failure detection, no process watch) runs on one machine.
bool SameProcessSpace(const ProcessId& p) {
  static const bool all_remote = [] {
    const char* v = std::getenv("PDSERVE_FAULT_UCX_REMOTE_PEERS");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return !all_remote && !p.boot_id.empty() && !p.pid_ns.empty() && p.boot_id == Self().boot_id &&
         p.pid_ns == Self().pid_ns;
}

// False only when the process is known to be gone (same host, and no such live process).
bool MaybeAlive(const ProcessId& p) {
  if (!SameProcessSpace(p)) return true;  // Another host or pid namespace: unknown.
  bool zombie = false;
  const uint64_t start = StartTime(p.pid, &zombie);
  return start != 0 && start == p.start_time && !zombie;
}

void WriteProcess(Writer& w, const ProcessId& p) {
  w.Str(p.boot_id).Str(p.pid_ns).U64(p.pid).U64(p.start_time);
}

ProcessId ReadProcess(Reader& r) {
  ProcessId p;
  p.boot_id = std::string(r.Bytes());
  p.pid_ns = std::string(r.Bytes());
  p.pid = r.U64();
  p.start_time = r.U64();
  return p;
}

// What a receiver's endpoint string says.
struct PeerInfo {
  uint64_t receiver_id = 0;
  uint64_t base = 0;
  uint64_t bytes = 0;
  std::string layout;
  std::string worker_address;
  std::string rkey;
  ProcessId process;
};

absl::StatusOr<PeerInfo> ParseEndpoint(std::string_view endpoint) {
  if (endpoint.rfind("ucx:", 0) != 0) {
    return absl::InvalidArgumentError(Str("'", endpoint.substr(0, 40), "' is not a ucx endpoint"));
  }
  auto blob = HexDecode(endpoint.substr(4));
  if (!blob.ok()) return absl::InvalidArgumentError(Str("ucx endpoint: ", blob.status().message()));
  Reader r(*blob);
  PeerInfo p;
  const std::string_view magic = r.Bytes();
  p.receiver_id = r.U64();
  p.base = r.U64();
  p.bytes = r.U64();
  p.layout = std::string(r.Bytes());
  p.worker_address = std::string(r.Bytes());
  p.rkey = std::string(r.Bytes());
  p.process = ReadProcess(r);
  if (!r.ok() || r.left() != 0 || magic != kMagic || p.worker_address.empty() || p.rkey.empty()) {
    return absl::InvalidArgumentError("ucx endpoint is malformed");
  }
  return p;
}

class UcxKvTransport : public KvTransport {
 public:
  explicit UcxKvTransport(const KvTransportOptions& options)
      : layout_(options.layout), send_timeout_ms_(options.send_timeout_ms) {
    std::random_device rd;
    id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
    if (id_ == 0) id_ = 1;
  }
  ~UcxKvTransport() override;

  absl::Status Init();

  std::string_view name() const override { return "ucx"; }
  absl::Status RegisterPool(uint8_t* base, size_t bytes) override;
  std::string endpoint() const override { return endpoint_; }
  std::string description() const override { return description_; }

  absl::Status Expect(uint64_t tag, std::vector<ByteRange> allowed) override {
    PD_RETURN_IF_ERROR(tracker_.Expect(tag, std::move(allowed)));
    std::lock_guard<std::mutex> lock(recv_mu_);
    incoming_[tag] = Incoming{};
    return absl::OkStatus();
  }
  TransferPoll Poll(uint64_t tag) override { return tracker_.Poll(tag); }
  void Release(uint64_t tag) override { ReleaseUnfinished(tag, nullptr); }
  bool ReleaseUnfinished(uint64_t tag, std::function<void()> quiesced) override;

  absl::Status Submit(const std::string& peer, uint64_t tag,
                      absl::Span<const PageCopy> pages) override;
  void Finish(const std::string& peer, uint64_t tag,
              std::function<void(absl::StatusOr<TransferStats>)> done) override;
  void Abort(const std::string& peer, uint64_t tag) override;

 private:
  // Receiver side, per expected tag (guarded by recv_mu_; the announced ranges are tracker_'s).
  struct Incoming {
    uint64_t sender = 0;
    bool begun = false;
    bool released = false;
    bool flushing = false;  // The sender announced its final flush: poll without napping.
    Clock::time_point hurry_until{};  // The sender is putting: poll without napping until then.
    std::function<void()> quiesced;
  };
  // A receiver this transport sends to (progress thread only).
  struct RemotePeer {
    PeerInfo info;
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    bool detects_failure = true;  // UCX reports a lost peer (else: its process id is watched).
  };
  // One outgoing transfer (progress thread only).
  struct Outgoing {
    enum State { kWaitGo, kSending, kFlushing, kFailed } state = kWaitGo;
    std::string peer;
    uint64_t tag = 0;
    std::deque<PageCopy> queue;
    std::vector<ByteRange> allowed;
    PayloadHash hash;
    TransferStats stats;
    Writer pages;  // (dst offset, bytes) of each page, in order: DONE's page list.
    std::deque<std::vector<uint8_t>> scratch;  // Corrupted copies (fault injection) until flushed.
    std::function<void(absl::StatusOr<TransferStats>)> done;
    bool finish = false;   // Finish was called.
    bool cancel = false;   // The receiver gave it up.
    bool abort = false;    // Abort was called.
    bool posted = false;   // A put was posted.
    Clock::time_point last_putting{};  // When the receiver was last told puts are coming.
    int64_t stall_ms = 0;  // Fault injection: freeze before the next run of pages.
    bool stalled = false;  // Fault injection: it froze once (its flush is then logged).
    absl::Status status;   // Why, when kFailed.
    Clock::time_point deadline = Clock::time_point::max();
  };
  using OutKey = std::pair<std::string, uint64_t>;
  struct SenderPeer {
    ucp_ep_h ep = nullptr;
    bool detects_failure = true;
    ProcessId process;
  };
  struct FlushContext {
    UcxKvTransport* self;
    OutKey key;
    uint8_t then;  // kDone, kAbort or kCancelled.
  };

  // Progress thread.
  void Loop();
  void Post(std::function<void()> command);
  absl::StatusOr<RemotePeer*> Remote(const std::string& endpoint);
  ucp_ep_h Connect(std::string_view address, bool to_sender, uint64_t id, const ProcessId& peer,
                   bool* detects_failure);
  void SenderLost(uint64_t sender, const absl::Status& why);
  void WatchProcesses();
  void SendAm(ucp_ep_h ep, std::string payload);
  std::string AbortMessage(uint64_t tag, const absl::Status& why) const {
    return Writer()
        .U8(kAbort)
        .U64(id_)
        .U64(tag)
        .U64(static_cast<uint64_t>(why.code()))
        .Str(std::string_view(why.message().data(), why.message().size()))
        .Take();
  }
  void Pump(Outgoing& out);
  void StartFlush(Outgoing& out, uint8_t then);
  void OnFlushed(const OutKey& key, uint8_t then, ucs_status_t status);
  void FailOutgoing(Outgoing& out, absl::Status why);
  void Complete(Outgoing& out, absl::StatusOr<TransferStats> result);
  void DropRemote(const std::string& endpoint, const absl::Status& why);
  void OnEpError(ucp_ep_h ep, ucs_status_t status);
  void CheckDeadlines();
  void Handle(std::string_view message);
  void HandleAsReceiver(uint8_t type, Reader& r);
  void HandleAsSender(uint8_t type, Reader& r);

  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);

  const std::string layout_;
  const int64_t send_timeout_ms_;
  uint64_t id_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_mem_h memh_ = nullptr;
  uint8_t* pool_ = nullptr;
  size_t pool_bytes_ = 0;
  std::string worker_address_;
  std::string endpoint_;
  std::string description_ = "ucx";
  ReceiveTracker tracker_;

  std::mutex recv_mu_;
  absl::flat_hash_map<uint64_t, Incoming> incoming_;

  std::mutex cmd_mu_;
  std::condition_variable cmd_cv_;
  std::deque<std::function<void()>> commands_;
  std::atomic<bool> stop_{false};
  std::thread progress_;

  // Progress thread only.
  std::map<std::string, std::unique_ptr<RemotePeer>> remotes_;
  std::map<OutKey, std::unique_ptr<Outgoing>> outgoing_;
  std::map<uint64_t, SenderPeer> senders_;
  // Which peer an endpoint belongs to, for its error callback.
  std::map<ucp_ep_h, std::pair<bool, std::string>> ep_owner_;  // (is a sender, id or endpoint)
  Clock::time_point next_watch_{};
};

UcxKvTransport::~UcxKvTransport() {
  if (progress_.joinable()) {
    // Goodbye to every peer, a receiver's after a flush of our puts to it, so that peers stop
    // waiting for this transport at once (a process that dies without it is found by its pid).
    auto left = std::make_shared<std::atomic<int>>(0);
    std::mutex mu;
    std::condition_variable cv;
    bool posted = false;
    Post([&, left] {
      for (auto& [endpoint, remote] : remotes_) {
        left->fetch_add(1);
        struct Bye {
          UcxKvTransport* self;
          ucp_ep_h ep;
          std::shared_ptr<std::atomic<int>> left;
        };
        auto* bye = new Bye{this, remote->ep, left};
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = [](void* request, ucs_status_t status, void* user) {
          auto* b = static_cast<Bye*>(user);
          if (status == UCS_OK) b->self->SendAm(b->ep, Writer().U8(kBye).U64(b->self->id_).U64(0).Take());
          b->left->fetch_sub(1);
          delete b;
          ucp_request_free(request);
        };
        p.user_data = bye;
        ucs_status_ptr_t r = ucp_ep_flush_nbx(remote->ep, &p);
        if (r == nullptr) SendAm(remote->ep, Writer().U8(kBye).U64(id_).U64(0).Take());
        if (r == nullptr || UCS_PTR_IS_ERR(r)) {
          left->fetch_sub(1);
          delete bye;
        }
      }
      for (auto& [id, sender] : senders_) {
        SendAm(sender.ep, Writer().U8(kBye).U64(id_).U64(1).Take());
      }
      std::lock_guard<std::mutex> lock(mu);
      posted = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return posted; });
    lock.unlock();
    // Let the flushes and messages go out (bounded).
    const auto until = Clock::now() + std::chrono::milliseconds(500);
    while (left->load() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop_.store(true);
  cmd_cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  if (worker_ != nullptr) {
    // The progress thread is gone: close every endpoint here, forcibly, and wait a little.
    std::vector<ucs_status_ptr_t> closing;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    for (auto& [endpoint, remote] : remotes_) {
      if (remote->rkey != nullptr) ucp_rkey_destroy(remote->rkey);
      if (remote->ep != nullptr) closing.push_back(ucp_ep_close_nbx(remote->ep, &p));
    }
    for (auto& [id, sender] : senders_) {
      if (sender.ep != nullptr) closing.push_back(ucp_ep_close_nbx(sender.ep, &p));
    }
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    for (ucs_status_ptr_t r : closing) {
      if (r == nullptr || UCS_PTR_IS_ERR(r)) continue;
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(r);
    }
    if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
    ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::Status UcxKvTransport::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError("reading the UCX configuration", st);
  // A dead peer is found by UCX's keepalive; its default interval is long next to a KV lease.
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // Only the progress thread touches it.
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return UcxError("ucp_worker_create", st);
  ucp_address_t* address = nullptr;
  size_t length = 0;
  st = ucp_worker_get_address(worker_, &address, &length);
  if (st != UCS_OK) return UcxError("ucp_worker_get_address", st);
  worker_address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker_, address);
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kAmId;
  hp.cb = &UcxKvTransport::OnAm;
  hp.arg = this;
  st = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (st != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", st);
  // The transports UCX may use ("resource N : md M dev D flags -- posix/memory").
  char* text = nullptr;
  size_t size = 0;
  if (FILE* f = open_memstream(&text, &size)) {
    ucp_context_print_info(context_, f);
    std::fclose(f);
    std::vector<std::string> resources;
    for (std::string_view rest(text, size); !rest.empty();) {
      const size_t eol = rest.find('\n');
      std::string_view line = rest.substr(0, eol);
      rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      if (line.find("resource") == std::string_view::npos) continue;
      const size_t last = line.find_last_of(' ');
      if (last != std::string_view::npos) resources.emplace_back(line.substr(last + 1));
    }
    std::free(text);
    description_ = "ucx(";
    for (size_t i = 0; i < resources.size(); ++i) description_ += (i ? "," : "") + resources[i];
    description_ += ")";
  }
  progress_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

absl::Status UcxKvTransport::RegisterPool(uint8_t* base, size_t bytes) {
  // On the progress thread, like every UCX call after Init.
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  absl::Status status;
  std::string rkey;
  Post([&] {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = bytes;
    ucs_status_t st = ucp_mem_map(context_, &mp, &memh_);
    if (st != UCS_OK) {
      status = UcxError("registering the KV pool (ucp_mem_map)", st);
    } else {
      void* packed = nullptr;
      size_t packed_size = 0;
      st = ucp_rkey_pack(context_, memh_, &packed, &packed_size);
      if (st != UCS_OK) {
        status = UcxError("ucp_rkey_pack", st);
      } else {
        rkey.assign(static_cast<const char*>(packed), packed_size);
        ucp_rkey_buffer_release(packed);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished; });
  }
  PD_RETURN_IF_ERROR(status);
  pool_ = base;
  pool_bytes_ = bytes;
  tracker_.SetPool(base, bytes);
  Writer blob;
  blob.Str(kMagic)
      .U64(id_)
      .U64(reinterpret_cast<uint64_t>(base))
      .U64(bytes)
      .Str(layout_)
      .Str(worker_address_)
      .Str(rkey);
  WriteProcess(blob, Self());
  endpoint_ = "ucx:" + HexEncode(blob.Take());
  return absl::OkStatus();
}

void UcxKvTransport::Post(std::function<void()> command) {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.push_back(std::move(command));
  }
  cmd_cv_.notify_one();
}

void UcxKvTransport::Loop() {
  int idle = 0;
  std::deque<std::function<void()>> commands;
  std::vector<OutKey> sending;
  while (!stop_.load()) {
    const unsigned progressed = ucp_worker_progress(worker_);
    {
      std::lock_guard<std::mutex> lock(cmd_mu_);
      commands.swap(commands_);
    }
    const bool had_commands = !commands.empty();
    for (auto& c : commands) c();
    commands.clear();
    sending.clear();
    for (const auto& [key, out] : outgoing_) {
      if (out->state == Outgoing::kSending) sending.push_back(key);
    }
    for (const OutKey& key : sending) {
      auto it = outgoing_.find(key);
      if (it != outgoing_.end()) Pump(*it->second);
    }
    CheckDeadlines();
    WatchProcesses();
    if (progressed != 0 || had_commands) {
      idle = 0;
      continue;
    }
    if (++idle < 64) continue;
    // Nothing happened lately: sleep briefly (shorter while transfers are open), or until a
    // command arrives. UCX needs progress calls for its keepalive, so never sleep long.
    // A sender with puts to post, a flush or a GO outstanding keeps progressing (UCX completes
    // puts and flushes inside progress calls), and so does a receiver whose sender announced its
    // final flush (its acknowledgements pace that flush: 7.8 ms to flush 64 MiB over cma with a
    // polling receiver, 15-33 ms with one that naps). Otherwise nap 1 ms, also while a transfer
    // into this pool is open but its sender is still computing (waking every 50 us for the
    // whole of a prefill took CPU from the engines on this host: TTFT 1.25x serve instead of
    // 0.95x over tcp). UCX's keepalive needs progress calls now and then, so never longer.
    bool busy = false;
    for (const auto& [key, out] : outgoing_) {
      busy |= out->state == Outgoing::kWaitGo || out->state == Outgoing::kFlushing ||
              (out->state == Outgoing::kSending && !out->queue.empty());
    }
    if (!busy) {
      std::lock_guard<std::mutex> lock(recv_mu_);
      const auto now = Clock::now();
      for (const auto& [tag, in] : incoming_) busy |= in.begun && (in.flushing || now < in.hurry_until);
    }
    if (busy) {
      if (idle % 256 == 0) std::this_thread::yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(cmd_mu_);
    cmd_cv_.wait_for(lock, std::chrono::microseconds(1000),
                     [&] { return !commands_.empty() || stop_.load(); });
  }
}

ucp_ep_h UcxKvTransport::Connect(std::string_view address, bool to_sender, uint64_t id,
                                 const ProcessId& peer, bool* detects_failure) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<UcxKvTransport*>(arg)->OnEpError(ep, status);
  };
  p.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t st = UCS_ERR_UNSUPPORTED;
  // On this host: no UCX failure detection, which would rule out the shared-memory transports
  // (UCX 1.13's have no peer-failure handler); the peer's process is watched instead
  // (WatchProcesses) and a closing transport says goodbye. On another host: UCX's own (PEER).
  const bool same_host = SameProcessSpace(peer);
  if (!same_host) st = ucp_ep_create(worker_, &p, &ep);
  *detects_failure = st == UCS_OK;
  if (st != UCS_OK) {
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    p.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
    st = ucp_ep_create(worker_, &p, &ep);
  }
  if (st != UCS_OK) {
    PD_LOG(Warning) << "ucx: cannot create an endpoint: " << ucs_status_string(st);
    return nullptr;
  }
  ep_owner_[ep] = {to_sender, to_sender ? std::to_string(id) : std::string()};
  return ep;
}

absl::StatusOr<UcxKvTransport::RemotePeer*> UcxKvTransport::Remote(const std::string& endpoint) {
  auto it = remotes_.find(endpoint);
  if (it != remotes_.end()) return it->second.get();
  PD_ASSIGN_OR_RETURN(PeerInfo info, ParseEndpoint(endpoint));
  PD_RETURN_IF_ERROR(CheckLayouts(layout_, info.layout));
  auto remote = std::make_unique<RemotePeer>();
  remote->info = std::move(info);
  remote->ep = Connect(remote->info.worker_address, false, 0, remote->info.process,
                       &remote->detects_failure);
  if (remote->ep == nullptr) return absl::UnavailableError("ucx: cannot reach the KV peer");
  ep_owner_[remote->ep].second = endpoint;
  const ucs_status_t st = ucp_ep_rkey_unpack(remote->ep, remote->info.rkey.data(), &remote->rkey);
  if (st != UCS_OK) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(remote->ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
    ep_owner_.erase(remote->ep);
    return UcxError("unpacking the peer's remote key", st);
  }
  if (MinLogLevel() <= LogLevel::kDebug) {
    char* text = nullptr;
    size_t size = 0;
    if (FILE* f = open_memstream(&text, &size)) {
      ucp_ep_print_info(remote->ep, f);
      std::fclose(f);
      PD_LOG(Debug) << "ucx: endpoint to a KV peer:\n" << std::string_view(text, size);
      std::free(text);
    }
  }
  RemotePeer* out = remote.get();
  remotes_.emplace(endpoint, std::move(remote));
  return out;
}

void UcxKvTransport::SendAm(ucp_ep_h ep, std::string payload) {
  auto* buffer = new std::string(std::move(payload));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = [](void* request, ucs_status_t, void* user) {
    delete static_cast<std::string*>(user);
    ucp_request_free(request);
  };
  p.user_data = buffer;
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, kAmId, nullptr, 0, buffer->data(), buffer->size(), &p);
  if (r == nullptr) {
    delete buffer;
  } else if (UCS_PTR_IS_ERR(r)) {
    PD_LOG(Warning) << "ucx: sending a control message failed: "
                    << ucs_status_string(UCS_PTR_STATUS(r));
    delete buffer;
  }
}

ucs_status_t UcxKvTransport::OnAm(void* arg, const void*, size_t, void* data, size_t length,
                                  const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxKvTransport*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    // A large message (a long page list): fetch it, then handle it.
    struct Pending {
      UcxKvTransport* self;
      std::string data;
    };
    auto* pending = new Pending{self, std::string(length, '\0')};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user) {
      auto* pending = static_cast<Pending*>(user);
      if (status == UCS_OK) {
        pending->self->Post([self = pending->self, msg = std::move(pending->data)] { self->Handle(msg); });
      }
      delete pending;
      ucp_request_free(request);
    };
    p.user_data = pending;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->worker_, data, pending->data.data(), length, &p);
    if (r == nullptr) {
      self->Post([self, msg = std::move(pending->data)] { self->Handle(msg); });
      delete pending;
    } else if (UCS_PTR_IS_ERR(r)) {
      delete pending;
    }
    return UCS_OK;
  }
  // Handled outside UCX's callback (it may create endpoints and send).
  self->Post([self, msg = std::string(static_cast<const char*>(data), length)] { self->Handle(msg); });
  return UCS_OK;
}

void UcxKvTransport::Handle(std::string_view message) {
  Reader r(message);
  const uint8_t type = r.U8();
  if (type == kBye) {
    const uint64_t id = r.U64();
    const uint64_t role = r.U64();
    if (!r.ok()) return;
    if (role == 0) return SenderLost(id, absl::UnavailableError("KV sender closed"));
    std::string endpoint;
    for (const auto& [e, remote] : remotes_) {
      if (remote->info.receiver_id == id) endpoint = e;
    }
    if (!endpoint.empty()) DropRemote(endpoint, absl::UnavailableError("KV peer closed"));
    return;
  }
  if (type == kFlushing || type == kPutting) {
    const uint64_t sender = r.U64();
    const uint64_t tag = r.U64();
    std::lock_guard<std::mutex> lock(recv_mu_);
    auto it = incoming_.find(tag);
    if (!r.ok() || it == incoming_.end() || it->second.sender != sender) return;
    if (type == kFlushing) {
      it->second.flushing = true;
    } else {
      it->second.hurry_until = Clock::now() + std::chrono::milliseconds(2);
    }
    return;
  }
  if (type == kBegin || type == kDone || type == kAbort || type == kCancelled) {
    HandleAsReceiver(type, r);
  } else {
    HandleAsSender(type, r);
  }
}

void UcxKvTransport::HandleAsReceiver(uint8_t type, Reader& r) {
  const uint64_t sender = r.U64();
  const uint64_t tag = r.U64();
  if (!r.ok()) return;
  std::function<void()> quiesced;
  if (type == kBegin) {
    const std::string_view address = r.Bytes();
    ProcessId process = ReadProcess(r);
    if (!r.ok()) return;
    SenderPeer& peer = senders_[sender];
    if (peer.ep == nullptr) {
      peer.ep = Connect(address, true, sender, process, &peer.detects_failure);
      peer.process = std::move(process);
    }
    if (peer.ep == nullptr) {
      senders_.erase(sender);
      return;
    }
    Writer reply;
    {
      std::lock_guard<std::mutex> lock(recv_mu_);
      auto it = incoming_.find(tag);
      if (it == incoming_.end() || it->second.released ||
          (it->second.begun && it->second.sender != sender)) {
        reply.U8(kRefuse).U64(id_).U64(tag).Str(Str("transfer tag ", tag, " is not expected here"));
      } else {
        it->second.begun = true;
        it->second.sender = sender;
        const std::vector<ByteRange> allowed = tracker_.Allowed(tag);
        reply.U8(kGo).U64(id_).U64(tag).U64(allowed.size());
        for (const ByteRange& range : allowed) reply.U64(range.begin).U64(range.end);
      }
    }
    SendAm(peer.ep, reply.Take());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(recv_mu_);
    auto it = incoming_.find(tag);
    if (it == incoming_.end() || !it->second.begun || it->second.sender != sender) return;
    Incoming& in = it->second;
    if (in.released) {
      // Given up here; the sender flushed before any of these: nothing of it can land any more.
      quiesced = std::move(in.quiesced);
      incoming_.erase(it);
    } else if (type == kCancelled) {
      return;
    } else {
      in.begun = false;  // Finished: a later ReleaseUnfinished has nothing to wait for.
      in.released = false;
      in.sender = 0;
    }
  }
  if (quiesced) {
    quiesced();
    return;
  }
  if (type == kAbort) {
    // The sender's reason (a page outside the reservation: PermissionDenied, as tcp reports it).
    const uint64_t code = r.U64();
    const std::string_view message = r.Bytes();
    absl::Status why(static_cast<absl::StatusCode>(code), absl::string_view(message.data(), message.size()));
    if (!r.ok() || why.ok()) why = absl::AbortedError(Str("transfer ", tag, " aborted by sender"));
    tracker_.Fail(tag, why);
    return;
  }
  // kDone: hash the listed pages where they landed, in the sender's order, and compare.
  TransferStats sent;
  sent.pages = static_cast<int64_t>(r.U64());
  sent.bytes = static_cast<int64_t>(r.U64());
  sent.checksum = r.U64();
  Reader list(r.Bytes());
  if (!r.ok()) {
    tracker_.Fail(tag, absl::DataLossError(Str("transfer ", tag, ": malformed end message")));
    return;
  }
  while (list.left() > 0) {
    const uint64_t offset = list.U64();
    const uint64_t len = list.U64();
    if (!list.ok()) break;
    auto dst = tracker_.PageDestination(tag, offset, len, sender);
    if (!dst.ok()) return;  // The tracker failed the transfer (outside its blocks).
    tracker_.PageArrived(tag, *dst, len);
  }
  tracker_.Finish(tag, sent);
}

void UcxKvTransport::HandleAsSender(uint8_t type, Reader& r) {
  const uint64_t receiver = r.U64();
  const uint64_t tag = r.U64();
  if (!r.ok()) return;
  std::string endpoint;
  for (const auto& [e, remote] : remotes_) {
    if (remote->info.receiver_id == receiver) endpoint = e;
  }
  auto it = outgoing_.find({endpoint, tag});
  if (endpoint.empty() || it == outgoing_.end()) return;
  Outgoing& out = *it->second;
  RemotePeer* peer = remotes_[endpoint].get();
  if (type == kGo) {
    if (out.state != Outgoing::kWaitGo) return;
    const uint64_t n = r.U64();
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
      const uint64_t begin = r.U64();
      out.allowed.push_back({begin, r.U64()});
    }
    if (!r.ok()) return FailOutgoing(out, absl::DataLossError("ucx: malformed GO message"));
    out.state = Outgoing::kSending;
    out.deadline = Clock::time_point::max();  // Pages come as the prefill computes them.
    return;
  }
  if (type == kRefuse) {
    const std::string_view why = r.Bytes();
    return FailOutgoing(out, absl::FailedPreconditionError(Str("KV peer refused the transfer: ", why)));
  }
  if (type == kCancel) {
    out.cancel = true;
    if (out.state == Outgoing::kWaitGo) {
      SendAm(peer->ep, Writer().U8(kCancelled).U64(id_).U64(tag).Take());
      return Complete(out, absl::CancelledError("the KV receiver gave the transfer up"));
    }
    if (out.state == Outgoing::kFailed) {
      SendAm(peer->ep, Writer().U8(kCancelled).U64(id_).U64(tag).Take());
    }
    // kSending: Pump flushes, then answers; kFlushing: DONE or ABORT follows the flush.
  }
}

void UcxKvTransport::Pump(Outgoing& out) {
  if (out.cancel || out.abort) {
    out.queue.clear();
    return StartFlush(out, out.cancel ? kCancelled : kAbort);
  }
  RemotePeer* peer = remotes_[out.peer].get();
  if (!out.queue.empty()) {
    const auto now = Clock::now();
    if (now - out.last_putting > std::chrono::milliseconds(1)) {
      SendAm(peer->ep, Writer().U8(kPutting).U64(id_).U64(out.tag).Take());
      out.last_putting = now;
    }
  }
  while (!out.queue.empty()) {
    // A run of pages contiguous on both sides becomes one put.
    size_t n = 1;
    uint64_t run = out.queue[0].bytes;
    while (n < out.queue.size() && run + out.queue[n].bytes <= kMaxPutBytes &&
           out.queue[n].src_offset == out.queue[0].src_offset + run &&
           out.queue[n].dst_offset == out.queue[0].dst_offset + run) {
      run += out.queue[n].bytes;
      ++n;
    }
    std::vector<size_t> corrupted;
    if (out.stall_ms > 0) {
      // Tests only: the sending process freezes before this page (earlier puts were posted and
      // still land). Tests wait for this line to know the transfer is under way and stalled.
      PD_LOG(Warning) << "fault injection: KV transfer " << out.tag << " stalls " << out.stall_ms
                      << " ms after its first " << out.stats.pages << " pages";
      std::this_thread::sleep_for(std::chrono::milliseconds(out.stall_ms));
      out.stall_ms = 0;
      out.stalled = true;
    }
    for (size_t i = 0; i < n; ++i) {
      const PageCopy& page = out.queue[i];
      // The remote key covers the whole pool: refuse a copy outside the announced blocks before
      // it is posted.
      if (page.src_offset + page.bytes > pool_bytes_ || page.src_offset + page.bytes < page.src_offset ||
          page.dst_offset + page.bytes > peer->info.bytes || !RangesContain(out.allowed, page.dst_offset, page.bytes)) {
        out.status = absl::PermissionDeniedError(
            Str("transfer ", out.tag, ": page [", page.dst_offset, ", ", page.dst_offset + page.bytes,
                ") is outside the blocks reserved for it"));
        out.abort = true;
        out.queue.clear();
        return StartFlush(out, kAbort);
      }
      if (const int64_t stall = StallBeforeNextPageMs(); stall > 0) {  // Tests only.
        out.stall_ms = stall;
        if (i > 0) {  // Post the pages before it first; stall before the next run.
          n = i;
          run = 0;
          for (size_t k = 0; k < n; ++k) run += out.queue[k].bytes;
          break;
        }
        PD_LOG(Warning) << "fault injection: KV transfer " << out.tag << " stalls " << stall
                        << " ms after its first " << out.stats.pages << " pages";
        std::this_thread::sleep_for(std::chrono::milliseconds(stall));
        out.stall_ms = 0;
        out.stalled = true;
      }
      out.hash.Update(pool_ + page.src_offset, page.bytes);
      ++out.stats.pages;
      out.stats.bytes += static_cast<int64_t>(page.bytes);
      out.pages.U64(page.dst_offset).U64(page.bytes);
      if (ShouldCorruptNextPage()) corrupted.push_back(i);  // Tests only.
    }
    auto put = [&](const void* src, uint64_t bytes, uint64_t dst) {
      ucp_request_param_t p{};
      ucs_status_ptr_t req = ucp_put_nbx(peer->ep, src, bytes, peer->info.base + dst, peer->rkey, &p);
      if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
      if (req != nullptr) ucp_request_free(req);  // Completes on its own; the flush waits for it.
      return UCS_OK;
    };
    ucs_status_t st = UCS_OK;
    if (corrupted.empty()) {
      st = put(pool_ + out.queue[0].src_offset, run, out.queue[0].dst_offset);
    } else {
      for (size_t i = 0; i < n && st == UCS_OK; ++i) {
        const PageCopy& page = out.queue[i];
        const uint8_t* src = pool_ + page.src_offset;
        if (std::find(corrupted.begin(), corrupted.end(), i) != corrupted.end()) {
          out.scratch.emplace_back(src, src + page.bytes);
          out.scratch.back()[page.bytes / 2] ^= 0x5a;
          src = out.scratch.back().data();
        }
        st = put(src, page.bytes, page.dst_offset);
      }
    }
    out.posted = true;
    out.queue.erase(out.queue.begin(), out.queue.begin() + static_cast<ptrdiff_t>(n));
    if (st != UCS_OK) return FailOutgoing(out, UcxError("put", st));
  }
  if (out.finish) StartFlush(out, kDone);
}

void UcxKvTransport::StartFlush(Outgoing& out, uint8_t then) {
  RemotePeer* peer = remotes_[out.peer].get();
  out.state = Outgoing::kFlushing;
  SendAm(peer->ep, Writer().U8(kFlushing).U64(id_).U64(out.tag).Take());
  if (send_timeout_ms_ > 0) out.deadline = Clock::now() + std::chrono::milliseconds(send_timeout_ms_);
  auto* ctx = new FlushContext{this, {out.peer, out.tag}, then};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = [](void* request, ucs_status_t status, void* user) {
    auto* c = static_cast<FlushContext*>(user);
    c->self->OnFlushed(c->key, c->then, status);
    delete c;
    ucp_request_free(request);
  };
  p.user_data = ctx;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(peer->ep, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    const OutKey key = ctx->key;
    delete ctx;
    OnFlushed(key, then, r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
  }
}

void UcxKvTransport::OnFlushed(const OutKey& key, uint8_t then, ucs_status_t status) {
  auto it = outgoing_.find(key);
  if (it == outgoing_.end() || it->second->state != Outgoing::kFlushing) return;
  Outgoing& out = *it->second;
  if (status != UCS_OK) return FailOutgoing(out, UcxError("flush", status));
  RemotePeer* peer = remotes_[out.peer].get();
  // Every put before this point has landed: the receiver may trust the pool, or reuse it.
  if (out.stalled) {  // Tests only: the late puts of a stalled transfer have landed.
    PD_LOG(Warning) << "fault injection: KV transfer " << out.tag << " flushed " << out.stats.pages
                    << " pages after its stall";
  }
  if (then == kDone && out.cancel) then = kCancelled;
  if (then == kDone && out.abort) then = kAbort;
  if (then == kDone) {
    TransferStats stats = out.stats;
    stats.checksum = out.hash.Digest();
    SendAm(peer->ep, Writer()
                         .U8(kDone)
                         .U64(id_)
                         .U64(out.tag)
                         .U64(static_cast<uint64_t>(stats.pages))
                         .U64(static_cast<uint64_t>(stats.bytes))
                         .U64(stats.checksum)
                         .Str(out.pages.Take())
                         .Take());
    return Complete(out, stats);
  }
  if (then == kCancelled) {
    SendAm(peer->ep, Writer().U8(kCancelled).U64(id_).U64(out.tag).Take());
    return Complete(out, absl::CancelledError("the KV receiver gave the transfer up"));
  }
  const absl::Status why = out.status.ok() ? absl::AbortedError(Str("transfer ", out.tag, " aborted by sender"))
                                           : out.status;
  SendAm(peer->ep, AbortMessage(out.tag, why));
  Complete(out, why);
}

void UcxKvTransport::FailOutgoing(Outgoing& out, absl::Status why) {
  out.queue.clear();
  Complete(out, std::move(why));
}

void UcxKvTransport::Complete(Outgoing& out, absl::StatusOr<TransferStats> result) {
  if (out.done) {
    auto done = std::move(out.done);
    outgoing_.erase({out.peer, out.tag});
    done(std::move(result));
    return;
  }
  // Finish not called yet: keep the outcome for it (or for Abort), for a minute at most.
  out.state = Outgoing::kFailed;
  out.status = result.ok() ? absl::CancelledError("transfer ended") : result.status();
  out.queue.clear();
  out.deadline = Clock::now() + std::chrono::seconds(60);
}

void UcxKvTransport::DropRemote(const std::string& endpoint, const absl::Status& why) {
  std::vector<OutKey> keys;
  for (const auto& [key, out] : outgoing_) {
    if (key.first == endpoint) keys.push_back(key);
  }
  for (const OutKey& key : keys) {
    auto it = outgoing_.find(key);
    if (it == outgoing_.end()) continue;
    if (it->second->state == Outgoing::kFailed) {
      outgoing_.erase(it);
    } else {
      FailOutgoing(*it->second, why);
    }
  }
  auto it = remotes_.find(endpoint);
  if (it == remotes_.end()) return;
  std::unique_ptr<RemotePeer> remote = std::move(it->second);
  remotes_.erase(it);
  if (remote->rkey != nullptr) ucp_rkey_destroy(remote->rkey);
  ep_owner_.erase(remote->ep);
  // Closing forcibly tells the receiver (its endpoint to us fails): it stops waiting for us.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(remote->ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
}

void UcxKvTransport::OnEpError(ucp_ep_h ep, ucs_status_t status) {
  // Called inside ucp_worker_progress: act on it from the command queue.
  Post([this, ep, status] {
    auto owner = ep_owner_.find(ep);
    if (owner == ep_owner_.end()) return;
    const auto [is_sender, name] = owner->second;
    if (!is_sender) {
      DropRemote(name, absl::UnavailableError(Str("KV peer lost: ", ucs_status_string(status))));
      return;
    }
    SenderLost(std::stoull(name),
               absl::UnavailableError(Str("KV sender lost: ", ucs_status_string(status))));
  });
}

void UcxKvTransport::SenderLost(uint64_t sender, const absl::Status& why) {
  // A sender of ours is gone: its transfers fail, and nothing more of it can land.
  auto peer = senders_.find(sender);
  if (peer == senders_.end()) return;
  ucp_ep_h ep = peer->second.ep;
  senders_.erase(peer);
  ep_owner_.erase(ep);
  std::vector<std::function<void()>> quiesced;
  std::vector<uint64_t> failed;
  {
    std::lock_guard<std::mutex> lock(recv_mu_);
    for (auto it = incoming_.begin(); it != incoming_.end();) {
      Incoming& in = it->second;
      if (!in.begun || in.sender != sender) {
        ++it;
        continue;
      }
      if (in.released) {
        quiesced.push_back(std::move(in.quiesced));
        incoming_.erase(it++);
      } else {
        failed.push_back(it->first);
        in.begun = false;
        in.sender = 0;
        ++it;
      }
    }
  }
  for (uint64_t tag : failed) tracker_.Fail(tag, why);
  for (auto& q : quiesced) {
    if (q) q();
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
}

void UcxKvTransport::WatchProcesses() {
  const auto now = Clock::now();
  if (now < next_watch_) return;
  next_watch_ = now + std::chrono::milliseconds(100);
  std::vector<uint64_t> lost_senders;
  for (const auto& [id, peer] : senders_) {
    if (!peer.detects_failure && !MaybeAlive(peer.process)) lost_senders.push_back(id);
  }
  for (uint64_t id : lost_senders) {
    SenderLost(id, absl::UnavailableError("KV sender lost: its process exited"));
  }
  std::vector<std::string> lost_receivers;
  for (const auto& [endpoint, remote] : remotes_) {
    if (!remote->detects_failure && !MaybeAlive(remote->info.process)) lost_receivers.push_back(endpoint);
  }
  for (const std::string& endpoint : lost_receivers) {
    DropRemote(endpoint, absl::UnavailableError("KV peer lost: its process exited"));
  }
}

void UcxKvTransport::CheckDeadlines() {
  if (outgoing_.empty()) return;
  const auto now = Clock::now();
  std::vector<std::string> stalled;
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    Outgoing& out = *it->second;
    if (now > out.deadline) {
      if (out.state == Outgoing::kFailed) {
        outgoing_.erase(it++);
        continue;
      }
      stalled.push_back(out.peer);
    }
    ++it;
  }
  for (const std::string& endpoint : stalled) {
    DropRemote(endpoint, absl::DeadlineExceededError(
                             Str("KV peer accepted nothing for ", send_timeout_ms_, " ms")));
  }
}

bool UcxKvTransport::ReleaseUnfinished(uint64_t tag, std::function<void()> quiesced) {
  tracker_.Release(tag);
  uint64_t sender = 0;
  {
    std::lock_guard<std::mutex> lock(recv_mu_);
    auto it = incoming_.find(tag);
    if (it == incoming_.end()) return true;
    Incoming& in = it->second;
    if (!in.begun) {
      // Never begun (a later BEGIN is refused), finished, or its sender is gone.
      incoming_.erase(it);
      return true;
    }
    if (in.released) return false;
    in.released = true;
    in.quiesced = std::move(quiesced);
    sender = in.sender;
  }
  Post([this, sender, tag] {
    auto it = senders_.find(sender);
    if (it != senders_.end()) SendAm(it->second.ep, Writer().U8(kCancel).U64(id_).U64(tag).Take());
  });
  return false;
}

absl::Status UcxKvTransport::Submit(const std::string& peer, uint64_t tag,
                                    absl::Span<const PageCopy> pages) {
  // Refused here, as tcp's handshake would: a malformed endpoint, another KV layout.
  PD_ASSIGN_OR_RETURN(const PeerInfo info, ParseEndpoint(peer));
  PD_RETURN_IF_ERROR(CheckLayouts(layout_, info.layout));
  Post([this, peer, tag, copies = std::vector<PageCopy>(pages.begin(), pages.end())] {
    std::unique_ptr<Outgoing>& slot = outgoing_[{peer, tag}];
    if (!slot) {
      slot = std::make_unique<Outgoing>();
      slot->peer = peer;
      slot->tag = tag;
      auto remote = Remote(peer);
      if (!remote.ok()) return FailOutgoing(*slot, remote.status());
      Writer begin;
      begin.U8(kBegin).U64(id_).U64(tag).Str(worker_address_);
      WriteProcess(begin, Self());
      SendAm((*remote)->ep, begin.Take());
      if (send_timeout_ms_ > 0) slot->deadline = Clock::now() + std::chrono::milliseconds(send_timeout_ms_);
    }
    if (slot->state == Outgoing::kFailed) return;
    slot->queue.insert(slot->queue.end(), copies.begin(), copies.end());
  });
  return absl::OkStatus();
}

void UcxKvTransport::Finish(const std::string& peer, uint64_t tag,
                            std::function<void(absl::StatusOr<TransferStats>)> done) {
  Post([this, peer, tag, done = std::move(done)]() mutable {
    auto it = outgoing_.find({peer, tag});
    if (it == outgoing_.end()) {
      // No page was submitted: announce the (empty) transfer now.
      const absl::Status submitted = Submit(peer, tag, {});
      if (!submitted.ok()) return done(submitted);
      // Submit queued the BEGIN behind this command: finish after it.
      return Post([this, peer, tag, done = std::move(done)]() mutable {
        Finish(peer, tag, std::move(done));
      });
    }
    Outgoing& out = *it->second;
    if (out.state == Outgoing::kFailed) {
      const absl::Status why = out.status;
      outgoing_.erase(it);
      return done(why);
    }
    out.finish = true;
    out.done = std::move(done);
  });
}

void UcxKvTransport::Abort(const std::string& peer, uint64_t tag) {
  Post([this, peer, tag] {
    auto it = outgoing_.find({peer, tag});
    if (it == outgoing_.end()) return;
    Outgoing& out = *it->second;
    if (out.state == Outgoing::kFailed) {
      outgoing_.erase(it);
      return;
    }
    out.abort = true;
    if (out.state == Outgoing::kWaitGo) {
      // Nothing was put: say so at once.
      auto remote = remotes_.find(peer);
      if (remote != remotes_.end()) {
        SendAm(remote->second->ep, AbortMessage(tag, absl::AbortedError(Str("transfer ", tag, " aborted by sender"))));
      }
      FailOutgoing(out, absl::AbortedError(Str("transfer ", tag, " aborted")));
    }
    // kSending: Pump flushes and sends ABORT; kFlushing: ABORT follows the flush.
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxKvTransport(const KvTransportOptions& options) {
  auto t = std::make_unique<UcxKvTransport>(options);
  PD_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<KvTransport>(std::move(t));
}

}  // namespace pdserve
