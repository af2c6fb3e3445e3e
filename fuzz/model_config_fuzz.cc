// libFuzzer target: config.json parsing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto config = pdserve::ModelConfig::FromJson(json, "fuzz/config.json");
  (void)config;
  return 0;
}
