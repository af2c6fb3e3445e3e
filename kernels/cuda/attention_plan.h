// Host-side planning of the attention launches (no CUDA needed; tested on the host): how many
// keys each decode split takes, and the prefill tiles of a step's rows.
#ifndef PDSERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
#define PDSERVE_KERNELS_CUDA_ATTENTION_PLAN_H_

#include <cstdint>
#include <vector>

#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

// Shared memory a decode block may use (it does not opt in to more: launch_config.h).
inline constexpr int kDecodeSharedBytes = static_cast<int>(kSharedBytesDefault);

struct DecodeSplit {
  int split_tokens = 0;  // Keys per split: a multiple of 32.
  int max_splits = 0;    // ceil(max_context / split_tokens): the grid's z.
};
// Keys per split when shared memory allows.
inline constexpr int kDecodeSplitTokens = 256;
// Splits of kDecodeSplitTokens keys (fewer where a split's scores would not fit beside the group's
// queries in kDecodeSharedBytes). The split length depends on the model's shape only, never on
// the batch: a row's keys are then cut, summed and merged the same way whatever rows share its
// step and whatever their contexts, so decode attention is batch-invariant (each output's
// operations fixed, as on the CPU). A plan sized to the batch (more, shorter splits for few rows)
// would fill a GPU better at batch 1 but change a row's sums with its neighbours. max_context >= 1.
DecodeSplit PlanDecodeSplits(int group, int head_dim, int max_context);

// Floats the decode workspace needs for a plan.
int64_t DecodePartialFloats(int rows, int num_heads, int max_splits, int head_dim);
int64_t DecodePartialMlFloats(int rows, int num_heads, int max_splits);

// Tiles of up to `tile_rows` consecutive rows of one sequence (row_seq[r] is row r's sequence;
// a sequence's rows are consecutive, as in a ForwardBatch).
void MakePrefillTiles(const std::vector<int32_t>& row_seq, int tile_rows,
                      std::vector<int32_t>* first_row, std::vector<int32_t>* num_rows);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
