#include "common/engine/device_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/shared_weights.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/kernel_checks.h"
#include "kernels/cuda/kv_format.h"

namespace pdserve {
absl::Status DeviceModelRunner::Check(const ModelRunnerOptions& options, const ModelConfig& c,
                                      const KvPool& pool) {
  const KvCacheSpec& spec = pool.spec();
  if (spec.num_layers != c.num_layers || spec.num_kv_heads != c.num_kv_heads ||
      spec.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV pool shape does not match the model");
  }
  if (options.max_batch_tokens < 1 || options.max_logit_rows < 1 || options.max_model_len < 1) {
    return absl::InvalidArgumentError("runner sizes must be positive");
  }
  if (options.compute_dtype != ComputeDType::kBF16) {
    return absl::InvalidArgumentError(
        "the cuda backend computes in bf16 (bf16 GEMMs with f32 accumulation): use "
        "--compute-dtype bf16 or auto");
  }
  if (options.prefill_gemm != PrefillGemm::kInvariant) {
    return absl::InvalidArgumentError("--prefill-gemm openblas is a CPU option");
  }
  return cuda::CheckAttentionShape(static_cast<int>(c.num_heads), static_cast<int>(c.num_kv_heads),
                                   static_cast<int>(c.head_dim), cuda::ToKvFormat(spec.dtype));
}

absl::StatusOr<std::unique_ptr<DeviceModelRunner>> DeviceModelRunner::Create(
    const ModelRunnerOptions& options, const ModelWeights* weights, KvPool* pool,
    std::unique_ptr<cuda::DeviceOps> ops) {
  PD_RETURN_IF_ERROR(Check(options, weights->config(), *pool));
  std::shared_ptr<cuda::DeviceOps> shared_ops(std::move(ops));
  std::unique_ptr<DeviceModelRunner> runner(
      new DeviceModelRunner(options, weights->config(), pool, shared_ops));
  if (options.synthetic_weights_seed) {
    PD_ASSIGN_OR_RETURN(runner->weights_, DeviceWeights::Random(weights->config(),
                                                                *options.synthetic_weights_seed,
                                                                shared_ops));
  } else if (options.shared_weights != nullptr) {
    PD_ASSIGN_OR_RETURN(runner->weights_, options.shared_weights->Device(*weights, shared_ops));
  } else {
    PD_ASSIGN_OR_RETURN(runner->weights_, DeviceWeights::Upload(*weights, shared_ops));
  }
  PD_RETURN_IF_ERROR(runner->AllocateBuffers());
  return runner;
}

DeviceModelRunner::DeviceModelRunner(const ModelRunnerOptions& options, const ModelConfig& config,
                                     KvPool* pool, std::shared_ptr<cuda::DeviceOps> ops)
    : options_(options), config_(config), pool_(pool), ops_(ops), memory_(ops) {}

DeviceModelRunner::~DeviceModelRunner() {
  (void)ops_->Synchronize();
  if (staging_ != nullptr) ops_->FreeHost(staging_);
}

absl::Status DeviceModelRunner::AllocateBuffers() {
  const ModelConfig& c = config_;
  const int64_t T = options_.max_batch_tokens, L = options_.max_logit_rows;
  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), inter = c.intermediate_size;
  // RoPE table from the CPU twin, so positions' angles are the CPU's to the bit.
  kernels::RopeParams rope;
  rope.theta = c.rope_theta;
  rope.type = static_cast<int>(c.rope_scaling.type);
  rope.factor = c.rope_scaling.factor;
  rope.low_freq_factor = c.rope_scaling.low_freq_factor;
  rope.high_freq_factor = c.rope_scaling.high_freq_factor;
  rope.original_max_position = static_cast<double>(c.rope_scaling.original_max_position);
  rope.freq_factors = c.rope_scaling.freq_factors.data();
  std::vector<float> cos_sin(static_cast<size_t>(options_.max_model_len * c.head_dim));
  for (int64_t pos = 0; pos < options_.max_model_len; ++pos) {
    kernels::RopeCosSin(rope, c.head_dim, pos, &cos_sin[pos * c.head_dim]);
  }
  PD_ASSIGN_OR_RETURN(cos_sin_, memory_.Copy(cos_sin));

  // Activations.
  auto floats = [&](int64_t n) -> absl::StatusOr<float*> {
    PD_ASSIGN_OR_RETURN(void* p, memory_.Alloc(static_cast<size_t>(n) * sizeof(float)));
    return static_cast<float*>(p);
  };
  auto halves = [&](int64_t n) -> absl::StatusOr<uint16_t*> {
    PD_ASSIGN_OR_RETURN(void* p, memory_.Alloc(static_cast<size_t>(n) * sizeof(uint16_t)));
    return static_cast<uint16_t*>(p);
  };
  PD_ASSIGN_OR_RETURN(x_, floats(T * hidden));
  PD_ASSIGN_OR_RETURN(tmp_, floats(T * hidden));
  PD_ASSIGN_OR_RETURN(q_, floats(T * qs));
  PD_ASSIGN_OR_RETURN(k_, floats(T * kvs));
  PD_ASSIGN_OR_RETURN(v_, floats(T * kvs));
  PD_ASSIGN_OR_RETURN(gate_up_out_, floats(T * 2 * inter));
  PD_ASSIGN_OR_RETURN(logits_, floats(L * c.vocab_size));
  PD_ASSIGN_OR_RETURN(h_, halves(T * hidden));
  PD_ASSIGN_OR_RETURN(attn_, halves(T * qs));
  PD_ASSIGN_OR_RETURN(act_, halves(T * inter));
  PD_ASSIGN_OR_RETURN(logit_in_, halves(L * hidden));
  // Decode workspace for the largest rows x splits any step can plan.
  const cuda::DecodeSplit most = cuda::PlanDecodeSplits(
      static_cast<int>(c.num_heads / c.num_kv_heads), static_cast<int>(c.head_dim),
      static_cast<int>(options_.max_model_len));
  max_partial_rows_splits_ = T * most.max_splits;
  PD_ASSIGN_OR_RETURN(partial_, floats(max_partial_rows_splits_ * c.num_heads * c.head_dim));
  PD_ASSIGN_OR_RETURN(partial_ml_, floats(max_partial_rows_splits_ * c.num_heads * 2));
  // Step metadata: ids, positions, row_seq, decode rows, tile firsts and sizes (T each), logit
  // rows (L), block tables (T sequences at most, each up to max_model_len / block_size).
  const int64_t max_table = (options_.max_model_len + pool_->spec().block_size - 1) /
                            pool_->spec().block_size;
  max_table_ = static_cast<int>(max_table);
  staging_bytes_ = static_cast<size_t>(6 * T + L + T * max_table) * sizeof(int32_t);
  PD_ASSIGN_OR_RETURN(staging_, ops_->AllocHost(staging_bytes_));
  PD_ASSIGN_OR_RETURN(void* meta, memory_.Alloc(staging_bytes_));
  meta_ = static_cast<int32_t*>(meta);

  PD_ASSIGN_OR_RETURN(kv_memory_, ops_->KvPoolMemory(pool_->data(), pool_->size_bytes()));
  PD_RETURN_IF_ERROR(ops_->PrepareLayerMarks(c.num_layers));
  // The zeroing of every buffer (the KV pool's too, which a transport's own stream may read or
  // write next) is done before the runner is handed out.
  PD_RETURN_IF_ERROR(ops_->Synchronize());
  PD_LOG(Info) << "cuda runner on " << ops_->Describe() << ": bf16 weights, KV "
               << KvDTypeName(pool_->spec().dtype) << ", decode workspace for "
               << max_partial_rows_splits_ << " row-splits";
  return absl::OkStatus();
}

cuda::KvLayer DeviceModelRunner::KvLayerView(int64_t layer) const {
  const KvCacheSpec& spec = pool_->spec();
  cuda::KvLayer kv;
  kv.base = kv_memory_ + pool_->PageOffset(layer, 0);
  kv.page_bytes = static_cast<int64_t>(spec.PageBytes());
  kv.block_size = static_cast<int>(spec.block_size);
  kv.num_kv_heads = static_cast<int>(spec.num_kv_heads);
  kv.head_dim = static_cast<int>(spec.head_dim);
  kv.format = cuda::ToKvFormat(spec.dtype);
  return kv;
}

absl::Status DeviceModelRunner::Forward(const ForwardBatch& batch, float* logits) {
  PD_RETURN_IF_ERROR(ValidateForwardBatch(batch, options_, pool_->spec().block_size,
                                          pool_->num_blocks(), config_.vocab_size));
  for (const SequenceChunk& chunk : batch.sequences) {
    if (chunk.lora != nullptr) {
      return absl::UnimplementedError("LoRA adapters run on the cpu backend only");
    }
  }
  const ModelConfig& c = config_;
  // Lay the step's metadata out compactly in the staging area, then one copy.
  Step& st = step_;
  st = Step{};
  st.rows = static_cast<int>(batch.num_tokens());
  const int seqs = static_cast<int>(batch.sequences.size());
  // A decode-only step runs as a graph of its batch size: every parameter the kernels get must
  // then be the same at each step of that size (table stride and split plan for max_model_len;
  // the metadata itself is read from device memory at replay).
  bool graph = options_.device_graphs;
  for (const SequenceChunk& s : batch.sequences) {
    graph = graph && s.tokens.size() == 1 && s.num_logits == 1;
    st.table_stride = std::max(st.table_stride, static_cast<int>(s.block_table.size()));
  }
  if (graph) st.table_stride = max_table_;
  int32_t* host = static_cast<int32_t*>(staging_);
  const int T = st.rows;
  int32_t* ids = host;
  int32_t* positions = ids + T;
  int32_t* row_seq = positions + T;
  int32_t* decode_index = row_seq + T;
  int32_t* tile_first = decode_index + T;
  int32_t* tile_rows = tile_first + T;
  int32_t* logit_index = tile_rows + T;
  int32_t* tables = logit_index + batch.num_logit_rows();
  // Rows per prefill tile: 64 where attention runs on tensor cores, else 16.
  const int tile_limit =
      cuda::PrefillTileRows(cuda::ToKvFormat(pool_->spec().dtype), static_cast<int>(c.head_dim));
  int r = 0, max_decode_context = 1;
  for (int s = 0; s < seqs; ++s) {
    const SequenceChunk& chunk = batch.sequences[s];
    const int n = static_cast<int>(chunk.tokens.size());
    for (int i = 0; i < n; ++i) {
      ids[r + i] = chunk.tokens[i];
      positions[r + i] = static_cast<int32_t>(chunk.start_position + i);
      row_seq[r + i] = s;
    }
    if (n == 1) {
      decode_index[st.decode_rows++] = r;
      max_decode_context = std::max(max_decode_context, positions[r] + 1);
    } else {
      for (int i = 0; i < n; i += tile_limit) {
        tile_first[st.tiles] = r + i;
        tile_rows[st.tiles++] = std::min(tile_limit, n - i);
      }
    }
    for (int i = n - chunk.num_logits; i < n; ++i) logit_index[st.logit_rows++] = r + i;
    int32_t* table = tables + static_cast<size_t>(s) * st.table_stride;
    std::copy(chunk.block_table.begin(), chunk.block_table.end(), table);
    std::fill(table + chunk.block_table.size(), table + st.table_stride, 0);
    r += n;
  }
  const size_t used = static_cast<size_t>(tables + seqs * st.table_stride - host) * sizeof(int32_t);
  PD_RETURN_IF_ERROR(ops_->CopyIn(meta_, host, used));
  auto device = [&](const int32_t* p) { return meta_ + (p - host); };
  st.ids = device(ids);
  st.positions = device(positions);
  st.row_seq = device(row_seq);
  st.decode_index = device(decode_index);
  st.tile_first = device(tile_first);
  st.tile_rows = device(tile_rows);
  st.logit_index = device(logit_index);
  st.tables = device(tables);
  if (st.decode_rows > 0) {
    const cuda::DecodeSplit plan = cuda::PlanDecodeSplits(
        static_cast<int>(c.num_heads / c.num_kv_heads), static_cast<int>(c.head_dim),
        graph ? static_cast<int>(options_.max_model_len) : max_decode_context);
    st.split_tokens = plan.split_tokens;
    st.max_splits = plan.max_splits;
  }

  bool replayed = false;
  if (graph && !graphs_failed_) {
    PD_ASSIGN_OR_RETURN(replayed, ops_->Replay(st.rows));
    if (!replayed) {
      absl::Status captured = ops_->BeginCapture();
      if (captured.ok()) {
        const absl::Status enqueued = EnqueueStep();
        captured = ops_->EndCapture(st.rows);
        captured.Update(enqueued);
      }
      if (captured.ok()) {
        PD_ASSIGN_OR_RETURN(replayed, ops_->Replay(st.rows));
      } else {
        // Run this step, and the later ones, without graphs (an error of the step itself shows
        // again below, enqueued one by one).
        PD_LOG(Warning) << "CUDA graph capture failed (" << captured
                        << "): decode steps run without graphs";
        graphs_failed_ = true;
      }
    }
  }
  if (!replayed) PD_RETURN_IF_ERROR(EnqueueStep());
  // Every layer is enqueued; hand each one's pages over as the device finishes storing them.
  if (layer_callback_) {
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      PD_RETURN_IF_ERROR(ops_->WaitLayer(layer));
      layer_callback_(layer);
    }
  }
  if (st.logit_rows > 0) {
    PD_RETURN_IF_ERROR(ops_->CopyOut(logits, logits_,
                                     static_cast<size_t>(st.logit_rows * c.vocab_size) * sizeof(float)));
  }
  return ops_->Synchronize();
}

absl::Status DeviceModelRunner::EnqueueStep() {
  const ModelConfig& c = config_;
  const Step& st = step_;
  const int T = st.rows;
  cuda::EmbeddingParams e;
  e.rows = T;
  e.hidden = c.hidden_size;
  e.ids = st.ids;
  e.table = weights_->embed();
  e.table_type = weights_->embed_type();
  e.out = x_;
  PD_RETURN_IF_ERROR(ops_->Embedding(e));
  for (int64_t layer = 0; layer < c.num_layers; ++layer) PD_RETURN_IF_ERROR(Layer(layer));

  if (st.logit_rows > 0) {
    // The last layer's residual add, for the sampled rows only, fused with the final norm.
    cuda::AddRmsNormParams n;
    n.rows = st.logit_rows;
    n.n = c.hidden_size;
    n.residual = x_;
    n.delta = tmp_;
    n.delta_bias = weights_->layers().back().down_bias;
    n.row_index = st.logit_index;
    n.weight = weights_->final_norm();
    n.eps = static_cast<float>(c.rms_norm_eps);
    n.out = logit_in_;
    n.out_type = cuda::ActType::kBF16;
    PD_RETURN_IF_ERROR(ops_->AddRmsNorm(n));
    PD_RETURN_IF_ERROR(Gemm(logit_in_, st.logit_rows, c.hidden_size, weights_->lm_head(), c.vocab_size, logits_));
  }
  return absl::OkStatus();
}

absl::Status DeviceModelRunner::Gemm(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w,
                                     int64_t n, float* y) {
  cuda::GemmParams g;
  g.x = x;
  g.m = m;
  g.k = k;
  g.ldx = k;
  g.w = w;
  g.n = n;
  g.y = y;
  g.ldy = n;
  return ops_->Gemm(g);
}

absl::Status DeviceModelRunner::Layer(int64_t layer) {
  const ModelConfig& c = config_;
  const DeviceWeights::Layer& w = weights_->layers()[layer];
  const Step& st = step_;
  const int T = st.rows;
  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto gemm = [&](const uint16_t* x, int64_t k, const uint16_t* weight, int64_t n, float* y) {
    return Gemm(x, T, k, weight, n, y);
  };
  cuda::TokenRows tokens;
  tokens.rows = T;
  tokens.positions = st.positions;
  tokens.row_seq = st.row_seq;
  tokens.block_tables = st.tables;
  tokens.block_table_stride = st.table_stride;

  // Residual add of the previous layer's MLP, fused with this layer's input norm.
  cuda::AddRmsNormParams norm;
  norm.rows = T;
  norm.n = hidden;
  norm.residual = x_;
  norm.delta = layer > 0 ? tmp_ : nullptr;
  norm.delta_bias = layer > 0 ? weights_->layers()[layer - 1].down_bias : nullptr;
  norm.weight = w.input_norm;
  norm.eps = eps;
  norm.out = h_;
  norm.out_type = cuda::ActType::kBF16;
  PD_RETURN_IF_ERROR(ops_->AddRmsNorm(norm));
  PD_RETURN_IF_ERROR(gemm(h_, hidden, w.q, qs, q_));
  PD_RETURN_IF_ERROR(gemm(h_, hidden, w.k, kvs, k_));
  PD_RETURN_IF_ERROR(gemm(h_, hidden, w.v, kvs, v_));

  cuda::QkvRopeStoreParams rope;
  rope.tokens = tokens;
  rope.num_heads = static_cast<int>(c.num_heads);
  rope.num_kv_heads = static_cast<int>(c.num_kv_heads);
  rope.head_dim = static_cast<int>(c.head_dim);
  rope.q = q_;
  rope.k = k_;
  rope.v = v_;
  rope.q_bias = w.q_bias;
  rope.k_bias = w.k_bias;
  rope.v_bias = w.v_bias;
  rope.q_norm = w.q_norm;
  rope.k_norm = w.k_norm;
  rope.eps = eps;
  rope.cos_sin = cos_sin_;
  rope.kv = KvLayerView(layer);
  PD_RETURN_IF_ERROR(ops_->QkvRopeStore(rope));
  PD_RETURN_IF_ERROR(ops_->MarkLayer(layer));

  cuda::AttentionParams a;
  a.tokens = tokens;
  a.kv = rope.kv;
  a.num_heads = rope.num_heads;
  a.window = static_cast<int>(c.sliding_window);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  a.q = q_;
  a.out = attn_;
  a.out_type = cuda::ActType::kBF16;
  if (st.decode_rows > 0) {
    cuda::DecodeAttentionParams d;
    d.a = a;
    d.num_rows = st.decode_rows;
    d.rows = st.decode_index;
    d.split_tokens = st.split_tokens;
    d.max_splits = st.max_splits;
    d.partial = partial_;
    d.partial_ml = partial_ml_;
    PD_RETURN_IF_ERROR(ops_->DecodeAttention(d));
  }
  if (st.tiles > 0) {
    cuda::PrefillAttentionParams p;
    p.a = a;
    p.num_tiles = st.tiles;
    p.tile_first_row = st.tile_first;
    p.tile_rows = st.tile_rows;
    PD_RETURN_IF_ERROR(ops_->PrefillAttention(p));
  }
  PD_RETURN_IF_ERROR(gemm(attn_, qs, w.o, hidden, tmp_));

  norm.delta = tmp_;
  norm.delta_bias = w.o_bias;
  norm.weight = w.post_norm;
  PD_RETURN_IF_ERROR(ops_->AddRmsNorm(norm));
  PD_RETURN_IF_ERROR(gemm(h_, hidden, w.gate_up, 2 * inter, gate_up_out_));
  cuda::SiluMulParams act;
  act.rows = T;
  act.n = inter;
  act.gate = gate_up_out_;
  act.up = gate_up_out_ + inter;
  act.ld_in = 2 * inter;
  act.gate_bias = w.gate_bias;
  act.up_bias = w.up_bias;
  act.out = act_;
  act.out_type = cuda::ActType::kBF16;
  PD_RETURN_IF_ERROR(ops_->SiluMul(act));
  return gemm(act_, inter, w.down, hidden, tmp_);
}

}  // namespace pdserve
