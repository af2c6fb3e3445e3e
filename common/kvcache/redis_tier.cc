#include "common/kvcache/redis_tier.h"

#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <hiredis/hiredis.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <xxhash.h>

#include "common/base/log.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr char kMagic[8] = {'P', 'D', 'K', 'V', 'R', 'D', 'S', '1'};

struct Header {
  char magic[8];
  uint64_t payload_bytes;
  uint64_t checksum;  // XXH3-64 of the payload.
  uint64_t key[4];    // model.lo, model.hi, block.lo, block.hi.
  uint8_t hmac[32];   // HMAC-SHA256 of the header (this field zero) and payload; zero without a key.
  uint64_t reserved;
};
static_assert(sizeof(Header) == RedisTier::kHeaderBytes);

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval Tv(int ms) { return {ms / 1000, static_cast<suseconds_t>(ms % 1000) * 1000}; }

void Mac(const std::string& key, const Header& h, absl::Span<const uint8_t> payload, uint8_t out[32]) {
  Header zeroed = h;
  std::memset(zeroed.hmac, 0, sizeof zeroed.hmac);
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  size_t len = 0;
  EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params);
  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(&zeroed), sizeof zeroed);
  EVP_MAC_update(ctx, payload.data(), payload.size());
  EVP_MAC_final(ctx, out, &len, 32);
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
}

// While a LoadRun reads its GET replies, a connection's reader hands each bulk string straight
// to the run, which checks it and copies the block into the pool from the reader's own buffer: no
// reply object of a block's size is allocated (a few hundred KB each, every one a fresh mmap or a
// trimmed heap's page faults: most of a load's time).
struct LoadReplies {
  enum Result { kNone, kString, kOther };
  absl::FunctionRef<void(std::string_view)>* consume = nullptr;  // Null: drained, not used.
  Result result = kNone;
  bool moved = false;  // A MOVED or ASK error: Redis Cluster's slots moved.
};
int kReplySentinel;  // Every reply "object" of a load: the result is in LoadReplies.

void* LoadString(const redisReadTask* task, char* str, size_t len) {
  auto* ctx = static_cast<LoadReplies*>(task->privdata);
  if (task->type != REDIS_REPLY_STRING || task->parent != nullptr || len == 0) {
    ctx->result = LoadReplies::kOther;  // An error reply (OOM, NOAUTH, ...), or no value (empty).
    const std::string_view s(str, len);
    if (task->type == REDIS_REPLY_ERROR && (s.substr(0, 6) == "MOVED " || s.substr(0, 4) == "ASK ")) {
      ctx->moved = true;
    }
  } else {
    ctx->result = LoadReplies::kString;
    if (ctx->consume != nullptr) (*ctx->consume)(std::string_view(str, len));
  }
  return &kReplySentinel;
}
void* LoadArray(const redisReadTask* task, int) {
  static_cast<LoadReplies*>(task->privdata)->result = LoadReplies::kOther;
  return &kReplySentinel;
}
void* LoadInteger(const redisReadTask* task, long long) {
  static_cast<LoadReplies*>(task->privdata)->result = LoadReplies::kOther;
  return &kReplySentinel;
}
void* LoadNil(const redisReadTask* task) {
  static_cast<LoadReplies*>(task->privdata)->result = LoadReplies::kOther;
  return &kReplySentinel;
}
void LoadFree(void*) {}
redisReplyObjectFunctions kLoadFunctions = {LoadString, LoadArray, LoadInteger, LoadNil, LoadFree};

}  // namespace

absl::Status ParseRedisUrl(std::string_view url, RedisTierOptions* options) {
  std::string_view rest;
  bool matched = false;
  for (const bool tls : {false, true}) {
    for (const bool cluster : {false, true}) {
      const std::string scheme = Str(tls ? "rediss" : "redis", cluster ? "+cluster" : "", "://");
      if (matched || url.substr(0, scheme.size()) != scheme) continue;
      rest = url.substr(scheme.size());
      options->cluster = cluster;
      options->tls = tls;
      matched = true;
    }
  }
  if (!matched) {
    return absl::InvalidArgumentError(Str("--kv-store: '", url,
                                          "' is not redis://HOST:PORT[,HOST:PORT...] or redis+cluster://HOST:PORT[,...] "
                                          "(rediss:// and rediss+cluster:// over TLS)"));
  }
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  options->servers.clear();
  for (size_t start = 0; start <= rest.size();) {
    size_t end = rest.find(',', start);
    if (end == std::string_view::npos) end = rest.size();
    const std::string_view server = rest.substr(start, end - start);
    const size_t colon = server.rfind(':');
    int port = 0;
    if (colon == std::string_view::npos || colon == 0 ||
        std::sscanf(std::string(server.substr(colon + 1)).c_str(), "%d", &port) != 1 || port <= 0 || port > 65535 ||
        Str(port) != server.substr(colon + 1)) {
      return absl::InvalidArgumentError(Str("--kv-store: server '", server, "' is not HOST:PORT"));
    }
    options->servers.emplace_back(server);
    start = end + 1;
  }
  if (options->servers.size() > 64) return absl::InvalidArgumentError("--kv-store: at most 64 servers");
  return absl::OkStatus();
}

absl::Status ReadRedisPasswordFile(const std::string& path, RedisTierOptions* options) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(Str("--kv-store-password-file: cannot read '", path, "'"));
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) return absl::InvalidArgumentError(Str("--kv-store-password-file: '", path, "' is empty"));
  const size_t colon = line.find(':');
  if (colon == std::string::npos) {
    options->password = line;
  } else {
    options->user = line.substr(0, colon);
    options->password = line.substr(colon + 1);
  }
  return absl::OkStatus();
}

RedisTier::RedisTier(const RedisTierOptions& options)
    : options_(options),
      servers_(options.servers),
      conns_(options.servers.size(), nullptr),
      retry_after_(options.servers.size()) {}

RedisTier::~RedisTier() {
  for (redisContext* c : conns_) {
    if (c != nullptr) redisFree(c);
  }
}

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::Open(const RedisTierOptions& options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("--kv-store: no server");
  if (options.timeout_ms <= 0 || options.timeout_ms > 600000) {
    return absl::InvalidArgumentError("--kv-store-timeout-ms: must be in (0, 600000]");
  }
  std::unique_ptr<RedisTier> tier(new RedisTier(options));
  if (options.tls) {
    auto tls = RedisTls::Create(options.tls_options);
    if (!tls.ok()) return tls.status();
    tier->tls_ = std::move(*tls);
  } else if (!options.tls_options.ca_file.empty() || !options.tls_options.cert_file.empty()) {
    return absl::InvalidArgumentError("--kv-store-tls-ca/-cert/-key: need a rediss:// --kv-store");
  }
  std::lock_guard<std::mutex> lock(tier->io_mu_);
  for (size_t i = 0; i < options.servers.size(); ++i) {
    absl::Status s = tier->Connect(i);
    if (s.ok()) continue;
    // A server that refuses us (AUTH, ACL) is a configuration to fix: refused. One out of reach
    // may come up later (a store starting beside the workers): served without, tried again.
    if (!absl::IsUnavailable(s)) return s;
    PD_LOG(Warning) << s.message() << "; serving without it, trying it again every second";
    tier->retry_after_[i] = Clock::now() + std::chrono::seconds(1);
  }
  if (options.cluster) {
    tier->RefreshSlotsLocked(/*force=*/true);
    if (tier->slot_node_.empty()) {
      PD_LOG(Warning) << "--kv-store: no Redis Cluster node answered CLUSTER SLOTS; serving without the store, "
                         "asking again every second";
    }
  }
  return tier;
}

redisContext* RedisTier::OpenConnection(const std::string& server, absl::Status* status) {
  const size_t colon = server.rfind(':');
  const std::string host = server.substr(0, colon);
  const int port = std::atoi(server.c_str() + colon + 1);
  redisContext* c = nullptr;
  // Unavailable: out of reach (tried again later); FailedPrecondition: it refused us.
  const auto fail = [&](std::string_view why, bool refused = false) -> redisContext* {
    const std::string m = Str("--kv-store: redis ", server, ": ", why);
    *status = refused ? absl::FailedPreconditionError(m) : absl::UnavailableError(m);
    if (c != nullptr) redisFree(c);
    return nullptr;
  };
  if (tls_ != nullptr) {
    auto fd = tls_->Connect(host, port, options_.timeout_ms);
    if (!fd.ok()) {
      *status = absl::Status(fd.status().code(), Str("--kv-store: ", fd.status().message()));
      return nullptr;
    }
    c = redisConnectFd(*fd);  // hiredis owns the bridge's clear end from here.
  } else {
    c = redisConnectWithTimeout(host.c_str(), port, Tv(options_.timeout_ms));
  }
  if (c == nullptr) return fail("cannot allocate a connection");
  if (c->err != 0) return fail(c->errstr);
  redisSetTimeout(c, Tv(options_.timeout_ms));
  // Keep the reader's buffer between replies: hiredis frees it when idle past 16 KB, and growing
  // it again for each block of a few hundred KB costs its page faults every time.
  c->reader->maxbuf = 0;
  if (!options_.password.empty()) {
    Reply r(static_cast<redisReply*>(
        options_.user.empty()
            ? redisCommand(c, "AUTH %b", options_.password.data(), options_.password.size())
            : redisCommand(c, "AUTH %b %b", options_.user.data(), options_.user.size(), options_.password.data(),
                           options_.password.size())));
    if (r == nullptr) return fail(c->errstr);
    if (r->type == REDIS_REPLY_ERROR) return fail(Str("AUTH: ", std::string_view(r->str, r->len)), true);
  }
  *status = absl::OkStatus();
  return c;
}

absl::Status RedisTier::Connect(size_t shard) {
  absl::Status s;
  redisContext* c = OpenConnection(servers_[shard], &s);
  if (c == nullptr) return s;
  Reply r(static_cast<redisReply*>(redisCommand(c, "PING")));
  if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
    const std::string m = Str("--kv-store: redis ", servers_[shard], ": PING: ",
                              r == nullptr ? std::string(c->errstr) : std::string(r->str, r->len));
    redisFree(c);
    return r == nullptr ? absl::UnavailableError(m) : absl::FailedPreconditionError(m);
  }
  conns_[shard] = c;
  return absl::OkStatus();
}

redisContext* RedisTier::Connection(size_t shard) {
  if (conns_[shard] != nullptr) return conns_[shard];
  // A server out of reach is tried again after a second, not by every call: a blackholed one
  // would otherwise cost each request the connect timeout.
  const auto now = Clock::now();
  if (now < retry_after_[shard] || !Connect(shard).ok()) {
    if (now >= retry_after_[shard]) retry_after_[shard] = now + std::chrono::seconds(1);
    CountError();
    return nullptr;
  }
  // A new connection may be to a server restarted empty: what this process knew it held is
  // forgotten, so its blocks are stored again (SET NX costs nothing where they are still there).
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = known_.begin(); it != known_.end();) {
    if (Shard(*it) == shard) {
      known_.erase(it++);
    } else {
      ++it;
    }
  }
  return conns_[shard];
}

void RedisTier::CountError() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.errors;
}

void RedisTier::Drop(size_t shard) {
  CountError();
  if (conns_[shard] != nullptr) redisFree(conns_[shard]);
  conns_[shard] = nullptr;
}

size_t RedisTier::Shard(const KvTierKey& key) const {
  if (!options_.cluster) return static_cast<size_t>(key.block.lo % conns_.size());
  if (slot_node_.empty()) return 0;  // Not known yet: a seed, which answers MOVED (a refresh).
  return slot_node_[KeySlot(RedisKey(key))];
}

uint16_t RedisTier::KeySlot(std::string_view key) {
  // The hash tag: the part between the first '{' and the next '}', when not empty.
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  uint16_t crc = 0;  // CRC16-XMODEM: polynomial 0x1021, initial 0.
  for (const char ch : key) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(ch)) << 8;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : static_cast<uint16_t>(crc << 1);
  }
  return crc & 16383;
}

void RedisTier::RefreshSlotsLocked(bool force) {
  const auto now = Clock::now();
  if (!force && now < next_refresh_) return;
  next_refresh_ = now + std::chrono::seconds(1);
  refresh_slots_ = false;
  // Ask the masters known so far, then the seeds.
  std::vector<std::string> ask = servers_;
  for (const std::string& seed : options_.servers) {
    if (std::find(ask.begin(), ask.end(), seed) == ask.end()) ask.push_back(seed);
  }
  for (const std::string& server : ask) {
    const std::string host = server.substr(0, server.rfind(':'));
    // A connection of its own (the map is asked of whichever node answers), closed after.
    absl::Status ignored;
    redisContext* c = OpenConnection(server, &ignored);
    if (c == nullptr) continue;
    Reply r(static_cast<redisReply*>(redisCommand(c, "CLUSTER SLOTS")));
    redisFree(c);
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements == 0) continue;
    std::vector<std::string> masters;
    std::vector<uint16_t> map(16384, 0);
    std::vector<bool> covered(16384, false);
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* range = r->element[i];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 || range->element[0]->type != REDIS_REPLY_INTEGER ||
          range->element[1]->type != REDIS_REPLY_INTEGER || range->element[2]->type != REDIS_REPLY_ARRAY ||
          range->element[2]->elements < 2 || range->element[2]->element[0]->type != REDIS_REPLY_STRING ||
          range->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
        continue;
      }
      const long long lo = range->element[0]->integer, hi = range->element[1]->integer;
      if (lo < 0 || hi > 16383 || lo > hi) continue;
      std::string ip(range->element[2]->element[0]->str, range->element[2]->element[0]->len);
      if (ip.empty()) ip = host;  // "": the node asked.
      const std::string master = Str(ip, ":", range->element[2]->element[1]->integer);
      auto at = std::find(masters.begin(), masters.end(), master);
      if (at == masters.end()) at = masters.insert(masters.end(), master);
      for (long long s = lo; s <= hi; ++s) {
        map[static_cast<size_t>(s)] = static_cast<uint16_t>(at - masters.begin());
        covered[static_cast<size_t>(s)] = true;
      }
    }
    if (masters.empty() || masters.size() > 1024 || std::find(covered.begin(), covered.end(), false) != covered.end()) {
      continue;  // Not a whole map (a cluster being resharded or not yet formed): ask another.
    }
    // The masters that stay keep their connections; the others' are closed.
    std::vector<redisContext*> conns(masters.size(), nullptr);
    std::vector<Clock::time_point> retry(masters.size());
    for (size_t m = 0; m < masters.size(); ++m) {
      auto old = std::find(servers_.begin(), servers_.end(), masters[m]);
      if (old == servers_.end()) continue;
      const size_t o = static_cast<size_t>(old - servers_.begin());
      conns[m] = conns_[o];
      retry[m] = retry_after_[o];
      conns_[o] = nullptr;
    }
    for (redisContext* stale : conns_) {
      if (stale != nullptr) redisFree(stale);
    }
    servers_ = std::move(masters);
    conns_ = std::move(conns);
    retry_after_ = std::move(retry);
    slot_node_ = std::move(map);
    return;
  }
}

std::string RedisTier::RedisKey(const KvTierKey& key) {
  return Str("pdkv:", key.model.ToHex(), ":", key.block.ToHex());
}

std::string RedisTier::Value(const KvTierKey& key, absl::Span<const uint8_t> block) const {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.payload_bytes = block.size();
  h.checksum = XXH3_64bits(block.data(), block.size());
  KvTierKeyWords(key, h.key);
  if (!options_.hmac_key.empty()) Mac(options_.hmac_key, h, block, h.hmac);
  std::string value(sizeof h + block.size(), '\0');
  std::memcpy(value.data(), &h, sizeof h);
  std::memcpy(value.data() + sizeof h, block.data(), block.size());
  return value;
}

bool RedisTier::Check(const KvTierKey& key, std::string_view value, size_t block_bytes) const {
  Header h;
  if (value.size() != sizeof h + block_bytes) return false;
  std::memcpy(&h, value.data(), sizeof h);
  const auto payload = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(value.data()) + sizeof h, block_bytes);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.payload_bytes != block_bytes ||
      !KvTierKeyWordsMatch(key, h.key) || h.checksum != XXH3_64bits(payload.data(), payload.size())) {
    return false;
  }
  if (options_.hmac_key.empty()) return true;
  uint8_t mac[32];
  Mac(options_.hmac_key, h, payload, mac);
  return CRYPTO_memcmp(mac, h.hmac, sizeof mac) == 0;
}

void RedisTier::RememberLocked(const KvTierKey& key) {
  if (known_.size() >= (size_t{1} << 20)) known_.clear();  // A hint: bounded, forgotten wholesale.
  known_.insert(key);
}

bool RedisTier::Contains(const KvTierKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_.contains(key);
}

absl::Status RedisTier::Store(const KvTierKey& key, absl::Span<const uint8_t> block) {
  const std::string value = Value(key, block);
  const std::string name = RedisKey(key);
  const auto start = Clock::now();
  bool written = false;
  {
    std::lock_guard<std::mutex> io(io_mu_);
    if (options_.cluster && (slot_node_.empty() || refresh_slots_)) RefreshSlotsLocked(false);
    const size_t shard = Shard(key);
    redisContext* c = Connection(shard);
    if (c == nullptr) return absl::UnavailableError(Str("redis ", servers_[shard], ": not connected"));
    Reply r(static_cast<redisReply*>(
        redisCommand(c, "SET %b %b NX", name.data(), name.size(), value.data(), value.size())));
    if (r == nullptr) {
      const std::string why = c->errstr;
      Drop(shard);
      return absl::UnavailableError(Str("redis ", servers_[shard], ": ", why));
    }
    if (r->type == REDIS_REPLY_ERROR) {  // OOM with maxmemory and noeviction, MOVED, ...
      CountError();
      const std::string_view error(r->str, r->len);
      if (error.substr(0, 6) == "MOVED " || error.substr(0, 4) == "ASK ") refresh_slots_ = true;
      return absl::ResourceExhaustedError(
          Str("redis ", servers_[shard], ": ", std::string_view(r->str, r->len)));
    }
    written = r->type == REDIS_REPLY_STATUS;  // "OK": written now (NIL: it was there).
  }
  std::lock_guard<std::mutex> lock(mu_);
  RememberLocked(key);
  if (written) {
    ++stats_.stores;
    stats_.store_bytes += static_cast<int64_t>(block.size());
  }
  stats_.store_seconds += Since(start);
  return absl::OkStatus();
}

absl::Status RedisTier::Load(const KvTierKey& key, absl::Span<uint8_t> out) {
  absl::Status status = absl::NotFoundError("not in the store");
  const KvTierKey keys[] = {key};
  LoadRun(keys, out.size(), [&](size_t, absl::Span<const uint8_t> bytes) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
    status = absl::OkStatus();
  });
  return status;
}

int64_t RedisTier::LoadRun(absl::Span<const KvTierKey> keys, size_t block_bytes,
                           absl::FunctionRef<void(size_t, absl::Span<const uint8_t>)> use) {
  if (keys.empty()) return 0;
  const auto start = Clock::now();
  std::unique_lock<std::mutex> io(io_mu_);
  if (options_.cluster && (slot_node_.empty() || refresh_slots_)) RefreshSlotsLocked(false);
  // The GETs pipelined (per shard, one connection each), at most kPipelineBytes of replies
  // outstanding: each reply is read, checked and used in key order straight from the reader's
  // buffer (LoadReplies), and the next GET written as one is read. (All of a 64-block run's 32 MB
  // asked at once read at 0.26 GB/s here, a window of 16 blocks at 2.6: bench/kv_tier_io.py.)
  std::vector<int> pending(conns_.size(), 0);  // Replies a shard still owes.
  std::vector<int8_t> usable(conns_.size(), -1);  // -1: not asked yet.
  std::vector<uint8_t> asked(keys.size(), 0);
  LoadReplies ctx;
  std::vector<redisReplyObjectFunctions*> saved(conns_.size(), nullptr);
  const auto ask = [&](size_t j) {
    const KvTierKey& key = keys[j];
    const size_t shard = Shard(key);
    if (usable[shard] < 0) {
      usable[shard] = Connection(shard) != nullptr;
      if (usable[shard]) {
        saved[shard] = conns_[shard]->reader->fn;
        conns_[shard]->reader->fn = &kLoadFunctions;
        conns_[shard]->reader->privdata = &ctx;
      }
    }
    if (!usable[shard]) return;
    // At most a block's bytes: a value someone else wrote under this name (the store may be
    // writable by others) could be 512 MB, and hiredis would buffer all of it. A longer value
    // is read up to the block's length and checked as any other.
    const std::string name = RedisKey(key);
    if (redisAppendCommand(conns_[shard], "GETRANGE %b 0 %lld", name.data(), name.size(),
                           static_cast<long long>(kHeaderBytes + block_bytes) - 1) != REDIS_OK) {
      Drop(shard);  // Replies not read would answer the next call's commands.
      usable[shard] = 0;
      return;
    }
    asked[j] = 1;
    ++pending[shard];
  };
  const size_t window = std::max<size_t>(1, kPipelineBytes / (kHeaderBytes + block_bytes));
  size_t next = 0;
  int64_t n = 0;
  bool running = true, missed = false;
  size_t corrupt = keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    // Past a miss nothing more is asked; what was asked is still read (the servers owe it).
    while (running && next < keys.size() && next < i + window) ask(next++);
    const size_t shard = Shard(keys[i]);
    bool used = false;
    const auto check_and_use = [&](std::string_view value) {
      if (!Check(keys[i], value, block_bytes)) return;
      use(i, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(value.data()) + kHeaderBytes, block_bytes));
      used = true;
    };
    absl::FunctionRef<void(std::string_view)> consume = check_and_use;
    ctx.consume = running ? &consume : nullptr;
    ctx.result = LoadReplies::kNone;
    if (asked[i] && usable[shard] > 0 && pending[shard] > 0) {
      void* reply = nullptr;
      if (redisGetReply(conns_[shard], &reply) != REDIS_OK) {
        Drop(shard);
        usable[shard] = 0;
        pending[shard] = 0;
        ctx.result = LoadReplies::kNone;
      } else {
        --pending[shard];
      }
    }
    if (!running) continue;  // Draining what the servers still owe.
    if (ctx.result != LoadReplies::kString) {
      missed = true;
      running = false;
      continue;
    }
    if (!used) {
      corrupt = i;
      running = false;
      continue;
    }
    ++n;
  }
  for (size_t shard = 0; shard < conns_.size(); ++shard) {
    if (saved[shard] != nullptr && conns_[shard] != nullptr) {
      conns_[shard]->reader->fn = saved[shard];
      conns_[shard]->reader->privdata = nullptr;
    }
  }
  if (corrupt < keys.size()) {
    // Not this block (another model's under a colliding name, a torn or forged write): never
    // used; deleted so that the next store of it can succeed.
    const std::string name = RedisKey(keys[corrupt]);
    const size_t shard = Shard(keys[corrupt]);
    if (redisContext* c = Connection(shard); c != nullptr) {
      Reply d(static_cast<redisReply*>(redisCommand(c, "DEL %b", name.data(), name.size())));
      if (d == nullptr) Drop(shard);
    }
  }
  if (ctx.moved) refresh_slots_ = true;  // Refreshed by the next call (at most once a second).
  io.unlock();
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) RememberLocked(keys[static_cast<size_t>(i)]);
  stats_.loads += n;
  stats_.load_bytes += n * static_cast<int64_t>(block_bytes);
  if (missed || corrupt < keys.size()) ++stats_.misses;
  // Not there (evicted by the server's maxmemory policy, or a server restarted empty): stored
  // again when next published, not skipped as known.
  if (missed) known_.erase(keys[static_cast<size_t>(n)]);
  if (corrupt < keys.size()) {
    ++stats_.corrupt;
    known_.erase(keys[corrupt]);
  }
  stats_.load_seconds += Since(start);
  return n;
}

KvTierStats RedisTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTierStats s = stats_;
  s.blocks = static_cast<int64_t>(known_.size());  // Known to this process (the store may hold more).
  s.bytes = 0;
  return s;
}

}  // namespace pdserve
