#include "router/worker_pool.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/match.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_workarounds.h"
#include "common/base/rng.h"
#include "common/rpc/load_publisher.h"
#include "common/rpc/server_builder.h"
#include "router/decode_stream.h"

namespace pdserve {

using Clock = std::chrono::steady_clock;

void SharedStoreIndex::Insert(const BlockHash& h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_.insert(h).second) return;
  order_.push_back(h);
  if (order_.size() > capacity_) {
    set_.erase(order_.front());
    order_.pop_front();
  }
}

bool SharedStoreIndex::Contains(const BlockHash& h) const {
  std::lock_guard<std::mutex> lock(mu_);
  return set_.contains(h);
}

size_t SharedStoreIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return set_.size();
}

struct WorkerPool::Worker {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<internal::v1::DecodeWorker::Stub> decode_stub;
  std::unique_ptr<internal::v1::PrefillWorker::Stub> prefill_stub;

  // Guarded by the pool's mutex.
  bool removed = false;
  bool reported = false;   // At least one report since joining.
  bool healthy = false;
  bool refused = false;
  bool events = false;     // Its hash set is live (else: approximate).
  uint64_t last_seq = 0;
  int failed_watches = 0;  // Watch streams ended since the last report.
  absl::flat_hash_set<BlockHash> hashes;
  absl::flat_hash_set<BlockHash> tier_hashes;  // Its own KV cache tiers' (LoadReport::tier_stored).
  bool has_store = false;  // It has the shared KV store (a "redis" tier): SharedStoreIndex counts.
  absl::flat_hash_map<BlockHash, Clock::time_point> predicted;  // Routed here -> when.
  internal::v1::WorkerInfo info;
  // LoRA adapters this router sent requests of here lately -> when (loaded there since).
  absl::flat_hash_map<std::string, Clock::time_point> lora_routed;
  // Runtime adapter changes made through this router, laid over its reports until they show.
  struct LoraChange {
    internal::v1::LoraAdapterChange change;
    bool added = false;
    Clock::time_point at;
  };
  std::vector<LoraChange> lora_changes;
  int64_t pending_blocks = 0;  // Routed since its last report.
  double recent = 0;           // Decayed prompt blocks routed here, as of recent_at.
  Clock::time_point recent_at;
  int64_t inflight = 0;
  int64_t decisions = 0;
  Clock::time_point last_report;
  Clock::time_point reconnect_at;
  Watch* watch = nullptr;
  std::shared_ptr<DecodeStreamClient> stream;  // Its shared decode stream (the last opened).
  bool generate_many = true;                   // False: it answered GenerateMany UNIMPLEMENTED.
};

// A WatchLoad stream; deletes itself when done.
class WorkerPool::Watch : public grpc::ClientReadReactor<internal::v1::LoadReport> {
 public:
  Watch(WorkerPool* pool, std::shared_ptr<Worker> worker, uint64_t after_seq)
      : pool_(pool), worker_(std::move(worker)) {
    request_.set_after_seq(after_seq);
    if (pool_->options_.prefill_tier) {
      worker_->prefill_stub->async()->WatchLoad(&context_, &request_, this);
    } else {
      worker_->decode_stub->async()->WatchLoad(&context_, &request_, this);
    }
    StartRead(&report_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

 private:
  void OnReadDone(bool ok) override {
    if (!ok) return;
    pool_->Apply(worker_, report_);
    StartRead(&report_);
  }
  void OnDone(const grpc::Status& status) override {
    pool_->WatchEnded(worker_, this);
    delete this;
  }

  WorkerPool* pool_;
  std::shared_ptr<Worker> worker_;
  grpc::ClientContext context_;
  internal::v1::WatchLoadRequest request_;
  internal::v1::LoadReport report_;
};

WorkerPool::WorkerPool(const WorkerPoolOptions& options) : options_(options) {
  // Routers started together must not break ties, or sample, in lockstep.
  std::random_device entropy;
  round_robin_ = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  rng_state_ = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  maintainer_ = std::thread([this] { Maintain(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  stop_ = true;
  for (auto& [address, w] : workers_) {
    if (w->watch != nullptr) w->watch->Cancel();
  }
  for (DecodeStreamClient* stream : streams_) stream->Stop();
  cv_.notify_all();
  cv_.wait(lock, [&] { return live_watches_ == 0 && streams_.empty(); });
  lock.unlock();
  if (maintainer_.joinable()) maintainer_.join();
}

internal::v1::DecodeWorker::Stub* WorkerPool::DecodeStub(const Worker& w) {
  return w.decode_stub.get();
}
internal::v1::PrefillWorker::Stub* WorkerPool::PrefillStub(const Worker& w) {
  return w.prefill_stub.get();
}
const std::string& WorkerPool::Address(const Worker& w) { return w.address; }

void WorkerPool::SetAddresses(const std::vector<std::string>& addresses) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::flat_hash_set<std::string> wanted(addresses.begin(), addresses.end());
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    PD_LOG(Info) << (options_.prefill_tier ? "prefill" : "decode") << " worker " << it->first
                 << " left";
    it->second->removed = true;
    if (it->second->watch != nullptr) it->second->watch->Cancel();
    if (it->second->stream != nullptr) it->second->stream->Retire();  // Its requests run on.
    order_.erase(std::find(order_.begin(), order_.end(), it->second));
    workers_.erase(it++);
  }
  for (const std::string& address : addresses) {
    if (workers_.contains(address)) continue;
    auto w = std::make_shared<Worker>();
    w->address = address;
    PinGrpcCallbackQueue();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    if (auto given = options_.channels.find(address); given != options_.channels.end()) {
      w->channel = given->second;
    } else {
      w->channel = grpc::CreateCustomChannel(
          address, options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(),
          args);
    }
    if (options_.prefill_tier) {
      w->prefill_stub = internal::v1::PrefillWorker::NewStub(w->channel);
    } else {
      w->decode_stub = internal::v1::DecodeWorker::NewStub(w->channel);
    }
    workers_[address] = w;
    order_.push_back(w);
    PD_LOG(Info) << (options_.prefill_tier ? "prefill" : "decode") << " worker " << address
                 << " added; waiting for its first load report";
    StartWatch(w);
  }
}

std::shared_ptr<DecodeStreamClient> WorkerPool::DecodeStream(const std::shared_ptr<Worker>& w) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || !w->generate_many || w->decode_stub == nullptr) return nullptr;
  if (w->stream != nullptr && w->stream->open()) return w->stream;
  std::weak_ptr<Worker> weak = w;
  w->stream = DecodeStreamClient::Open(
      w->decode_stub.get(),
      [this, weak](const grpc::Status& status) {
        // Before its requests hear of it: one that starts again here gets a stream of its own.
        if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (auto worker = weak.lock(); worker != nullptr && worker->generate_many) {
          PD_LOG(Warning) << "decode worker " << worker->address
                          << " does not serve GenerateMany (an older version): a stream a request there";
          worker->generate_many = false;
        }
      },
      [this](DecodeStreamClient* stream) {
        std::lock_guard<std::mutex> lock(mu_);  // Held by DecodeStream until it was counted.
        streams_.erase(stream);
        cv_.notify_all();
      });
  streams_.insert(w->stream.get());
  if (w->removed) w->stream->Retire();
  return w->stream;
}

// Under mu_.
void WorkerPool::StartWatch(const std::shared_ptr<Worker>& w) {
  if (stop_ || w->removed || w->refused || w->watch != nullptr) return;
  ++live_watches_;
  w->watch = new Watch(this, w, w->last_seq);
}

bool NumericsWatch::Check(const std::string& address, const std::string& numerics) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_.empty()) {
    first_ = numerics;
    first_address_ = address;
  }
  if (numerics == first_) return true;
  if (std::find(warned_.begin(), warned_.end(), address) == warned_.end()) {
    warned_.push_back(address);
    const bool amx = absl::StrContains(numerics, "amx") || absl::StrContains(first_, "amx");
    PD_LOG(Warning) << "worker " << address << " computes in " << numerics << ", worker "
                    << first_address_ << " in " << first_
                    << ": a request prefilled on one and decoded on the other gives outputs a "
                       "few ulps from either colocated run ("
                    << (amx ? "bf16 on AMX and on other CPUs sum in different orders: "
                              "PDSERVE_AMX=0 on every worker makes them agree"
                            : "give every worker the same --compute-dtype and device")
                    << ")";
  }
  return false;
}

int64_t NumericsWatch::mixed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(warned_.size());
}

void WorkerPool::Apply(const std::shared_ptr<Worker>& w, const internal::v1::LoadReport& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (w->removed || w->refused) return;
  w->failed_watches = 0;
  const auto& layout = r.info().layout();
  if (!options_.model_fingerprint.empty() &&
      layout.model_fingerprint() != options_.model_fingerprint) {
    w->refused = true;
    w->healthy = false;
    refusals_.fetch_add(1);
    PD_LOG(Error) << "refusing worker " << w->address << ": it serves model "
                  << layout.model_fingerprint() << ", this router's model is "
                  << options_.model_fingerprint;
    if (w->watch != nullptr) w->watch->Cancel();
    cv_.notify_all();
    return;
  }
  if (layout.block_size() != options_.block_size || layout.hash_scheme() != kBlockHashScheme) {
    w->refused = true;
    w->healthy = false;
    refusals_.fetch_add(1);
    PD_LOG(Error) << "refusing " << (options_.prefill_tier ? "prefill" : "decode") << " worker "
                  << w->address << ": block size " << layout.block_size() << ", hash scheme '"
                  << layout.hash_scheme() << "'; this router uses block size "
                  << options_.block_size << " and '" << kBlockHashScheme
                  << "' (its cache would never match the router's view)";
    if (w->watch != nullptr) w->watch->Cancel();
    cv_.notify_all();
    return;
  }
  if (layout.kv_dtype() != options_.kv_dtype) {
    w->refused = true;
    w->healthy = false;
    refusals_.fetch_add(1);
    PD_LOG(Error) << "refusing " << (options_.prefill_tier ? "prefill" : "decode") << " worker "
                  << w->address << ": its KV cache dtype is " << layout.kv_dtype()
                  << ", this router's is " << options_.kv_dtype
                  << " (--kv-dtype; pages of different dtypes cannot move between tiers)";
    if (w->watch != nullptr) w->watch->Cancel();
    cv_.notify_all();
    return;
  }
  if (options_.numerics != nullptr && !r.info().numerics().empty()) {
    options_.numerics->Check(w->address, r.info().numerics());
  }
  if (r.snapshot()) {
    w->hashes.clear();
    w->tier_hashes.clear();
    BlockHash h;
    for (const std::string& s : r.stored()) {
      if (DecodeBlockHash(s, &h)) w->hashes.insert(h);
    }
    for (const std::string& s : r.tier_stored()) {
      if (DecodeBlockHash(s, &h)) w->tier_hashes.insert(h);
    }
  } else if (r.first_seq() != w->last_seq + 1 && r.last_seq() >= r.first_seq()) {
    // A gap: what we know is no longer the worker's cache. Resubscribe for a snapshot.
    PD_LOG(Warning) << "KV event gap from " << w->address << " (expected " << w->last_seq + 1
                    << ", got " << r.first_seq() << "): resyncing";
    w->last_seq = 0;
    w->events = false;
    if (w->watch != nullptr) w->watch->Cancel();
    return;
  } else {
    BlockHash h;
    for (const std::string& s : r.stored()) {
      if (DecodeBlockHash(s, &h)) w->hashes.insert(h);
    }
    for (const std::string& s : r.removed()) {
      if (DecodeBlockHash(s, &h)) w->hashes.erase(h);
    }
    for (const std::string& s : r.tier_stored()) {
      if (DecodeBlockHash(s, &h)) w->tier_hashes.insert(h);
    }
    for (const std::string& s : r.tier_removed()) {
      if (DecodeBlockHash(s, &h)) w->tier_hashes.erase(h);
    }
  }
  if (options_.store != nullptr) {
    BlockHash h;
    for (const std::string& s : r.store_stored()) {
      if (DecodeBlockHash(s, &h)) options_.store->Insert(h);
    }
  }
  w->has_store = false;
  for (const auto& t : r.info().kv_offload().tiers()) w->has_store = w->has_store || t.name() == "redis";
  w->last_seq = r.last_seq();
  w->events = options_.use_events;
  w->info = r.info();
  const auto now = Clock::now();
  std::erase_if(w->lora_changes, [&](const Worker::LoraChange& c) { return now - c.at > options_.event_grace; });
  for (const Worker::LoraChange& c : w->lora_changes) ApplyLoraChange(c.change, c.added, &w->info);
  for (auto it = w->lora_routed.begin(); it != w->lora_routed.end();) {
    if (now - it->second > options_.event_grace) {
      w->lora_routed.erase(it++);
    } else {
      ++it;
    }
  }
  w->pending_blocks = 0;
  if (!w->reported) {
    PD_LOG(Info) << (options_.prefill_tier ? "prefill" : "decode") << " worker " << w->address
                 << " joined (it reported its load)";
  }
  w->reported = true;
  w->healthy = true;
  w->last_report = Clock::now();
  cv_.notify_all();
}

void WorkerPool::WatchEnded(const std::shared_ptr<Worker>& w, Watch* watch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (w->watch == watch) w->watch = nullptr;
  ++w->failed_watches;
  // A lost stream means a worker we cannot see: leave it out until it reports again.
  if (w->last_seq != 0) {
    w->healthy = false;
    w->reconnect_at = Clock::now() + options_.reconnect_every;
  } else if (w->failed_watches == 1) {
    // A gap resync (or the first try): reconnect at once, the worker reports within milliseconds.
    w->reconnect_at = Clock::now();
  } else {
    // A worker that is not up yet or gone: back off from 50 ms to reconnect_every. Retrying at
    // once spun a core (the stream to a closed port fails immediately) while a router waited
    // for workers that had not started.
    const int doublings = std::min(w->failed_watches - 2, 10);
    w->reconnect_at = Clock::now() + std::min<std::chrono::milliseconds>(
                                         options_.reconnect_every,
                                         std::chrono::milliseconds(50) * (1 << doublings));
  }
  --live_watches_;
  cv_.notify_all();
}

void WorkerPool::Maintain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (stop_) break;
    const auto now = Clock::now();
    for (auto& w : order_) {
      if (w->watch == nullptr && !w->refused && now >= w->reconnect_at) StartWatch(w);
      if (w->healthy && now - w->last_report > options_.stale_after) {
        PD_LOG(Warning) << "worker " << w->address << " stopped reporting";
        w->healthy = false;
        if (w->watch != nullptr) w->watch->Cancel();
      }
    }
  }
}

bool WorkerPool::HasLora(const internal::v1::WorkerInfo& info, std::string_view name) {
  for (const v1::LoraAdapterInfo& a : info.lora_adapters()) {
    if (a.name() == name) return true;
  }
  return false;
}

const internal::v1::LoraAdapterState* WorkerPool::LoraState(const internal::v1::WorkerInfo& info,
                                                             std::string_view name) {
  for (const internal::v1::LoraAdapterState& s : info.lora_states()) {
    if (s.name() == name) return &s;
  }
  return nullptr;
}

void WorkerPool::ApplyLoraChange(const internal::v1::LoraAdapterChange& change, bool added,
                                 internal::v1::WorkerInfo* info) {
  const std::string& name = change.info().name();
  auto* adapters = info->mutable_lora_adapters();
  adapters->erase(std::remove_if(adapters->begin(), adapters->end(),
                                 [&](const v1::LoraAdapterInfo& a) { return a.name() == name; }),
                  adapters->end());
  auto* states = info->mutable_lora_states();
  states->erase(std::remove_if(states->begin(), states->end(),
                               [&](const internal::v1::LoraAdapterState& s) { return s.name() == name; }),
                states->end());
  if (added) {
    *info->add_lora_adapters() = change.info();
    *info->add_lora_states() = change.state();
  }
}

int WorkerPool::LoraLoadCost(const Worker& w, std::string_view name, Clock::time_point now) const {
  auto recent = [&](std::string_view n) {
    auto it = w.lora_routed.find(AsAbsl(n));
    return it != w.lora_routed.end() && now - it->second < options_.event_grace;
  };
  const internal::v1::LoraAdapterState* state = LoraState(w.info, name);
  if ((state != nullptr && state->loaded()) || recent(name)) return 0;
  if (w.info.max_cpu_loras() <= 0) return 1;
  int64_t loaded = 0;
  for (const internal::v1::LoraAdapterState& s : w.info.lora_states()) loaded += s.loaded() || recent(s.name());
  return loaded < w.info.max_cpu_loras() ? 1 : 2;
}

std::optional<BlockHash> WorkerPool::LoraKvRoot(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : order_) {
    if (!w->healthy || w->refused) continue;
    const internal::v1::LoraAdapterState* s = LoraState(w->info, name);
    BlockHash root;
    if (s != nullptr && DecodeBlockHash(s->kv_root(), &root)) return root;
  }
  return std::nullopt;
}

std::vector<std::pair<std::shared_ptr<WorkerPool::Worker>, internal::v1::WorkerInfo>>
WorkerPool::UsableWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::shared_ptr<Worker>, internal::v1::WorkerInfo>> out;
  for (const auto& w : order_) {
    if (w->healthy && !w->refused) out.emplace_back(w, w->info);
  }
  return out;
}

void WorkerPool::NoteLoraChange(const std::shared_ptr<Worker>& w,
                                const internal::v1::LoraAdapterChange& change, bool added) {
  std::lock_guard<std::mutex> lock(mu_);
  ApplyLoraChange(change, added, &w->info);
  w->lora_changes.push_back({change, added, Clock::now()});
}

bool WorkerPool::ServesLora(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : order_) {
    if (w->healthy && !w->refused && HasLora(w->info, name)) return true;
  }
  return false;
}

std::vector<v1::LoraAdapterInfo> WorkerPool::LoraAdapters() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::LoraAdapterInfo> out;
  for (const auto& w : order_) {
    if (!w->healthy || w->refused) continue;
    for (const v1::LoraAdapterInfo& a : w->info.lora_adapters()) {
      const bool seen = std::any_of(out.begin(), out.end(),
                                    [&](const v1::LoraAdapterInfo& o) { return o.name() == a.name(); });
      if (!seen) out.push_back(a);
    }
  }
  return out;
}

std::optional<WorkerPool::Pick> WorkerPool::Choose(const RoutingOptions& routing,
                                                   absl::Span<const BlockHash> prompt_hashes,
                                                   int64_t prompt_blocks,
                                                   absl::Span<const Worker* const> exclude,
                                                   std::string_view lora_name) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Worker>> usable;
  std::vector<WorkerCandidate> candidates;
  const auto now = Clock::now();
  for (auto& w : order_) {
    if (!w->healthy || w->refused) continue;
    if (std::find(exclude.begin(), exclude.end(), w.get()) != exclude.end()) continue;
    if (!lora_name.empty() && !HasLora(w->info, lora_name)) continue;
    WorkerCandidate c;
    if (!lora_name.empty()) c.lora_load = LoraLoadCost(*w, lora_name, now);
    c.active_blocks = w->info.used_blocks() + w->pending_blocks;
    c.waiting = w->info.waiting();
    const double half_lives = std::chrono::duration<double>(now - w->recent_at).count() /
                              std::chrono::duration<double>(options_.recent_half_life).count();
    w->recent *= std::exp2(-half_lives);
    w->recent_at = now;
    c.recent_blocks = w->recent;
    for (const BlockHash& h : prompt_hashes) {
      bool held = w->events && w->hashes.contains(h);
      if (!held) {
        auto it = w->predicted.find(h);
        held = it != w->predicted.end() &&
               now - it->second < (w->events ? options_.event_grace : options_.approx_ttl);
      }
      if (!held) break;
      ++c.cached_prefix_blocks;
    }
    if (w->events && !w->info.kv_offload().loads_declined()) {
      // The blocks after those that the worker would load from its tiers rather than compute (a
      // worker whose tiers read slower than it computes says so: it would compute them).
      for (size_t i = static_cast<size_t>(c.cached_prefix_blocks); i < prompt_hashes.size(); ++i) {
        const BlockHash& h = prompt_hashes[i];
        if (!w->tier_hashes.contains(h) &&
            !(w->has_store && options_.store != nullptr && options_.store->Contains(h))) {
          break;
        }
        ++c.tier_prefix_blocks;
      }
    }
    usable.push_back(w);
    candidates.push_back(c);
  }
  if (usable.empty()) return std::nullopt;
  rng_state_ = Mix64(rng_state_);
  const RoutingDecision d = ChooseWorker(routing, candidates, prompt_blocks,
                                         round_robin_.fetch_add(1),
                                         static_cast<double>(rng_state_ >> 11) * 0x1.0p-53);
  Pick pick{usable[d.index], candidates[d.index].cached_prefix_blocks, candidates[d.index].tier_prefix_blocks,
            d.fell_back};
  Worker& w = *pick.worker;
  w.pending_blocks += prompt_blocks;
  w.recent += static_cast<double>(prompt_blocks);
  ++w.inflight;
  ++w.decisions;
  if (!lora_name.empty()) w.lora_routed[std::string(lora_name)] = now;
  for (const BlockHash& h : prompt_hashes) w.predicted[h] = now;
  if (w.predicted.size() > 4 * (prompt_hashes.size() + 1024)) {
    const auto keep = w.events ? options_.event_grace : options_.approx_ttl;
    for (auto it = w.predicted.begin(); it != w.predicted.end();) {
      if (now - it->second >= keep) {
        w.predicted.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return pick;
}

void WorkerPool::Done(const std::shared_ptr<Worker>& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  --worker->inflight;
}

bool WorkerPool::Saturated(int64_t waiting) const {
  std::lock_guard<std::mutex> lock(mu_);
  bool any = false;
  for (const auto& w : order_) {
    if (!w->healthy || w->refused) continue;
    any = true;
    if (w->info.waiting() < waiting) return false;
  }
  return any;
}

size_t WorkerPool::usable() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& w : order_) n += w->healthy && !w->refused;
  return n;
}

std::vector<WorkerPool::WorkerStats> WorkerPool::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerStats> out;
  for (const auto& w : order_) {
    out.push_back({w->address, w->healthy, w->refused, w->decisions, w->inflight, w->info});
  }
  return out;
}

bool WorkerPool::WaitForReports(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    for (const auto& w : order_) {
      if (!w->reported && !w->refused) return false;
    }
    return true;
  });
}

}  // namespace pdserve
