// libFuzzer target: the GGUF reader. Every malformed input must be an InvalidArgument error
// naming the file (never a crash or an allocation the input's size does not justify), every
// tensor it accepts must lie inside the image, and dequantizing it must be defined behaviour.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/model/gguf.h"
#include "kernels/cpu/quant_blocks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = pdserve::GgufFile::Parse(data, size, "fuzz.gguf");
  if (!g.ok()) {
    if (g.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  std::vector<float> out;
  for (const pdserve::GgufTensor& t : (*g)->tensors()) {
    if (t.data < data || t.data + t.bytes > data + size) __builtin_trap();
    if (t.elements() <= (1 << 16)) {
      out.resize(static_cast<size_t>(t.elements()));
      pdserve::kernels::DequantizeRow(t.type, t.data, out.data(), t.elements());
    }
  }
  return 0;
}
