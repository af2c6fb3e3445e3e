#include "common/rpc/load_publisher.h"

#include <cstring>
#include <string_view>

#include "common/rpc/stream_writer.h"

namespace pdserve {
namespace {

// The medium of a KvTier that other workers share (RedisTier's).
bool IsSharedStore(const char* medium) { return std::string_view(medium) == "STORE"; }

}  // namespace


class LoadPublisher::Watcher : public StreamWriter<internal::v1::LoadReport> {
 public:
  explicit Watcher(LoadPublisher* publisher) : publisher_(publisher) {}

 private:
  void OnFinished() override {
    publisher_->Remove(this);
    delete this;
  }
  LoadPublisher* publisher_;
};

std::string EncodeBlockHash(const BlockHash& h) {
  std::string out(16, '\0');
  std::memcpy(out.data(), &h.lo, 8);
  std::memcpy(out.data() + 8, &h.hi, 8);
  return out;
}

bool DecodeBlockHash(const std::string& bytes, BlockHash* h) {
  if (bytes.size() != 16) return false;
  std::memcpy(&h->lo, bytes.data(), 8);
  std::memcpy(&h->hi, bytes.data() + 8, 8);
  return true;
}

LoadPublisher::LoadPublisher(std::chrono::milliseconds interval, size_t max_kept_events)
    : interval_(interval), max_kept_events_(max_kept_events) {
  thread_ = std::thread([this] { Loop(); });
}

LoadPublisher::~LoadPublisher() {
  Shutdown();
  if (thread_.joinable()) thread_.join();
}

void LoadPublisher::Shutdown() {
  // Under the lock: a watcher can only be deleted after it removed itself, which needs the lock.
  // (gRPC runs reactions on its own threads, never inline from Close.)
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  for (auto& [w, seq] : watchers_) {
    w->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down"));
  }
}

void LoadPublisher::Publish(const internal::v1::WorkerInfo& info,
                            const std::vector<KvEvent>& events) {
  std::lock_guard<std::mutex> lock(mu_);
  info_ = info;
  for (const KvEvent& e : events) {
    // Routers need no tokens. A tier's events keep their medium: a shared store's ("STORE") are
    // reported apart (any worker can load them), the others are this worker's tiers.
    recent_.emplace_back(++last_seq_, KvEvent{e.type, e.hash, {}, {}, e.medium, {}});
    if (e.medium != nullptr && IsSharedStore(e.medium)) {
      if (e.type == KvEvent::Type::kStored && store_written_.insert(e.hash).second) {
        store_order_.push_back(e.hash);
        if (store_order_.size() > kMaxStoreHashes) {
          store_written_.erase(store_order_.front());
          store_order_.pop_front();
        }
      }
      continue;
    }
    absl::flat_hash_set<BlockHash>& set = e.medium == nullptr ? indexed_ : tier_indexed_;
    if (e.type == KvEvent::Type::kStored) {
      set.insert(e.hash);
    } else {
      set.erase(e.hash);
    }
  }
  while (recent_.size() > max_kept_events_) recent_.pop_front();
}

grpc::ServerWriteReactor<internal::v1::LoadReport>* LoadPublisher::Watch(
    const internal::v1::WatchLoadRequest& request) {
  auto* w = new Watcher(this);
  internal::v1::LoadReport first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      w->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down"));
      return w;
    }
    uint64_t applied = request.after_seq();
    BuildReport(&applied, /*force=*/true, &first);
    watchers_[w] = applied;
  }
  w->Push(std::move(first));
  return w;
}

void LoadPublisher::Remove(Watcher* w) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(w);
}

bool LoadPublisher::BuildReport(uint64_t* applied, bool force, internal::v1::LoadReport* report) {
  *report->mutable_info() = info_;
  const uint64_t oldest = recent_.empty() ? last_seq_ + 1 : recent_.front().first;
  if (*applied == 0 || *applied + 1 < oldest || *applied > last_seq_) {
    report->set_snapshot(true);
    report->set_first_seq(last_seq_ + 1);
    report->set_last_seq(last_seq_);
    for (const BlockHash& h : indexed_) report->add_stored(EncodeBlockHash(h));
    for (const BlockHash& h : tier_indexed_) report->add_tier_stored(EncodeBlockHash(h));
    for (const BlockHash& h : store_order_) report->add_store_stored(EncodeBlockHash(h));
    *applied = last_seq_;
    return true;
  }
  if (*applied == last_seq_ && !force) return false;
  report->set_first_seq(*applied + 1);
  report->set_last_seq(last_seq_);
  for (auto it = recent_.begin(); it != recent_.end(); ++it) {
    if (it->first <= *applied) continue;
    const KvEvent& e = it->second;
    const bool stored = e.type == KvEvent::Type::kStored;
    if (e.medium == nullptr) {
      *(stored ? report->add_stored() : report->add_removed()) = EncodeBlockHash(e.hash);
    } else if (IsSharedStore(e.medium)) {
      if (stored) report->add_store_stored(EncodeBlockHash(e.hash));
    } else {
      *(stored ? report->add_tier_stored() : report->add_tier_removed()) = EncodeBlockHash(e.hash);
    }
  }
  *applied = last_seq_;
  return true;
}

void LoadPublisher::Loop() {
  auto last_heartbeat = std::chrono::steady_clock::now();
  std::string last_info;
  for (;;) {
    std::this_thread::sleep_for(interval_);
    std::vector<std::pair<Watcher*, internal::v1::LoadReport>> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      const auto now = std::chrono::steady_clock::now();
      std::string info = info_.SerializeAsString();
      const bool heartbeat = now - last_heartbeat > std::chrono::seconds(1);
      const bool changed = info != last_info;
      if (heartbeat) last_heartbeat = now;
      last_info = std::move(info);
      for (auto& [w, applied] : watchers_) {
        internal::v1::LoadReport r;
        if (BuildReport(&applied, heartbeat || changed, &r)) out.emplace_back(w, std::move(r));
      }
      // Push under the lock: a watcher removes itself under the same lock before it is deleted.
      for (auto& [w, r] : out) w->Push(std::move(r));
    }
  }
}

}  // namespace pdserve
