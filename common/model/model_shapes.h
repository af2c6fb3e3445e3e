// Model shapes by name, for benchmarks without a checkpoint (bench-engine --random-weights): the
// config.json of a few open models as published (layers, widths, heads, vocabulary, RoPE), or any
// config.json file or model directory.
#ifndef PDSERVE_COMMON_MODEL_MODEL_SHAPES_H_
#define PDSERVE_COMMON_MODEL_MODEL_SHAPES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace pdserve {

// The names ModelShape knows.
std::vector<std::string> ModelShapeNames();

// `name_or_path`: one of ModelShapeNames(), a config.json file, or a directory holding one.
// NotFound listing the names when it is none of these.
absl::StatusOr<ModelConfig> ModelShape(const std::string& name_or_path);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_MODEL_SHAPES_H_
