#include "kernels/cuda/attention_plan.h"

#include <algorithm>

#include "kernels/cuda/attention_kernels.h"

namespace pdserve::cuda {

DecodeSplit PlanDecodeSplits(int group, int head_dim, int max_context) {
  // Longest split whose scores fit beside the group's queries in shared memory.
  const int fixed = DecodeSharedFloats(group, head_dim, 0);
  int longest = (kDecodeSharedBytes / static_cast<int>(sizeof(float)) - fixed) / group;
  longest = std::max(kWarpSize, longest / kWarpSize * kWarpSize);
  const int split = std::min(kDecodeSplitTokens, longest);
  return DecodeSplit{split, (std::max(max_context, 1) + split - 1) / split};
}

int64_t DecodePartialFloats(int rows, int num_heads, int max_splits, int head_dim) {
  return static_cast<int64_t>(rows) * num_heads * max_splits * head_dim;
}
int64_t DecodePartialMlFloats(int rows, int num_heads, int max_splits) {
  return static_cast<int64_t>(rows) * num_heads * max_splits * 2;
}

void MakePrefillTiles(const std::vector<int32_t>& row_seq, int tile_rows,
                      std::vector<int32_t>* first_row, std::vector<int32_t>* num_rows) {
  first_row->clear();
  num_rows->clear();
  for (int r = 0; r < static_cast<int>(row_seq.size()); ++r) {
    if (first_row->empty() || row_seq[r] != row_seq[first_row->back()] ||
        num_rows->back() == tile_rows) {
      first_row->push_back(r);
      num_rows->push_back(0);
    }
    ++num_rows->back();
  }
}

}  // namespace pdserve::cuda
