// The shared store against real redis-server processes (Debian's; the test skips, saying so,
// where it is not installed): blocks one client stores are loaded by another, sharded across two
// servers, AUTH, a forged or tampered value is never used, and a store out of reach is an error,
// not a crash or a hang.
#include "common/kvcache/redis_tier.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool HaveRedis() { return ::access("/usr/bin/redis-server", X_OK) == 0; }

// A redis-server on 127.0.0.1:port, in memory only, killed with the object.
class RedisServer {
 public:
  explicit RedisServer(std::string password = "", int port = 0, std::vector<std::string> extra = {})
      : port_(port != 0 ? port : FreePort()), extra_(std::move(extra)) {
    Start(password);
  }
  ~RedisServer() { Kill(); }
  void Start(const std::string& password) {
    std::vector<std::string> args = {"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--loglevel", "warning"};
    if (!password.empty()) args.insert(args.end(), {"--requirepass", password});
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/usr/bin/redis-server", argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 500; ++i) {  // Until it accepts connections (5 s).
      redisContext* c = redisConnect("127.0.0.1", port_);
      const bool up = c != nullptr && c->err == 0;
      if (c != nullptr) redisFree(c);
      if (up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "redis-server on port " << port_ << " did not start";
  }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  // A command run on a fresh connection (the test's own client, not the tier's).
  long long Integer(const std::string& password, const char* command) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    if (!password.empty()) freeReplyObject(redisCommand(c, "AUTH %s", password.c_str()));
    auto* r = static_cast<redisReply*>(redisCommand(c, command));
    const long long v = r != nullptr && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
    return v;
  }
  void Set(const std::string& key, const std::string& value) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    freeReplyObject(redisCommand(c, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
    redisFree(c);
  }
  std::string Get(const std::string& key) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", key.data(), key.size()));
    std::string v = r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
    freeReplyObject(r);
    redisFree(c);
    return v;
  }

  // A command's reply as text (status, string or integer), on a fresh connection.
  std::string Text(const std::vector<std::string>& command) {
    redisContext* c = redisConnect("127.0.0.1", port_);
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : command) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    std::string v;
    if (r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) v.assign(r->str, r->len);
    if (r != nullptr && r->type == REDIS_REPLY_INTEGER) v = std::to_string(r->integer);
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
    return v;
  }

 private:
  int port_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

constexpr size_t kBlock = 4096;

std::vector<uint8_t> Bytes(uint64_t seed) {
  std::vector<uint8_t> b(kBlock);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<uint8_t>(x);
  }
  return b;
}

KvTierKey Key(uint64_t i) { return {{11, 22}, {i * 7919 + 3, i}}; }

std::unique_ptr<RedisTier> Open(const std::vector<std::string>& servers, std::string hmac = "",
                                std::string password = "") {
  RedisTierOptions o;
  o.servers = servers;
  o.hmac_key = std::move(hmac);
  o.password = std::move(password);
  o.timeout_ms = 500;
  auto t = RedisTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// Loads keys' leading run through LoadRun; returns the blocks loaded.
std::vector<std::vector<uint8_t>> LoadAll(RedisTier& t, const std::vector<KvTierKey>& keys) {
  std::vector<std::vector<uint8_t>> out;
  const int64_t n = t.LoadRun(keys, kBlock, [&](size_t i, absl::Span<const uint8_t> b) {
    EXPECT_EQ(i, out.size());
    out.emplace_back(b.begin(), b.end());
  });
  EXPECT_EQ(n, static_cast<int64_t>(out.size()));
  return out;
}

TEST(RedisTierTest, WhatOneWorkerStoresAnotherLoadsShardedAcrossServers) {
  if (!HaveRedis()) GTEST_SKIP() << "no redis-server (Debian's redis-server package)";
  RedisServer s1, s2;
  auto writer = Open({s1.address(), s2.address()});
  auto reader = Open({s1.address(), s2.address()});
  ASSERT_TRUE(writer && reader);
  std::vector<KvTierKey> keys;
  for (uint64_t i = 0; i < 40; ++i) {
    keys.push_back(Key(i));
    ASSERT_TRUE(writer->Store(Key(i), Bytes(i)).ok());
    EXPECT_TRUE(writer->Contains(Key(i)));
  }
  EXPECT_EQ(writer->Stats().stores, 40);
  // Stored again: kept as it was (SET NX), not counted.
  ASSERT_TRUE(writer->Store(Key(0), Bytes(999)).ok());
  EXPECT_EQ(writer->Stats().stores, 40);
  // Both servers hold some (sharded by block hash), 40 in all.
  const long long n1 = s1.Integer("", "DBSIZE"), n2 = s2.Integer("", "DBSIZE");
  EXPECT_GT(n1, 0);
  EXPECT_GT(n2, 0);
  EXPECT_EQ(n1 + n2, 40);
  EXPECT_FALSE(reader->Contains(Key(3)));  // Remote: known only by asking.
  keys.push_back(Key(1000));               // Not stored: the run ends before it.
  keys.push_back(Key(5));
  auto got = LoadAll(*reader, keys);
  ASSERT_EQ(got.size(), 40u);
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ(got[i], Bytes(i)) << i;
  EXPECT_TRUE(reader->Contains(Key(3)));
  EXPECT_EQ(reader->Stats().loads, 40);
  EXPECT_EQ(reader->Stats().misses, 1);
  std::vector<uint8_t> one(kBlock);
  EXPECT_TRUE(reader->Load(Key(7), absl::MakeSpan(one)).ok());
  EXPECT_EQ(one, Bytes(7));
  EXPECT_EQ(reader->Load(Key(1000), absl::MakeSpan(one)).code(), absl::StatusCode::kNotFound);
}

// What a process stored is a hint, not a promise: a block the server evicted (maxmemory) is
// found missing by a load and stored again at its next offer; a server restarted empty (a new
// connection after the old one broke) makes the process forget what it stored there, so its
// blocks are stored again rather than skipped as known.
TEST(RedisTierTest, BlocksEvictedOrLostWithARestartAreStoredAgain) {
  if (!HaveRedis()) GTEST_SKIP() << "no redis-server (Debian's redis-server package)";
  const int port = FreePort();
  auto server = std::make_unique<RedisServer>("", port);
  auto t = Open({server->address()});
  ASSERT_TRUE(t);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(t->Store(Key(i), Bytes(i)).ok());
  EXPECT_TRUE(t->Contains(Key(1)));
  // The server drops block 1 (as maxmemory's LRU would): a load misses it and the tier forgets it.
  redisContext* c = redisConnect("127.0.0.1", port);
  const std::string name = RedisTier::RedisKey(Key(1));
  freeReplyObject(redisCommand(c, "DEL %b", name.data(), name.size()));
  redisFree(c);
  EXPECT_EQ(LoadAll(*t, {Key(0), Key(1), Key(2)}).size(), 1u);
  EXPECT_FALSE(t->Contains(Key(1)));
  EXPECT_TRUE(t->Contains(Key(2)));  // Not asked past the miss: still a hint.
  ASSERT_TRUE(t->Store(Key(1), Bytes(1)).ok());
  EXPECT_EQ(server->Integer("", "DBSIZE"), 4);
  // Restarted empty on the same port: the next call finds the connection broken (an error), the
  // one after a second reconnects, and everything this process stored there is unknown again.
  server.reset();
  server = std::make_unique<RedisServer>("", port);
  EXPECT_FALSE(t->Store(Key(9), Bytes(9)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(t->Store(Key(8), Bytes(8)).ok());
  for (uint64_t i = 0; i < 4; ++i) EXPECT_FALSE(t->Contains(Key(i))) << i;
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(t->Store(Key(i), Bytes(i)).ok());
  EXPECT_EQ(server->Integer("", "DBSIZE"), 5);
  EXPECT_EQ(LoadAll(*t, {Key(0), Key(1), Key(2), Key(3)}).size(), 4u);
}

// A 3-master Redis Cluster on loopback ports (no replicas), every node seeing the whole cluster,
// removed with the object; empty `nodes` when it could not be made.
struct LocalCluster {
  LocalCluster() {
    char dir_template[] = "/tmp/pdserve_redis_cluster_XXXXXX";
    dir = ::mkdtemp(dir_template);
    std::string create = "redis-cli --cluster create";
    for (int i = 0; i < 3; ++i) {
      const int port = FreePort();
      nodes.push_back(std::make_unique<RedisServer>(
          "", port,
          // The bus on a port of its own: port + 10000, the default, may be past 65535.
          std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-port", std::to_string(FreePort()),
                                   "--cluster-config-file", dir + "/nodes-" + std::to_string(port) + ".conf",
                                   "--dir", dir}));
      create += " " + nodes.back()->address();
    }
    if (std::system((create + " --cluster-replicas 0 --cluster-yes > /dev/null 2>&1").c_str()) != 0) {
      nodes.clear();
      return;
    }
    WaitConsistent();
  }
  ~LocalCluster() {
    nodes.clear();
    std::system(("rm -rf " + dir).c_str());
  }
  // Until every node sees the cluster whole (10 s).
  void WaitConsistent() {
    for (int i = 0; i < 500; ++i) {
      bool ok = true;
      for (auto& n : nodes) ok = ok && n->Text({"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
      if (ok) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::string dir;
  std::vector<std::unique_ptr<RedisServer>> nodes;
};

bool HaveRedisCli() { return HaveRedis() && ::access("/usr/bin/redis-cli", X_OK) == 0; }

// Two clients of the cluster `seed` belongs to (`redis+cluster://` one seed), the writer having
// stored blocks 0..39 (their keys in *keys).
void WriteThroughSeed(RedisServer& seed, std::unique_ptr<RedisTier>* writer, std::unique_ptr<RedisTier>* reader,
                      std::vector<KvTierKey>* keys) {
  RedisTierOptions o;
  ASSERT_TRUE(ParseRedisUrl("redis+cluster://" + seed.address(), &o).ok());
  EXPECT_TRUE(o.cluster);
  o.timeout_ms = 2000;
  auto w = RedisTier::Open(o);
  auto r = RedisTier::Open(o);
  ASSERT_TRUE(w.ok() && r.ok());
  *writer = std::move(*w);
  *reader = std::move(*r);
  for (uint64_t i = 0; i < 40; ++i) {
    keys->push_back(Key(i));
    ASSERT_TRUE((*writer)->Store(Key(i), Bytes(i)).ok()) << i;
  }
}

// Redis Cluster (`redis+cluster://` one seed): the tier learns the masters and their slots, puts
// each block on the master of its key's slot (Redis's own CLUSTER KEYSLOT is the oracle for the
// slot function; a block on the wrong master would be a MOVED error, counted), and another client
// loads them all back.
TEST(RedisTierTest, ARedisClusterHoldsEachBlockOnItsSlotsMaster) {
  if (!HaveRedisCli()) GTEST_SKIP() << "no redis-server / redis-cli (Debian's redis-server and redis-tools packages)";
  LocalCluster cluster;
  ASSERT_FALSE(cluster.nodes.empty()) << "redis-cli --cluster create failed";
  auto& nodes = cluster.nodes;
  for (uint64_t i = 0; i < 20; ++i) {
    const std::string name = RedisTier::RedisKey(Key(i));
    EXPECT_EQ(std::to_string(RedisTier::KeySlot(name)), nodes[0]->Text({"CLUSTER", "KEYSLOT", name})) << name;
  }
  EXPECT_EQ(std::to_string(RedisTier::KeySlot("{user1000}.following")), nodes[0]->Text({"CLUSTER", "KEYSLOT", "{user1000}.following"}));
  std::unique_ptr<RedisTier> writer, reader;
  std::vector<KvTierKey> keys;
  ASSERT_NO_FATAL_FAILURE(WriteThroughSeed(*nodes[1], &writer, &reader, &keys));
  long long total = 0;
  for (auto& n : nodes) {
    const long long held = n->Integer("", "DBSIZE");
    EXPECT_GT(held, 0);
    total += held;
  }
  EXPECT_EQ(total, 40);
  EXPECT_EQ(writer->Stats().errors, 0) << "a block went to a master that does not serve its slot";
  auto got = LoadAll(*reader, keys);
  ASSERT_EQ(got.size(), 40u);
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ(got[i], Bytes(i)) << i;
  EXPECT_EQ(reader->Stats().errors, 0);
}

// A live reshard under running clients: every slot of the first master (and its blocks) moves to
// the second (redis-cli --cluster reshard). Clients that learned the old map get MOVED, ask the
// cluster again (at most once a second) and load every block back from its new master; new
// blocks go there too. A block asked of the wrong master meanwhile is only a miss.
TEST(RedisTierTest, ALiveReshardIsFollowedThroughMovedReplies) {
  if (!HaveRedisCli()) GTEST_SKIP() << "no redis-server / redis-cli (Debian's redis-server and redis-tools packages)";
  LocalCluster cluster;
  ASSERT_FALSE(cluster.nodes.empty()) << "redis-cli --cluster create failed";
  auto& nodes = cluster.nodes;
  std::unique_ptr<RedisTier> writer, reader;
  std::vector<KvTierKey> keys;
  ASSERT_NO_FATAL_FAILURE(WriteThroughSeed(*nodes[2], &writer, &reader, &keys));
  ASSERT_EQ(LoadAll(*reader, keys).size(), 40u);  // Both know the map now.
  const int64_t misses_before = reader->Stats().misses;
  const long long moved = nodes[0]->Integer("", "DBSIZE");
  ASSERT_GT(moved, 0);
  const std::string from = nodes[0]->Text({"CLUSTER", "MYID"}), to = nodes[1]->Text({"CLUSTER", "MYID"});
  const std::string reshard = "redis-cli --cluster reshard " + nodes[0]->address() + " --cluster-from " + from +
                              " --cluster-to " + to + " --cluster-slots 5461 --cluster-yes > /dev/null 2>&1";
  ASSERT_EQ(std::system(reshard.c_str()), 0);
  cluster.WaitConsistent();
  ASSERT_EQ(nodes[0]->Integer("", "DBSIZE"), 0) << "the first master still holds blocks";
  // The reader's map is stale: its first run may miss the moved blocks; within a few seconds
  // (one refresh a second) every block loads again, with its bytes.
  std::vector<std::vector<uint8_t>> got;
  for (int i = 0; i < 50 && got.size() < keys.size(); ++i) {
    got = LoadAll(*reader, keys);
    if (got.size() < keys.size()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(got.size(), keys.size()) << "the reader never followed the reshard";
  EXPECT_GT(reader->Stats().misses, misses_before) << "the reader's stale map met no MOVED: the test proved nothing";
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ(got[i], Bytes(i)) << i;
  // New blocks land on the masters that now serve their slots (none on the first). The writer's
  // map is stale too: a store MOVED sends back is not stored (an error, counted) until its map
  // is asked again, at most a second later; stored again then (SET NX keeps what is there).
  const auto held = [&] {
    long long total = 0;
    for (auto& n : nodes) total += n->Integer("", "DBSIZE");
    return total;
  };
  for (int i = 0; i < 50 && held() < 80; ++i) {
    for (uint64_t k = 40; k < 80; ++k) (void)writer->Store(Key(k), Bytes(k));
    if (held() < 80) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(held(), 80);
  EXPECT_EQ(nodes[0]->Integer("", "DBSIZE"), 0);
  std::vector<KvTierKey> all;
  for (uint64_t i = 0; i < 80; ++i) all.push_back(Key(i));
  EXPECT_EQ(LoadAll(*reader, all).size(), 80u);
}

TEST(RedisTierTest, TamperedForgedOrForeignValuesAreNeverUsed) {
  if (!HaveRedis()) GTEST_SKIP() << "no redis-server (Debian's redis-server package)";
  RedisServer s;
  const std::string secret = "0123456789abcdef-secret";
  auto signer = Open({s.address()}, secret);
  auto reader = Open({s.address()}, secret);
  auto forger = Open({s.address()});  // Writes well-formed blocks without the key.
  ASSERT_TRUE(signer && reader && forger);
  ASSERT_TRUE(signer->Store(Key(1), Bytes(1)).ok());
  ASSERT_TRUE(signer->Store(Key(2), Bytes(2)).ok());
  ASSERT_TRUE(forger->Store(Key(3), Bytes(3)).ok());
  EXPECT_EQ(LoadAll(*reader, {Key(1), Key(2)}).size(), 2u);
  // The forger's block has a right checksum but no signature: refused, deleted, counted.
  EXPECT_EQ(LoadAll(*reader, {Key(3)}).size(), 0u);
  EXPECT_EQ(reader->Stats().corrupt, 1);
  EXPECT_EQ(s.Get(RedisTier::RedisKey(Key(3))), "");
  // One payload byte flipped: the checksum fails (and the signature).
  std::string v = s.Get(RedisTier::RedisKey(Key(2)));
  ASSERT_EQ(v.size(), RedisTier::kHeaderBytes + kBlock);
  v[RedisTier::kHeaderBytes + 100] ^= 1;
  s.Set(RedisTier::RedisKey(Key(2)), v);
  EXPECT_EQ(LoadAll(*reader, {Key(1), Key(2)}).size(), 1u);
  // A value of another block under this block's name (a re-signed copy would need the key).
  s.Set(RedisTier::RedisKey(Key(4)), s.Get(RedisTier::RedisKey(Key(1))));
  EXPECT_EQ(LoadAll(*reader, {Key(4)}).size(), 0u);
  // Another block size (another model's layout): never copied into this pool.
  std::vector<uint8_t> small(kBlock / 2);
  EXPECT_FALSE(reader->Load(Key(1), absl::MakeSpan(small)).ok());
  EXPECT_EQ(reader->Stats().corrupt, 4);
  // Garbage.
  s.Set(RedisTier::RedisKey(Key(5)), "not a block");
  EXPECT_EQ(LoadAll(*reader, {Key(5)}).size(), 0u);
  // 64 MB under a block's name: only the block's length is read (GETRANGE), and it fails its
  // checks like any garbage; the reader's memory stays a block's.
  s.Set(RedisTier::RedisKey(Key(6)), std::string(64 << 20, 'x'));
  EXPECT_EQ(LoadAll(*reader, {Key(6)}).size(), 0u);
  EXPECT_EQ(reader->Stats().corrupt, 6);
}

TEST(RedisTierTest, AuthRefusalsAreErrorsAndServersOutOfReachAreWaitedFor) {
  if (!HaveRedis()) GTEST_SKIP() << "no redis-server (Debian's redis-server package)";
  RedisServer s("s3cret-pass");
  RedisTierOptions o;
  o.servers = {s.address()};
  o.timeout_ms = 500;
  auto no_auth = RedisTier::Open(o);
  ASSERT_FALSE(no_auth.ok());
  EXPECT_NE(no_auth.status().message().find("redis " + s.address() + ": PING: NOAUTH"), std::string::npos)
      << no_auth.status();
  o.password = "wrong";
  auto wrong = RedisTier::Open(o);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("AUTH: "), std::string::npos) << wrong.status();
  o.user = "default";  // ACL form: USER PASSWORD.
  o.password = "s3cret-pass";
  auto tier = RedisTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  ASSERT_TRUE((*tier)->Store(Key(1), Bytes(1)).ok());

  // Nothing listening yet: the tier starts without it (calls miss at once, counted) and uses it
  // once it is up.
  const int later_port = FreePort();
  RedisTierOptions later;
  later.servers = {"127.0.0.1:" + std::to_string(later_port)};
  later.timeout_ms = 500;
  auto absent = RedisTier::Open(later);
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE((*absent)->Store(Key(9), Bytes(9)).ok());
  EXPECT_EQ(LoadAll(**absent, {Key(9)}).size(), 0u);
  EXPECT_GT((*absent)->Stats().errors, 0);
  {
    RedisServer up("", later_port);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // Past the retry backoff.
    ASSERT_TRUE((*absent)->Store(Key(9), Bytes(9)).ok());
    EXPECT_EQ(LoadAll(**absent, {Key(9)}).size(), 1u);
  }

  // The server dies under a running tier: stores and loads fail (counted), nothing hangs past the
  // timeout; it comes back on the same port and the tier reconnects.
  s.Kill();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE((*tier)->Store(Key(2), Bytes(2)).ok());
  EXPECT_EQ(LoadAll(**tier, {Key(1)}).size(), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_GT((*tier)->Stats().errors, 0);
  s.Start("s3cret-pass");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // Past the reconnect backoff.
  ASSERT_TRUE((*tier)->Store(Key(2), Bytes(2)).ok());
  EXPECT_EQ(LoadAll(**tier, {Key(2)}).size(), 1u);
}

TEST(RedisTierTest, UrlsAndPasswordFiles) {
  RedisTierOptions o;
  ASSERT_TRUE(ParseRedisUrl("redis://10.0.0.1:6379,redis-1.svc:6380/", &o).ok());
  EXPECT_EQ(o.servers, (std::vector<std::string>{"10.0.0.1:6379", "redis-1.svc:6380"}));
  for (const char* bad : {"http://h:1", "redis://h", "redis://h:0", "redis://h:99999", "redis://:1", "redis://h:1,",
                          "redis://h:1x"}) {
    auto s = ParseRedisUrl(bad, &o);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--kv-store"), std::string::npos) << s;
  }
  char path[] = "/tmp/redis_pw_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "alice:pa:ss\n", 12), 12);
  ::close(fd);
  RedisTierOptions p;
  ASSERT_TRUE(ReadRedisPasswordFile(path, &p).ok());
  EXPECT_EQ(p.user, "alice");
  EXPECT_EQ(p.password, "pa:ss");
  ::unlink(path);
  EXPECT_FALSE(ReadRedisPasswordFile(path, &p).ok());
}

}  // namespace
}  // namespace pdserve
