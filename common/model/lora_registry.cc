#include "common/model/lora_registry.h"

#include <algorithm>
#include <utility>

#include "common/base/strings.h"

namespace pdserve {

LoraRegistry::LoraRegistry(ModelConfig base, LoraRegistryOptions options)
    : base_(std::move(base)), options_(options) {}

absl::Status LoraRegistry::Add(const std::string& name, const std::string& dir) {
  if (name.empty()) return absl::InvalidArgumentError("lora_name: an adapter needs a name");
  {
    absl::MutexLock lock(&mu_);
    if (entries_.contains(AsAbsl(name))) {
      return absl::AlreadyExistsError(Str("a LoRA adapter named '", name, "' is already served"));
    }
  }
  auto adapter = LoraAdapter::Load(name, dir, base_, options_.max_rank);
  if (!adapter.ok()) return adapter.status();
  absl::MutexLock lock(&mu_);
  if (entries_.contains(AsAbsl(name))) {  // Added meanwhile.
    return absl::AlreadyExistsError(Str("a LoRA adapter named '", name, "' is already served"));
  }
  Entry e;
  e.info = {name, dir, (*adapter)->base_model(), (*adapter)->rank(), (*adapter)->kv_root()};
  e.adapter = *std::move(adapter);
  e.added = next_added_++;
  ++loads_;
  entries_.emplace(name, std::move(e));
  lru_.push_front(name);
  if (options_.max_loaded > 0) TrimLocked(options_.max_loaded);  // Best effort: it stays served.
  return absl::OkStatus();
}

absl::Status LoraRegistry::Remove(std::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(AsAbsl(name));
  if (it == entries_.end()) {
    return absl::NotFoundError(Str("no LoRA adapter named '", name, "' is served"));
  }
  if (it->second.adapter != nullptr) lru_.remove(it->first);
  entries_.erase(it);
  return absl::OkStatus();
}

void LoraRegistry::TouchLocked(const std::string& name) {
  lru_.remove(name);
  lru_.push_front(name);
}

bool LoraRegistry::TrimLocked(int64_t keep) {
  int64_t loaded = static_cast<int64_t>(lru_.size());
  for (auto it = lru_.end(); loaded > keep && it != lru_.begin();) {
    --it;
    Entry& e = entries_.find(*it)->second;
    if (e.adapter.use_count() > 1) continue;  // A request runs with it.
    e.adapter.reset();
    it = lru_.erase(it);
    --loaded;
  }
  return loaded <= keep;
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> LoraRegistry::Acquire(std::string_view name) {
  std::string dir;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(AsAbsl(name));
    if (it == entries_.end()) {
      return absl::NotFoundError(Str("no LoRA adapter named '", name, "' is served"));
    }
    if (it->second.adapter != nullptr) {
      TouchLocked(it->first);
      return it->second.adapter;
    }
    if (options_.max_loaded > 0 && !TrimLocked(options_.max_loaded - 1)) {
      return absl::ResourceExhaustedError(
          Str("LoRA adapter '", name, "' is not loaded and all ", options_.max_loaded,
              " loaded adapters (--max-cpu-loras) are in use"));
    }
    dir = it->second.info.path;
  }
  // Loaded outside the lock: other adapters stay available meanwhile.
  auto adapter = LoraAdapter::Load(std::string(name), dir, base_, options_.max_rank);
  if (!adapter.ok()) return adapter.status();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(AsAbsl(name));
  if (it == entries_.end()) {
    return absl::NotFoundError(Str("no LoRA adapter named '", name, "' is served"));
  }
  if (it->second.adapter == nullptr) {  // Else loaded meanwhile by another caller.
    it->second.adapter = *std::move(adapter);
    it->second.info.kv_root = it->second.adapter->kv_root();  // Its files may have changed.
    ++loads_;
  }
  TouchLocked(it->first);
  return it->second.adapter;
}

bool LoraRegistry::Serves(std::string_view name) const {
  absl::MutexLock lock(&mu_);
  return entries_.contains(AsAbsl(name));
}

std::vector<LoraInfo> LoraRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, LoraInfo>> all;
  for (const auto& [name, e] : entries_) {
    all.emplace_back(e.added, e.info);
    all.back().second.loaded = e.adapter != nullptr;
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LoraInfo> out;
  for (auto& [added, info] : all) out.push_back(std::move(info));
  return out;
}

std::optional<BlockHash> LoraRegistry::KvRoot(std::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(AsAbsl(name));
  if (it == entries_.end()) return std::nullopt;
  return it->second.info.kv_root;
}

int64_t LoraRegistry::loads() const {
  absl::MutexLock lock(&mu_);
  return loads_;
}

int64_t LoraRegistry::loaded() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(lru_.size());
}

}  // namespace pdserve
