// Reading the safetensors format: an 8-byte little-endian header length, a JSON header mapping
// tensor names to {dtype, shape, data_offsets}, then the raw data. The file is memory-mapped and
// tensors are handed out as pointers into the mapping.
//
// Every malformed input (truncated file, bad JSON, offsets out of range, size/shape mismatch) is
// an absl::Status naming the file and, where there is one, the tensor.
#ifndef PDSERVE_COMMON_MODEL_SAFETENSORS_H_
#define PDSERVE_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/base/mapped_file.h"

namespace pdserve {

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;        // As written ("F32", "I64", ...).
  std::optional<DType> dtype;    // Unset when the dtype is one pdserve cannot compute with.
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// Parses the header of an in-memory safetensors image. `data` must stay alive while the returned
// tensors are used. `source` names the file in errors. Exposed for the fuzzer.
absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(const uint8_t* data, size_t size,
                                                                std::string_view source);

// Thread-safe after Open (immutable).
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;
  void ReleasePages(const void* p, size_t n) const { file_->Release(p, n); }  // MappedFile's.

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> file_;
  std::vector<SafetensorsTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_SAFETENSORS_H_
