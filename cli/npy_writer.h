// Writes a float32 array in NumPy's .npy format (version 1.0), for --dump-logits.
#ifndef PDSERVE_CLI_NPY_WRITER_H_
#define PDSERVE_CLI_NPY_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::cli {

absl::Status WriteNpyFloat32(const std::string& path, const std::vector<float>& data,
                             const std::vector<int64_t>& shape);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_NPY_WRITER_H_
