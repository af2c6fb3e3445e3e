#include "kernels/cpu/kv_prefetch.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/kvcache/kv_cache_spec.h"
#include "gtest/gtest.h"

namespace pdserve::kernels {
namespace {

// The spans PrefetchRows fetches cover exactly the rows of positions [first, min(first + count,
// end)), each row at the address the kernels read it from, block by block; and they read no
// block-table entry past the one of position end - 1 (the table here holds exactly those, so a
// read past it is a heap overflow under the sanitizer build). Power-of-two and other block sizes.
TEST(KvPrefetchTest, SpansAreTheRowsOfTheRangeAndNothingElse) {
  for (int64_t bs : {16, 5, 1}) {
    for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kInt4}) {
      const KvCacheSpec spec{1, 3, 64, bs, dtype};
      const int64_t end = 3 * bs + 2;  // The walk's last position is end - 1.
      std::vector<int32_t> table((end - 1) / bs + 1);
      for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((3 + 5 * i) % 8);
      std::vector<uint8_t> pool(spec.PageBytes() * 8);
      const KvPagesView view{pool.data(), spec.PageBytes(), bs, 3, 64, dtype};
      for (int64_t row_head : {0, 4}) {  // K of KV head 0, V of KV head 1.
        for (int64_t first = 0; first <= end + 3; ++first) {
          for (int64_t count : {1, 8, 32}) {
            std::vector<const uint8_t*> rows;
            ForEachRowSpan(view, table.data(), row_head, first, count, end,
                           [&](int32_t block, int64_t slot, int64_t n, const uint8_t* row) {
              EXPECT_EQ(row, view.Key(block, row_head, slot));
              EXPECT_LE(slot + n, bs);
              for (int64_t r = 0; r < n; ++r) rows.push_back(row + r * view.RowBytes());
            });
            std::vector<const uint8_t*> want;
            for (int64_t p = first; p < std::min(first + count, end); ++p) {
              want.push_back(view.Key(table[p / bs], row_head, p % bs));
            }
            EXPECT_EQ(rows, want) << "bs " << bs << " first " << first << " count " << count;
            PrefetchRows(view, table.data(), row_head, first, count, end);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::kernels
