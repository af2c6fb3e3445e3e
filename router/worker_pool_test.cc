// WorkerPool against scripted workers: real gRPC servers whose WatchLoad streams the reports a
// test pushes (a fake standing in for a worker, to inject event gaps, wrong layouts and silence).
#include "router/worker_pool.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/rpc/load_publisher.h"
#include "common/rpc/server_builder.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

using internal::v1::LoadReport;
using std::chrono::milliseconds;

class ScriptedWorker final : public internal::v1::DecodeWorker::Service {
 public:
  ScriptedWorker() {
    auto server = StartGrpcServer("127.0.0.1:0", {this});
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  ~ScriptedWorker() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    server_.server->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  }
  const std::string& address() const { return server_.address; }

  // Queues a report for the subscription numbered `subscription` (0 = the first WatchLoad).
  void Push(int subscription, LoadReport report) {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.emplace_back(subscription, std::move(report));
    cv_.notify_all();
  }
  // Ends the given subscription's stream from the worker's side.
  void EndStream(int subscription) {
    std::lock_guard<std::mutex> lock(mu_);
    ended_.push_back(subscription);
    cv_.notify_all();
  }
  // after_seq of each WatchLoad so far; waits until there are at least `n`.
  std::vector<uint64_t> Subscriptions(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return after_seqs_.size() >= n; });
    return after_seqs_;
  }

  grpc::Status WatchLoad(grpc::ServerContext* ctx, const internal::v1::WatchLoadRequest* request,
                         grpc::ServerWriter<LoadReport>* writer) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int me = static_cast<int>(after_seqs_.size());
    after_seqs_.push_back(request->after_seq());
    cv_.notify_all();
    while (!stop_ && !ctx->IsCancelled()) {
      if (std::find(ended_.begin(), ended_.end(), me) != ended_.end()) return grpc::Status::OK;
      auto it = std::find_if(queued_.begin(), queued_.end(), [&](auto& q) { return q.first == me; });
      if (it == queued_.end()) {
        cv_.wait_for(lock, milliseconds(5));
        continue;
      }
      LoadReport r = std::move(it->second);
      queued_.erase(it);
      lock.unlock();
      writer->Write(r);
      lock.lock();
    }
    return grpc::Status::CANCELLED;
  }

 private:
  StartedServer server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, LoadReport>> queued_;
  std::vector<int> ended_;
  std::vector<uint64_t> after_seqs_;
  bool stop_ = false;
};

constexpr int64_t kBlock = 4;

LoadReport Report(bool snapshot, uint64_t first, uint64_t last,
                  const std::vector<BlockHash>& stored, const std::vector<BlockHash>& removed = {},
                  int64_t used_blocks = 0) {
  LoadReport r;
  auto* layout = r.mutable_info()->mutable_layout();
  layout->set_block_size(kBlock);
  layout->set_hash_scheme(kBlockHashScheme);
  layout->set_model_fingerprint("model-a");
  layout->set_kv_dtype("f32");
  r.mutable_info()->set_used_blocks(used_blocks);
  r.mutable_info()->set_total_blocks(100);
  r.set_snapshot(snapshot);
  r.set_first_seq(first);
  r.set_last_seq(last);
  for (const BlockHash& h : stored) r.add_stored(EncodeBlockHash(h));
  for (const BlockHash& h : removed) r.add_removed(EncodeBlockHash(h));
  return r;
}

std::vector<BlockHash> Hashes(int32_t seed, int64_t blocks) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < blocks * kBlock; ++i) tokens.push_back(seed * 1000 + static_cast<int32_t>(i));
  std::vector<BlockHash> out;
  ExtendBlockHashes(tokens, kBlock, &out);
  return out;
}

WorkerPoolOptions Options() {
  WorkerPoolOptions o;
  o.block_size = kBlock;
  o.model_fingerprint = "model-a";
  o.reconnect_every = milliseconds(50);
  o.event_grace = milliseconds(1);  // These tests look at what the events say.
  return o;
}

// Polls until `pred` holds (the pool applies reports on gRPC's threads).
template <typename Pred>
bool Eventually(Pred pred) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < give_up) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return pred();
}

int64_t CachedPrefix(WorkerPool& pool, const std::vector<BlockHash>& prompt) {
  std::this_thread::sleep_for(milliseconds(2));  // Past event_grace of earlier picks.
  auto pick = pool.Choose(RoutingOptions{}, prompt, static_cast<int64_t>(prompt.size()));
  if (!pick) return -1;
  pool.Done(pick->worker);
  return pick->cached_prefix_blocks;
}

TEST(WorkerPoolTest, AppliesStoredAndRemovedEvents) {
  ScriptedWorker worker;
  WorkerPool pool(Options());
  pool.SetAddresses({worker.address()});
  const std::vector<BlockHash> p = Hashes(1, 4);
  worker.Push(0, Report(true, 1, 0, {p[0], p[1]}));
  ASSERT_TRUE(pool.WaitForReports(std::chrono::seconds(10)));
  EXPECT_EQ(CachedPrefix(pool, p), 2);
  worker.Push(0, Report(false, 1, 2, {p[2], p[3]}));
  ASSERT_TRUE(Eventually([&] { return CachedPrefix(pool, p) == 4; }));
  worker.Push(0, Report(false, 3, 3, {}, {p[1]}));
  // Block 1 was evicted: only block 0 is still a usable prefix.
  ASSERT_TRUE(Eventually([&] { return CachedPrefix(pool, p) == 1; }));
  EXPECT_EQ(worker.Subscriptions(1), std::vector<uint64_t>{0});
}

// A worker's own tiers' blocks (tier_stored / tier_removed) count after its pool's prefix; the
// blocks any worker wrote to the shared store count for every worker that has the store (a
// "redis" tier in its info), in both pools of a router, and for no other.
TEST(WorkerPoolTest, TierAndSharedStoreBlocksCountAfterThePoolsPrefix) {
  ScriptedWorker a, b;
  WorkerPoolOptions o = Options();
  o.store = std::make_shared<SharedStoreIndex>();
  WorkerPool decode(o), prefill(o);
  decode.SetAddresses({a.address()});
  prefill.SetAddresses({b.address()});
  const std::vector<BlockHash> p = Hashes(7, 6);
  LoadReport first = Report(true, 1, 0, {p[0]});
  first.add_tier_stored(EncodeBlockHash(p[1]));
  first.add_tier_stored(EncodeBlockHash(p[2]));
  first.add_tier_stored(EncodeBlockHash(p[4]));  // Not after a held run: never counted.
  a.Push(0, first);
  b.Push(0, Report(true, 1, 0, {}));
  ASSERT_TRUE(decode.WaitForReports(std::chrono::seconds(10)));
  ASSERT_TRUE(prefill.WaitForReports(std::chrono::seconds(10)));
  auto tiers = [](WorkerPool& pool, const std::vector<BlockHash>& prompt) {
    std::this_thread::sleep_for(milliseconds(2));
    auto pick = pool.Choose(RoutingOptions{}, prompt, static_cast<int64_t>(prompt.size()));
    if (!pick) return std::pair<int64_t, int64_t>(-1, -1);
    pool.Done(pick->worker);
    return std::pair<int64_t, int64_t>(pick->cached_prefix_blocks, pick->tier_prefix_blocks);
  };
  EXPECT_EQ(tiers(decode, p), std::make_pair(int64_t{1}, int64_t{2}));
  // The prefill worker writes blocks 3 and 4 to the shared store; the decode worker has no store
  // yet: they do not count for it.
  LoadReport wrote = Report(false, 1, 2, {});
  wrote.add_store_stored(EncodeBlockHash(p[3]));
  wrote.add_store_stored(EncodeBlockHash(p[4]));
  b.Push(0, wrote);
  ASSERT_TRUE(Eventually([&] { return o.store->size() == 2; }));
  EXPECT_EQ(tiers(decode, p), std::make_pair(int64_t{1}, int64_t{2}));
  // Now it reports a "redis" tier: the run goes on through the store's blocks.
  LoadReport with_store = Report(false, 1, 1, {}, {});
  with_store.mutable_info()->mutable_kv_offload()->add_tiers()->set_name("redis");
  a.Push(0, with_store);
  ASSERT_TRUE(Eventually([&] { return tiers(decode, p) == std::make_pair(int64_t{1}, int64_t{4}); }));
  // Its disk evicts block 2: the run stops before it.
  LoadReport evicted = Report(false, 2, 2, {}, {});
  evicted.add_tier_removed(EncodeBlockHash(p[2]));
  evicted.mutable_info()->mutable_kv_offload()->add_tiers()->set_name("redis");
  a.Push(0, evicted);
  ASSERT_TRUE(Eventually([&] { return tiers(decode, p) == std::make_pair(int64_t{1}, int64_t{1}); }));
  // Its tiers now read slower than it computes (--kv-tier-load faster declines them): none count.
  LoadReport declining = Report(false, 3, 2, {}, {});
  declining.mutable_info()->mutable_kv_offload()->add_tiers()->set_name("redis");
  declining.mutable_info()->mutable_kv_offload()->set_loads_declined(true);
  a.Push(0, declining);
  ASSERT_TRUE(Eventually([&] { return tiers(decode, p) == std::make_pair(int64_t{1}, int64_t{0}); }));
}

TEST(WorkerPoolTest, EventGapResubscribesForASnapshot) {
  ScriptedWorker worker;
  WorkerPool pool(Options());
  pool.SetAddresses({worker.address()});
  const std::vector<BlockHash> p = Hashes(2, 3);
  worker.Push(0, Report(true, 6, 5, {p[0]}));
  worker.Push(0, Report(false, 6, 6, {p[1]}));
  ASSERT_TRUE(Eventually([&] { return CachedPrefix(pool, p) == 2; }));
  // Events 7 and 8 are lost; 9 arrives. The router must not apply it on a stale view.
  worker.Push(0, Report(false, 9, 9, {p[2]}));
  const std::vector<uint64_t> subs = worker.Subscriptions(2);
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[1], 0u);  // From 0: a snapshot.
  // The snapshot says the worker now holds only block 0.
  worker.Push(1, Report(true, 10, 9, {p[0]}));
  ASSERT_TRUE(Eventually([&] { return CachedPrefix(pool, p) == 1; }));
  // Deltas continue from the snapshot's sequence number.
  worker.Push(1, Report(false, 10, 10, {p[1], p[2]}));
  ASSERT_TRUE(Eventually([&] { return CachedPrefix(pool, p) == 3; }));
  EXPECT_EQ(worker.Subscriptions(2).size(), 2u);
}

TEST(WorkerPoolTest, ALostStreamResumesAfterTheLastAppliedEvent) {
  ScriptedWorker worker;
  WorkerPool pool(Options());
  pool.SetAddresses({worker.address()});
  const std::vector<BlockHash> p = Hashes(3, 2);
  worker.Push(0, Report(true, 1, 0, {p[0]}));
  worker.Push(0, Report(false, 1, 4, {p[1]}));
  ASSERT_TRUE(Eventually([&] { return CachedPrefix(pool, p) == 2; }));
  worker.EndStream(0);
  const std::vector<uint64_t> subs = worker.Subscriptions(2);
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[1], 4u);
  // Until it reports again the worker is left out.
  worker.Push(1, Report(false, 5, 5, {}));
  ASSERT_TRUE(Eventually([&] { return pool.usable() == 1; }));
  EXPECT_EQ(CachedPrefix(pool, p), 2);
}

// Workers whose arithmetic differs (one with AMX's bf16 order beside two with VDPBF16PS's) are
// still used, and each is counted once across the pools that share the watch (a router's two
// tiers; both decode pools here, as ScriptedWorker serves the decode service), however often it
// is checked again.
TEST(WorkerPoolTest, WorkersOfAnotherArithmeticAreCountedOnceAcrossPools) {
  ScriptedWorker a, b, amx;
  WorkerPoolOptions o = Options();
  o.numerics = std::make_shared<NumericsWatch>();
  WorkerPool first_pool(o), second_pool(o);
  auto report = [](const std::string& numerics, uint64_t seq) {
    LoadReport r = Report(seq == 1, seq, seq, {});
    r.mutable_info()->set_numerics(numerics);
    return r;
  };
  a.Push(0, report("bf16/vdpbf16ps", 1));
  first_pool.SetAddresses({a.address()});
  ASSERT_TRUE(first_pool.WaitForReports(std::chrono::seconds(10)));
  b.Push(0, report("bf16/vdpbf16ps", 1));
  amx.Push(0, report("bf16/amx", 1));
  first_pool.SetAddresses({a.address(), b.address()});
  second_pool.SetAddresses({amx.address()});
  ASSERT_TRUE(Eventually([&] { return first_pool.usable() == 2 && second_pool.usable() == 1; }));
  EXPECT_EQ(o.numerics->mixed(), 1);
  EXPECT_TRUE(o.numerics->Check(a.address(), "bf16/vdpbf16ps"));
  EXPECT_FALSE(o.numerics->Check(amx.address(), "bf16/amx"));
  EXPECT_EQ(o.numerics->mixed(), 1);
}

TEST(WorkerPoolTest, RefusesAWorkerWithAnotherBlockSizeHashSchemeModelOrKvDtype) {
  for (int which = 0; which < 4; ++which) {
    ScriptedWorker good, bad;
    WorkerPool pool(Options());
    pool.SetAddresses({bad.address(), good.address()});
    LoadReport r = Report(true, 1, 0, {});
    auto* layout = r.mutable_info()->mutable_layout();
    if (which == 0) layout->set_block_size(16);
    if (which == 1) layout->set_hash_scheme("sha256-v0");
    if (which == 2) layout->set_model_fingerprint("model-b");
    if (which == 3) layout->set_kv_dtype("int8");
    bad.Push(0, r);
    good.Push(0, Report(true, 1, 0, {}));
    ASSERT_TRUE(pool.WaitForReports(std::chrono::seconds(10)));
    EXPECT_EQ(pool.refusals(), 1) << which;
    EXPECT_EQ(pool.usable(), 1u) << which;
    for (const auto& w : pool.Stats()) {
      EXPECT_EQ(w.refused, w.address == bad.address()) << which;
    }
    for (int i = 0; i < 5; ++i) {
      auto pick = pool.Choose(RoutingOptions{}, {}, 1);
      ASSERT_TRUE(pick.has_value());
      EXPECT_EQ(WorkerPool::Address(*pick->worker), good.address());
      pool.Done(pick->worker);
    }
    // Refused for good: it is not resubscribed. (A negative can only be watched for a while:
    // ten reconnect periods, long enough for a resubscription to show, never a false failure.)
    std::this_thread::sleep_for(10 * Options().reconnect_every);
    EXPECT_EQ(bad.Subscriptions(1).size(), 1u);
  }
}

TEST(WorkerPoolTest, ASilentWorkerIsLeftOutUntilItReportsAgain) {
  ScriptedWorker worker;
  WorkerPoolOptions o = Options();
  o.stale_after = milliseconds(200);
  WorkerPool pool(o);
  pool.SetAddresses({worker.address()});
  worker.Push(0, Report(true, 1, 0, {}));
  ASSERT_TRUE(pool.WaitForReports(std::chrono::seconds(10)));
  EXPECT_EQ(pool.usable(), 1u);
  ASSERT_TRUE(Eventually([&] { return pool.usable() == 0; }));
  EXPECT_FALSE(pool.Choose(RoutingOptions{}, {}, 1).has_value());
  // The pool cut the silent stream and subscribes again; a report brings the worker back.
  ASSERT_GE(worker.Subscriptions(2).size(), 2u);
  worker.Push(1, Report(false, 1, 0, {}));
  ASSERT_TRUE(Eventually([&] { return pool.usable() == 1; }));
}

TEST(WorkerPoolTest, ApproximateModePredictsFromDecisionsUntilTheTtl) {
  ScriptedWorker a, b;
  WorkerPoolOptions o = Options();
  o.use_events = false;
  // Long enough that a loaded machine cannot let it lapse between two consecutive calls below.
  o.approx_ttl = milliseconds(2000);
  WorkerPool pool(o);
  pool.SetAddresses({a.address(), b.address()});
  a.Push(0, Report(true, 1, 0, {}));
  b.Push(0, Report(true, 1, 0, {}));
  ASSERT_TRUE(pool.WaitForReports(std::chrono::seconds(10)));
  const std::vector<BlockHash> p = Hashes(4, 6);
  RoutingOptions r;
  // The prefix (4 * 6 blocks) outweighs the load just sent to that worker: 6 pending blocks and
  // all of the recent traffic (share excess 6 * (2 - 1) against B's 6 * (0 - 1)).
  r.w_prefix = 4;
  r.imbalance_ratio = 100;  // And the guard stays off.
  auto first = pool.Choose(r, p, 6);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->cached_prefix_blocks, 0);
  pool.Done(first->worker);
  // The same prompt again goes where the router sent it, predicted as cached.
  auto second = pool.Choose(r, p, 6);
  EXPECT_EQ(second->worker, first->worker);
  EXPECT_EQ(second->cached_prefix_blocks, 6);
  pool.Done(second->worker);
  // After the TTL the prediction is gone (sleep_for never returns early).
  std::this_thread::sleep_for(o.approx_ttl + milliseconds(100));
  auto third = pool.Choose(r, p, 6);
  EXPECT_EQ(third->cached_prefix_blocks, 0);
  pool.Done(third->worker);
}

TEST(WorkerPoolTest, SaturatedWhenEveryWorkerQueuesTheThreshold) {
  ScriptedWorker a, b;
  WorkerPool pool(Options());
  EXPECT_FALSE(pool.Saturated(8));  // No worker: nothing to be saturated (the caller checks usable).
  pool.SetAddresses({a.address(), b.address()});
  LoadReport busy = Report(true, 1, 0, {});
  busy.mutable_info()->set_waiting(8);
  LoadReport almost = busy;
  almost.mutable_info()->set_waiting(7);
  a.Push(0, busy);
  b.Push(0, almost);
  ASSERT_TRUE(pool.WaitForReports(std::chrono::seconds(10)));
  EXPECT_FALSE(pool.Saturated(8));
  EXPECT_TRUE(pool.Saturated(7));
  LoadReport now_busy = Report(false, 1, 0, {});
  now_busy.mutable_info()->set_waiting(9);
  b.Push(0, now_busy);
  ASSERT_TRUE(Eventually([&] { return pool.Saturated(8); }));
}

TEST(WorkerPoolTest, WorkersJoinAndLeaveWithTheAddressList) {
  ScriptedWorker a, b;
  WorkerPool pool(Options());
  pool.SetAddresses({a.address()});
  a.Push(0, Report(true, 1, 0, {}));
  ASSERT_TRUE(pool.WaitForReports(std::chrono::seconds(10)));
  EXPECT_EQ(pool.usable(), 1u);
  pool.SetAddresses({a.address(), b.address()});
  b.Push(0, Report(true, 1, 0, {}));
  ASSERT_TRUE(Eventually([&] { return pool.usable() == 2; }));
  auto held = pool.Choose(RoutingOptions{}, {}, 1);  // In flight across the removal.
  pool.SetAddresses({b.address()});
  EXPECT_EQ(pool.usable(), 1u);
  ASSERT_EQ(pool.Stats().size(), 1u);
  EXPECT_EQ(pool.Stats()[0].address, b.address());
  pool.Done(held->worker);  // Safe after the worker left.
}

}  // namespace
}  // namespace pdserve
