// A Hugging Face checkpoint directory: one model.safetensors, or shards listed by
// model.safetensors.index.json. Tensors are looked up by name across all shards.
#ifndef PDSERVE_COMMON_MODEL_CHECKPOINT_H_
#define PDSERVE_COMMON_MODEL_CHECKPOINT_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/base/strings.h"
#include "common/model/safetensors.h"

namespace pdserve {

// Thread-safe after Open (immutable).
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  struct Found {
    const SafetensorsTensor* tensor;
    const std::string* file;  // Path of the shard holding it, for error messages.
  };
  // NotFound names the tensor and the file(s) it was expected in.
  absl::StatusOr<Found> Find(std::string_view name) const;
  bool Has(std::string_view name) const { return tensors_.contains(AsAbsl(name)); }
  const std::string& dir() const { return dir_; }
  size_t num_files() const { return files_.size(); }
  // MappedFile::Release on whichever shard maps [p, p + n).
  void ReleasePages(const void* p, size_t n) const {
    for (const auto& f : files_) f->ReleasePages(p, n);
  }

 private:
  Checkpoint() = default;
  std::string dir_;
  std::string expected_in_;  // "model.safetensors" or "the shards of model.safetensors.index.json"
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, Found> tensors_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_CHECKPOINT_H_
