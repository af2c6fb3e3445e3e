// libFuzzer target: the safetensors header parser. Every malformed input must be a DataLoss
// error (never a crash, another code, or a tensor outside the image).
#include <cstddef>
#include <cstdint>

#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tensors = pdserve::ParseSafetensors(data, size, "fuzz.safetensors");
  if (!tensors.ok()) {
    if (tensors.status().code() != absl::StatusCode::kDataLoss) __builtin_trap();
    return 0;
  }
  // Every tensor the parser accepts lies inside the image.
  for (const auto& t : *tensors) {
    if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
  }
  return 0;
}
