// The LoRA adapters a process serves, by name: where each one's files are, and which are loaded
// (at most `max_loaded`, vLLM's --max-cpu-loras; the least recently used adapter that no
// request holds is dropped to make room, and loaded again from its directory when asked for).
// Shared by the process's engines and its API (--lora-modules at start, the load and unload
// endpoints at run time). Thread-safe.
#ifndef PDSERVE_COMMON_MODEL_LORA_REGISTRY_H_
#define PDSERVE_COMMON_MODEL_LORA_REGISTRY_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model/lora_adapter.h"
#include "common/model/model_config.h"

namespace pdserve {

// The longest adapter name a request or a runtime load may give.
inline constexpr size_t kMaxLoraNameBytes = 256;

struct LoraRegistryOptions {
  int64_t max_rank = 16;      // --max-lora-rank (vLLM's default).
  int64_t max_loaded = 0;     // --max-cpu-loras; <= 0: no bound.
  // Adapters may be added and removed while serving (--enable-lora-runtime-updates: the
  // workers' LoadLoraAdapter and UnloadLoraAdapter RPCs); Add and Remove themselves do not check.
  bool runtime_updates = false;
};

// A served adapter as the API lists it.
struct LoraInfo {
  std::string name;
  std::string path;
  std::string base_model;  // adapter_config.json's base_model_name_or_path.
  int64_t rank = 0;
  BlockHash kv_root;    // LoraAdapter::kv_root of its latest load.
  bool loaded = false;  // In memory now (List's copy).
};

class LoraRegistry {
 public:
  LoraRegistry(ModelConfig base, LoraRegistryOptions options);

  // Loads the adapter at `dir` (every check of LoraAdapter::Load) and serves it as `name`.
  // AlreadyExists when the name is taken; InvalidArgument for an empty name.
  absl::Status Add(const std::string& name, const std::string& dir);
  // Stops serving `name` (NotFound if it is not served). Requests running with it finish: each
  // holds the adapter.
  absl::Status Remove(std::string_view name);
  // The adapter for a request, loaded from its directory again if it was dropped. NotFound for a
  // name not served; ResourceExhausted when it must be loaded and every loaded adapter is held by
  // a request.
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> Acquire(std::string_view name);
  bool Serves(std::string_view name) const;
  // The KV root of `name`'s requests (LoraAdapter::kv_root, as of its latest load); nullopt for a
  // name not served.
  std::optional<BlockHash> KvRoot(std::string_view name) const;
  std::vector<LoraInfo> List() const;  // In the order they were added.
  int64_t loaded() const;
  int64_t loads() const;  // Adapters read from disk since start (Add, and reloads by Acquire).
  const LoraRegistryOptions& options() const { return options_; }

 private:
  struct Entry {
    LoraInfo info;
    std::shared_ptr<const LoraAdapter> adapter;  // Null while not loaded.
    uint64_t added = 0;
  };
  // Drops loaded adapters no request holds, least recently used first, until at most `keep` are
  // loaded; false if that many cannot be dropped.
  bool TrimLocked(int64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ModelConfig base_;
  const LoraRegistryOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // Loaded ones, most recent first.
  uint64_t next_added_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_LORA_REGISTRY_H_
