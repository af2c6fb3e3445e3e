// Host-side planning of the attention launches (no CUDA needed; tested on the host): how many
// keys each decode split takes, and the prefill tiles of a step's rows.
#ifndef PDSERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
#define PDSERVE_KERNELS_CUDA_ATTENTION_PLAN_H_

#include <cstdint>
#include <vector>

namespace pdserve::cuda {

// Shared memory a decode block may use without opting in.
inline constexpr int kDecodeSharedBytes = 48 * 1024;

struct DecodeSplit {
  int split_tokens = 0;  // Keys per split: a multiple of 32.
  int max_splits = 0;    // ceil(max_context / split_tokens): the grid's z.
};
// Enough splits that rows * num_kv_heads * splits blocks fill about 2 waves of `sms`
// multiprocessors, but no split shorter than 64 keys, and each split's scores within
// kDecodeSharedBytes. max_context >= 1.
DecodeSplit PlanDecodeSplits(int rows, int num_kv_heads, int group, int head_dim, int max_context,
                             int sms);

// Floats the decode workspace needs for a plan.
int64_t DecodePartialFloats(int rows, int num_heads, int max_splits, int head_dim);
int64_t DecodePartialMlFloats(int rows, int num_heads, int max_splits);

// Tiles of up to `tile_rows` consecutive rows of one sequence (row_seq[r] is row r's sequence;
// a sequence's rows are consecutive, as in a ForwardBatch).
void MakePrefillTiles(const std::vector<int32_t>& row_seq, int tile_rows,
                      std::vector<int32_t>* first_row, std::vector<int32_t>* num_rows);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_ATTENTION_PLAN_H_
