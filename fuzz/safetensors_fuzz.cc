// libFuzzer target: the safetensors header parser (every malformed input must be a DataLoss error).
#include <cstddef>
#include <cstdint>

#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tensors = pdserve::ParseSafetensors(data, size, "fuzz.safetensors");
  if (tensors.ok()) {
    // Every tensor the parser accepts lies inside the image.
    for (const auto& t : *tensors) {
      if (t.data < data || t.data + t.nbytes > data + size) __builtin_trap();
    }
  }
  return 0;
}
