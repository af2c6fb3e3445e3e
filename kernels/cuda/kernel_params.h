// Arguments of the CUDA kernels, as plain structs of device pointers and sizes. Shared by the
// launchers (*_ops.h, what the CUDA runner calls), the kernel bodies (*_kernels.h) and the host
// execution tests. No CUDA or Abseil type here: nvcc and the host compiler both read it.
#ifndef PDSERVE_KERNELS_CUDA_KERNEL_PARAMS_H_
#define PDSERVE_KERNELS_CUDA_KERNEL_PARAMS_H_

#include <cstddef>
#include <cstdint>

namespace pdserve::cuda {

// The element format of KV rows: the values of pdserve::KvDType (common/base/dtype.h), which
// kv_format_check.cc asserts. Page layout as on the CPU (kernels/cpu/attention.h): rows
// [K|V][kv_head][slot] of head_dim elements, then for int8/int4 one f32 scale per row.
enum class KvFormat : int { kF32 = 0, kBF16 = 1, kInt8 = 2, kInt4 = 3 };

// Element type of an activation buffer that a kernel writes or reads.
enum class ActType : int { kF32 = 0, kBF16 = 1 };

// One layer of a paged KV pool in device memory.
struct KvLayer {
  uint8_t* base = nullptr;  // Page of block b at base + b * page_bytes.
  int64_t page_bytes = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvFormat format = KvFormat::kF32;
};

// Which tokens a step runs: row r of the activations is token `positions[r]` of sequence
// `row_seq[r]`, whose block table is block_tables[row_seq[r] * block_table_stride ...].
struct TokenRows {
  int rows = 0;
  const int32_t* positions = nullptr;
  const int32_t* row_seq = nullptr;
  const int32_t* block_tables = nullptr;
  int block_table_stride = 0;
};

// out[r][:] = table[ids[r]][:], f32 (the residual stream).
struct EmbeddingParams {
  int rows = 0;
  int64_t hidden = 0;
  const int32_t* ids = nullptr;
  const void* table = nullptr;  // [vocab][hidden], table_type.
  ActType table_type = ActType::kBF16;
  float* out = nullptr;         // [rows][hidden]
};

// For each output row r, with x the residual row in_row(r) (row_index[r], or r when null):
//   x += delta[in_row] + delta_bias   (when delta is set; x is written back)
//   out[r] = weight * (x / sqrt(mean(x^2) + eps))   (out_type f32 or bf16)
// The residual add of the previous block fused with this block's RMSNorm; with row_index and no
// delta it is the final norm of only the rows that need logits.
struct AddRmsNormParams {
  int rows = 0;
  int64_t n = 0;
  float* residual = nullptr;          // [*][n]
  const float* delta = nullptr;       // [*][n] or null
  const float* delta_bias = nullptr;  // [n] or null
  const int32_t* row_index = nullptr;
  const float* weight = nullptr;      // [n]
  float eps = 1e-6f;
  void* out = nullptr;                // [rows][n]
  ActType out_type = ActType::kBF16;
};

// Per token row, on the q, k and v projections' outputs (f32 [rows][heads * head_dim]):
// bias (Qwen2), per-head RMSNorm of q and k (Qwen3), rotate-half RoPE of q and k with
// cos_sin[position][0:d/2 cos, d/2:d sin] (computed on the host by kernels::RopeCosSin, so
// llama3 and linear scaling are in the table), q written back in place, k and v stored into the
// pool at the row's slot (quantized per row for int8/int4, the CPU's bytes).
struct QkvRopeStoreParams {
  TokenRows tokens;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float* q = nullptr;  // [rows][num_heads * head_dim], in place
  float* k = nullptr;  // [rows][num_kv_heads * head_dim], in place (roped)
  float* v = nullptr;  // [rows][num_kv_heads * head_dim], in place (biased)
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;  // [head_dim] or null
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const float* cos_sin = nullptr;  // [max_position][head_dim]
  KvLayer kv;
};

// out[r][i] = silu(gate[r][i] + gate_bias[i]) * (up[r][i] + up_bias[i]).
struct SiluMulParams {
  int rows = 0;
  int64_t n = 0;
  const float* gate = nullptr;  // row stride ld_in
  const float* up = nullptr;
  int64_t ld_in = 0;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  void* out = nullptr;  // [rows][n]
  ActType out_type = ActType::kBF16;
};

// Attention of every token row over its sequence's paged keys [max(0, pos - window + 1), pos].
// q: f32 [rows][num_heads * head_dim] (roped); out: [rows][num_heads * head_dim] of out_type.
struct AttentionParams {
  TokenRows tokens;
  KvLayer kv;
  int num_heads = 0;
  int window = 0;  // <= 0: all
  float scale = 1.0f;
  const float* q = nullptr;
  void* out = nullptr;
  ActType out_type = ActType::kBF16;
};

// Decode (flash-decoding): a thread block per (row, KV head, split of `split_tokens` keys); the
// group's query heads share each K and V load. With more than one split for a row, each split
// writes its unnormalised partial output, max and sum to the workspace and a merge kernel
// combines them.
// rows: the decode rows of a mixed step (null: rows 0..grid y); block y works on row rows[y],
// and the workspace is indexed by y.
struct DecodeAttentionParams {
  AttentionParams a;
  int num_rows = 0;            // grid y
  const int32_t* rows = nullptr;
  int split_tokens = 512;
  int max_splits = 1;         // grid z: ceil(longest context / split_tokens)
  float* partial = nullptr;   // [num_rows][num_heads][max_splits][head_dim]
  float* partial_ml = nullptr;  // [num_rows][num_heads][max_splits][2]: max, sum
};

// out[i] = offset + scale * u(seed, i), u uniform in [-1, 1) from a counter hash (SplitMix64 of
// seed + i): random weights made in device memory (bench-engine --random-weights).
struct FillParams {
  void* out = nullptr;
  int64_t count = 0;
  ActType type = ActType::kBF16;
  float offset = 0.0f;
  float scale = 1.0f;
  uint64_t seed = 0;
};

// y[m][n] (f32, row stride ldy) = x[m][k] (bf16, row stride ldx) times w[n][k] (bf16) transposed,
// accumulated in f32: the linear layers (cuBLASLt on a GPU).
struct GemmParams {
  const uint16_t* x = nullptr;
  int64_t m = 0, k = 0, ldx = 0;
  const uint16_t* w = nullptr;
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Prefill: a thread block per (tile of up to PrefillTileRows() consecutive rows of one sequence,
// query head): keys in tiles with an online softmax. tile_first_row and tile_rows describe the
// tiles (host-made: rows of a tile are consecutive positions of one sequence).
// Two kernels: on tensor cores (attention_mma_kernels.h) for bf16, int8 and int4 pools with
// head_dim a multiple of 16 up to 128 (every model family we serve), tiles of 64 rows; else on
// CUDA cores in f32 (attention_kernels.h: f32 pools, the exact mode, and other head sizes),
// tiles of 16 rows.
inline constexpr int kPrefillTileRows = 16;
inline constexpr int kPrefillTileKeys = 32;
inline constexpr int kPrefillMmaTileRows = 64;  // 4 warps of 16 rows.
inline constexpr int kPrefillMmaTileKeys = 64;
inline constexpr int kPrefillMmaThreads = 128;
// Dynamic shared memory a block gets without opting in, and the most it may opt in to
// (cudaFuncAttributeMaxDynamicSharedMemorySize) on the architectures we build for
// (CMAKE_CUDA_ARCHITECTURES 80;90): sm_80 allows 163 KiB, sm_90 227 KiB; the smaller binds.
// launch_config.h checks every launch against them.
inline constexpr size_t kSharedBytesDefault = 48 * 1024;
inline constexpr size_t kSharedBytesOptInMax = 163 * 1024;
inline constexpr int kPrefillMmaMaxHeadDim = 128;
inline constexpr bool PrefillUsesMma(KvFormat format, int head_dim) {
  return format != KvFormat::kF32 && head_dim % 16 == 0 && head_dim >= 16 &&
         head_dim <= kPrefillMmaMaxHeadDim;
}
// The most rows a prefill tile may have for the kernel that runs this pool.
inline constexpr int PrefillTileRows(KvFormat format, int head_dim) {
  return PrefillUsesMma(format, head_dim) ? kPrefillMmaTileRows : kPrefillTileRows;
}
struct PrefillAttentionParams {
  AttentionParams a;
  int num_tiles = 0;
  const int32_t* tile_first_row = nullptr;
  const int32_t* tile_rows = nullptr;
};

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_KERNEL_PARAMS_H_
