// A read-only memory mapping of a whole file. Model weights are used straight from the mapping
// (no copy), so a 100 GB checkpoint costs page cache, not heap.
#ifndef PDSERVE_COMMON_BASE_MAPPED_FILE_H_
#define PDSERVE_COMMON_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace pdserve {

// Thread-safe after construction (immutable). Move-only; unmaps on destruction.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside [p, p + n) from the process's resident set (MADV_DONTNEED: the
  // mapping is read-only, so a page touched again is read back from the file). Ranges outside
  // the mapping are left alone. For bytes that were copied elsewhere (cpu_matrices).
  void Release(const void* p, size_t n) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_MAPPED_FILE_H_
