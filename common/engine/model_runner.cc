#include "common/engine/model_runner.h"

#include "common/base/strings.h"
#include "common/engine/cpu_model_runner.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view backend,
                                                               const ModelRunnerOptions& options,
                                                               const ModelWeights* weights,
                                                               KvPool* pool) {
  if (backend == "cpu") {
    auto runner = CpuModelRunner::Create(options, weights, pool);
    if (!runner.ok()) return runner.status();
    return std::unique_ptr<ModelRunner>(std::move(*runner));
  }
  return absl::InvalidArgumentError(Str("unknown model runner backend '", backend,
                                        "' (available: cpu)"));
}

}  // namespace pdserve
