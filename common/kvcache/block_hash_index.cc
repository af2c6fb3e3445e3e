#include "common/kvcache/block_hash_index.h"

#include "common/base/check.h"

namespace pdserve {

BlockHashIndex::BlockHashIndex(int64_t max_entries) : max_entries_(max_entries) {
  PD_CHECK(max_entries >= 0);
  int log2 = 4;  // At least 16 entries.
  while ((int64_t{1} << log2) < 2 * max_entries) ++log2;
  entries_.resize(size_t{1} << log2);
  mask_ = entries_.size() - 1;
  shift_ = 64 - log2;
}

void BlockHashIndex::Insert(uint64_t lo, Block block) {
  PD_CHECK_MSG(size_ < max_entries_, "BlockHashIndex: more entries than it was sized for");
  size_t i = Home(lo);
  while (entries_[i].block >= 0) i = (i + 1) & mask_;
  entries_[i] = Entry{lo, block};
  ++size_;
}

void BlockHashIndex::Erase(uint64_t lo, Block block) {
  size_t hole = Home(lo);
  while (entries_[hole].block != block) {
    PD_CHECK_MSG(entries_[hole].block >= 0, "BlockHashIndex: erasing an entry that is not there");
    hole = (hole + 1) & mask_;
  }
  // Backward shift: each later entry of the run moves into the hole unless its home lies
  // cyclically in (hole, its place], where the probe from its home would not pass the hole.
  for (size_t j = (hole + 1) & mask_; entries_[j].block >= 0; j = (j + 1) & mask_) {
    const size_t home = Home(entries_[j].lo);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!stays) {
      entries_[hole] = entries_[j];
      hole = j;
    }
  }
  entries_[hole] = Entry{};
  --size_;
}

}  // namespace pdserve
