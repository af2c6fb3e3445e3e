// The paged attention kernels (attention_kernels.h), run by the host execution layer (test
// infrastructure, host_exec.h), against kernels::PagedAttention over the same pool bytes: decode
// with one and many splits (the merge), GQA groups, windows, tails of blocks and of splits; the
// tiled prefill kernel over chunks that start mid-sequence (a cached prefix) and cross blocks.
#include "kernels/cuda/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/host_device_ops.h"
#include "kernels/cuda/host_exec.h"
#include "kernels/cuda/kernel_test_util.h"
#include "kernels/cuda/kv_format.h"

namespace pdserve::cuda {
namespace {

using testing::AttnCase;
using testing::CaseName;
using testing::ExpectClose;
using testing::PrefillTolerance;
using testing::RandomVector;
using testing::TestPool;
using Fixture = testing::AttentionFixture;

// threads 0: production's launch (launch_config.h); else that block size, which the kernel must
// hold at too.
void RunDecode(DecodeAttentionParams& p, int threads) {
  ASSERT_TRUE(CreateHostDeviceOps(threads)->DecodeAttention(p).ok());
}

class DecodeAttentionHostTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(DecodeAttentionHostTest, EqualsCpuPagedAttention) {
  const AttnCase c = GetParam();
  // Three sequences: a long one (many splits, block and split tails), a one-token one, a middle one.
  Fixture f(c, {61, 1, 30}, 11);
  const std::vector<int32_t> positions = {60, 0, 29, 17};
  const std::vector<int32_t> row_seq = {0, 1, 2, 0};
  SplitMix64 rng(12);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  std::vector<float> out;
  DecodeAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  p.num_rows = static_cast<int>(positions.size());
  p.split_tokens = c.split_tokens;
  p.max_splits = (61 + c.split_tokens - 1) / c.split_tokens;
  std::vector<float> partial(positions.size() * c.heads * p.max_splits * c.head_dim, NAN);
  std::vector<float> partial_ml(positions.size() * c.heads * p.max_splits * 2, NAN);
  p.partial = partial.data();
  p.partial_ml = partial_ml.data();
  {
    host::ScopedScheduleOrder order(host::ScheduleOrder::kForward);
    RunDecode(p, 0);
  }
  ExpectClose(out, f.Cpu(positions, row_seq, q));
  // The same bits with the host layer's threads and blocks reversed (no race; host_exec.h), and
  // with another block size.
  const std::vector<float> forward = out;
  for (int threads : {0, 64}) {
    std::fill(out.begin(), out.end(), NAN);
    {
      host::ScopedScheduleOrder reverse(host::ScheduleOrder::kReverse);
      RunDecode(p, threads);
    }
    EXPECT_EQ(std::memcmp(forward.data(), out.data(), out.size() * sizeof(float)), 0) << threads;
  }
}

TEST_P(DecodeAttentionHostTest, OnlyTheListedRowsOfAMixedStep) {
  const AttnCase c = GetParam();
  Fixture f(c, {61, 1, 30}, 11);
  const std::vector<int32_t> positions = {60, 0, 29, 17}, row_seq = {0, 1, 2, 0}, rows = {3, 0};
  SplitMix64 rng(15);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  std::vector<float> out;
  DecodeAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  p.num_rows = 2;
  p.rows = rows.data();
  p.split_tokens = c.split_tokens;
  p.max_splits = (61 + c.split_tokens - 1) / c.split_tokens;
  std::vector<float> partial(2 * c.heads * p.max_splits * c.head_dim), ml(2 * c.heads * p.max_splits * 2);
  p.partial = partial.data();
  p.partial_ml = ml.data();
  RunDecode(p, 32);
  const std::vector<float> cpu = f.Cpu(positions, row_seq, q);
  const size_t hd = static_cast<size_t>(c.heads * c.head_dim);
  for (size_t r = 0; r < positions.size(); ++r) {
    for (size_t i = 0; i < hd; ++i) {
      if (r == 0 || r == 3) {
        ASSERT_NEAR(out[r * hd + i], cpu[r * hd + i], 3e-6f * (1 + std::fabs(cpu[r * hd + i])));
      } else {
        ASSERT_TRUE(std::isnan(out[r * hd + i])) << "row " << r << " is not in the list";
      }
    }
  }
}

// With one split length, a row's output is the same bits alone or beside longer rows (a wider
// grid, more splits for others): what makes the device runner's decode batch-invariant
// (PlanDecodeSplits depends on the shape only). Another split length gives other bits, so the
// comparison can tell.
TEST_P(DecodeAttentionHostTest, ARowIsTheSameBitsWhateverRowsShareTheLaunch) {
  const AttnCase c = GetParam();
  Fixture f(c, {61, 1, 30}, 11);
  const std::vector<int32_t> positions = {60, 0, 29, 17}, row_seq = {0, 1, 2, 0};
  SplitMix64 rng(16);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  const size_t hd = static_cast<size_t>(c.heads * c.head_dim);
  // Rows `rows` in one launch of `split` keys per split; row 2's output.
  auto row2 = [&](std::vector<int32_t> rows, int split, int max_context) {
    std::vector<float> out;
    DecodeAttentionParams p;
    p.a = f.Params(positions, row_seq, q, &out);
    p.num_rows = static_cast<int>(rows.size());
    p.rows = rows.data();
    p.split_tokens = split;
    p.max_splits = (max_context + split - 1) / split;
    std::vector<float> partial(rows.size() * c.heads * p.max_splits * c.head_dim);
    std::vector<float> ml(rows.size() * c.heads * p.max_splits * 2);
    p.partial = partial.data();
    p.partial_ml = ml.data();
    RunDecode(p, 32);
    return std::vector<float>(out.begin() + 2 * hd, out.begin() + 3 * hd);
  };
  const std::vector<float> alone = row2({2}, c.split_tokens, 30);
  const std::vector<float> among = row2({0, 3, 2, 1}, c.split_tokens, 61);
  EXPECT_EQ(std::memcmp(alone.data(), among.data(), hd * sizeof(float)), 0);
  if (c.window == 0 && c.split_tokens < 30) {  // Several splits: another length, other sums.
    EXPECT_NE(row2({2}, c.split_tokens * 2, 30), alone);
  }
}

TEST_P(DecodeAttentionHostTest, Bf16OutputIsTheRoundedF32Output) {
  const AttnCase c = GetParam();
  Fixture f(c, {40}, 13);
  const std::vector<int32_t> positions = {39}, row_seq = {0};
  SplitMix64 rng(14);
  const std::vector<float> q = RandomVector(rng, c.heads * c.head_dim);
  std::vector<float> out;
  DecodeAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  std::vector<uint16_t> out_bf16(out.size());
  p.a.out = out_bf16.data();
  p.a.out_type = ActType::kBF16;
  p.num_rows = 1;
  p.split_tokens = 64;
  p.max_splits = 1;
  RunDecode(p, 128);
  const std::vector<float> cpu = f.Cpu(positions, row_seq, q);
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_NEAR(Bf16ToF32(out_bf16[i]), cpu[i], 8e-3f * std::fabs(cpu[i]) + 1e-6f) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DecodeAttentionHostTest,
    ::testing::Values(AttnCase{KvDType::kF32, 4, 4, 32, 0, 16},     // MHA, 4 splits
                      AttnCase{KvDType::kF32, 8, 2, 64, 0, 64},     // GQA 4, one split
                      AttnCase{KvDType::kBF16, 8, 2, 64, 0, 24},    // splits not block-aligned
                      AttnCase{KvDType::kBF16, 6, 2, 128, 20, 16},  // window: leading splits empty
                      AttnCase{KvDType::kInt8, 8, 1, 64, 0, 16},    // GQA 8
                      AttnCase{KvDType::kInt4, 4, 2, 80, 13, 8},    // d not a power of two
                      AttnCase{KvDType::kInt8, 16, 1, 32, 0, 32},   // the widest group
                      AttnCase{KvDType::kBF16, 4, 2, 256, 0, 32},   // 8 elements a lane
                      AttnCase{KvDType::kInt4, 2, 1, 144, 9, 16}),  // 8 a lane, the last partly
    CaseName);

// Runs the prefill kernel that serves this pool (tensor cores or f32) over the rows, in tiles of
// the size that kernel takes, with the host layer's threads forward and then reversed: the two
// must give the same bits (a race between threads or blocks would not; host_exec.h).
std::vector<float> RunPrefill(Fixture& f, const std::vector<int32_t>& positions,
                              const std::vector<int32_t>& row_seq, const std::vector<float>& q) {
  std::vector<float> out;
  PrefillAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  std::vector<int32_t> first, n;
  MakePrefillTiles(row_seq, PrefillTileRows(ToKvFormat(f.c.dtype), f.c.head_dim), &first, &n);
  p.num_tiles = static_cast<int>(first.size());
  p.tile_first_row = first.data();
  p.tile_rows = n.data();
  {
    host::ScopedScheduleOrder order(host::ScheduleOrder::kForward);
    EXPECT_TRUE(CreateHostDeviceOps()->PrefillAttention(p).ok());  // As production launches it.
  }
  std::vector<float> forward = out;
  std::fill(out.begin(), out.end(), NAN);
  {
    host::ScopedScheduleOrder reverse(host::ScheduleOrder::kReverse);
    EXPECT_TRUE(CreateHostDeviceOps(64)->PrefillAttention(p).ok());
  }
  EXPECT_EQ(std::memcmp(forward.data(), out.data(), out.size() * sizeof(float)), 0)
      << "the output depends on the order threads run in: a race";
  return forward;
}

// Rows of a chunk [from, to) of sequence `seq`, appended.
void AddRows(int seq, int from, int to, std::vector<int32_t>* positions,
             std::vector<int32_t>* row_seq) {
  for (int pos = from; pos < to; ++pos) {
    positions->push_back(pos);
    row_seq->push_back(seq);
  }
}

class PrefillAttentionHostTest : public ::testing::TestWithParam<AttnCase> {};

// Sequences of lengths `lens`, the chunks [from, to) of each (one per sequence) as one step: the
// kernel for this pool against the CPU's attention.
void ExpectPrefillEqualsCpu(const AttnCase& c, const std::vector<int>& lens,
                            const std::vector<std::pair<int, int>>& chunks, uint64_t seed,
                            int blocks) {
  Fixture f(c, lens, seed, blocks);
  std::vector<int32_t> positions, row_seq;
  for (size_t s = 0; s < chunks.size(); ++s) {
    AddRows(static_cast<int>(s), chunks[s].first, chunks[s].second, &positions, &row_seq);
  }
  SplitMix64 rng(seed + 1);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  ExpectClose(RunPrefill(f, positions, row_seq, q), f.Cpu(positions, row_seq, q),
              PrefillTolerance(c.dtype, c.head_dim));
}

// Sequence 0: a chunk [23, 60) after a cached prefix of 23; sequence 1: a whole prompt of 19.
TEST_P(PrefillAttentionHostTest, EqualsCpuPagedAttentionForEveryRow) {
  ExpectPrefillEqualsCpu(GetParam(), {60, 19}, {{23, 60}, {0, 19}}, 21, Fixture::kBlocks);
}

// Chunks longer than a tile of rows, over more keys than a key tile: a chunk [37, 200) after a
// cached prefix (tiles of 64, 64 and 35 rows, each walking up to four key tiles), and a whole
// prompt of 70 beside it.
TEST_P(PrefillAttentionHostTest, LongChunksCrossRowAndKeyTiles) {
  ExpectPrefillEqualsCpu(GetParam(), {200, 70}, {{37, 200}, {0, 70}}, 23, /*blocks=*/64);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PrefillAttentionHostTest,
    ::testing::Values(AttnCase{KvDType::kF32, 4, 2, 32, 0, 0},    // f32 kernel
                      AttnCase{KvDType::kBF16, 4, 4, 64, 0, 0},   // tensor cores from here
                      AttnCase{KvDType::kBF16, 6, 2, 48, 11, 0},  // window shorter than a tile
                      AttnCase{KvDType::kInt8, 4, 1, 32, 40, 0},
                      AttnCase{KvDType::kInt4, 2, 1, 64, 0, 0},
                      AttnCase{KvDType::kBF16, 8, 2, 128, 0, 0},   // Llama's head_dim, GQA 4
                      AttnCase{KvDType::kInt8, 4, 2, 80, 90, 0},   // window past a key tile
                      AttnCase{KvDType::kInt4, 2, 1, 16, 0, 0},    // one k step
                      AttnCase{KvDType::kBF16, 4, 2, 40, 7, 0},    // f32 kernel: d % 16 != 0
                      AttnCase{KvDType::kInt8, 2, 1, 144, 0, 0}),  // f32 kernel: d > 128
    CaseName);

// The f32 kernel takes any pool (the tensor-core one only some): asked directly it still equals
// the CPU within f32 rounding on a bf16 pool, in its own tiles of 16 rows.
TEST(PrefillF32KernelHostTest, OnABf16Pool) {
  const AttnCase c{KvDType::kBF16, 4, 2, 64, 0, 0};
  Fixture f(c, {60, 19}, 21);
  std::vector<int32_t> positions, row_seq;
  AddRows(0, 23, 60, &positions, &row_seq);
  AddRows(1, 0, 19, &positions, &row_seq);
  SplitMix64 rng(22);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  std::vector<float> out;
  PrefillAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  std::vector<int32_t> first, n;
  MakePrefillTiles(row_seq, kPrefillTileRows, &first, &n);
  p.num_tiles = static_cast<int>(first.size());
  p.tile_first_row = first.data();
  p.tile_rows = n.data();
  host::Launch(host::Grid{p.num_tiles, c.heads}, 64,
               sizeof(float) * PrefillSharedFloats(c.head_dim),
               [&](host::HostCtx& ctx) { PrefillAttentionBody<KvFormat::kBF16>(ctx, p); });
  ExpectClose(out, f.Cpu(positions, row_seq, q));
}

}  // namespace
}  // namespace pdserve::cuda
