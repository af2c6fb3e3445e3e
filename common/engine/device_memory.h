// Device memory held together: allocations made through one DeviceOps and freed together when the
// holder goes (after the device finished with them). DeviceModelRunner's buffers and
// DeviceWeights' matrices each live in one.
#ifndef PDSERVE_COMMON_ENGINE_DEVICE_MEMORY_H_
#define PDSERVE_COMMON_ENGINE_DEVICE_MEMORY_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "kernels/cuda/device_ops.h"

namespace pdserve {

class DeviceMemory {
 public:
  explicit DeviceMemory(std::shared_ptr<cuda::DeviceOps> ops) : ops_(std::move(ops)) {}
  ~DeviceMemory() {
    if (ops_ == nullptr) return;
    (void)ops_->Synchronize();
    for (void* p : allocations_) ops_->Free(p);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  absl::StatusOr<void*> Alloc(size_t bytes) {
    PD_ASSIGN_OR_RETURN(void* p, ops_->Alloc(bytes));
    allocations_.push_back(p);
    bytes_ += bytes;
    return p;
  }
  // A copy of v in device memory, complete on return (v may be a temporary); nullptr when empty.
  template <typename T>
  absl::StatusOr<T*> Copy(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    PD_ASSIGN_OR_RETURN(void* p, Alloc(v.size() * sizeof(T)));
    PD_RETURN_IF_ERROR(ops_->CopyIn(p, v.data(), v.size() * sizeof(T)));
    PD_RETURN_IF_ERROR(ops_->Synchronize());
    return static_cast<T*>(p);
  }
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<cuda::DeviceOps> ops_;
  std::vector<void*> allocations_;
  size_t bytes_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_DEVICE_MEMORY_H_
