// Writing safetensors files (used by `pdserve make-model` and by tests that build bad files).
#ifndef PDSERVE_COMMON_MODEL_SAFETENSORS_WRITER_H_
#define PDSERVE_COMMON_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/dtype.h"

namespace pdserve {

// Collects tensors in memory, then writes one file. Not thread-safe.
class SafetensorsWriter {
 public:
  // `values` are converted to `dtype` (round to nearest even for bf16/f16).
  void Add(std::string name, DType dtype, std::vector<int64_t> shape,
           const std::vector<float>& values);
  size_t total_bytes() const { return data_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::string>& names() const { return names_; }
  // The complete file image: header length, JSON header (space-padded to 8 bytes), data.
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    size_t begin;
    size_t end;
  };
  std::vector<Entry> entries_;
  std::vector<std::string> names_;
  std::string data_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_SAFETENSORS_WRITER_H_
