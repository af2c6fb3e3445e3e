#include "common/engine/cpu_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "common/base/check.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/shared_weights.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve {
namespace {

// Prefill chunks at least this long use OpenBLAS when prefill_gemm = kOpenBlas.
constexpr int64_t kBlasMinRows = 32;

}  // namespace

absl::StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    const ModelRunnerOptions& options, const ModelWeights* weights, KvPool* pool) {
  const ModelConfig& c = weights->config();
  const KvCacheSpec& spec = pool->spec();
  if (spec.num_layers != c.num_layers || spec.num_kv_heads != c.num_kv_heads ||
      spec.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV pool shape does not match the model");
  }
  if (weights->lm_head().data == nullptr || options.synthetic_weights_seed) {
    return absl::InvalidArgumentError(
        "the cpu backend computes from weights in memory: ModelWeights::Synthetic with "
        "materialize, not a device runner's synthetic_weights_seed");
  }
  if (options.max_batch_tokens < 1 || options.max_logit_rows < 1 || options.max_model_len < 1) {
    return absl::InvalidArgumentError("runner sizes must be positive");
  }
  if (options.compute_dtype == ComputeDType::kAuto) {
    return absl::InvalidArgumentError("compute dtype must be resolved (ResolveComputeDType)");
  }
  if (weights->quantized() && options.compute_dtype == ComputeDType::kBF16) {
    return absl::InvalidArgumentError(
        "quantized weights (GGUF block formats) compute with f32 activations: use "
        "--compute-dtype f32 or auto");
  }
  if (weights->quantized() && options.prefill_gemm == PrefillGemm::kOpenBlas) {
    return absl::InvalidArgumentError(
        "--prefill-gemm openblas reads f32 matrices; quantized weights use the invariant kernels");
  }
  std::unique_ptr<CpuModelRunner> runner(new CpuModelRunner(options, weights, pool));
  PD_ASSIGN_OR_RETURN(runner->matrices_,
                      options.shared_weights != nullptr
                          ? options.shared_weights->Matrices(*weights, options.compute_dtype,
                                                             options.weight_huge_pages,
                                                             options.threads)
                          : CpuMatrices::Make(*weights, options.compute_dtype,
                                              options.weight_huge_pages, options.threads));
  return runner;
}

CpuModelRunner::CpuModelRunner(const ModelRunnerOptions& options, const ModelWeights* weights,
                               KvPool* pool)
    : options_(options),
      weights_(weights),
      config_(weights->config()),
      kv_(pool),
      pool_threads_(options.threads),
      bf16_attention_(options.compute_dtype == ComputeDType::kBF16 && options.bf16_attention) {
  const ModelConfig& c = config_;
  rope_.theta = c.rope_theta;
  rope_.type = static_cast<int>(c.rope_scaling.type);
  rope_.factor = c.rope_scaling.factor;
  rope_.low_freq_factor = c.rope_scaling.low_freq_factor;
  rope_.high_freq_factor = c.rope_scaling.high_freq_factor;
  rope_.original_max_position = static_cast<double>(c.rope_scaling.original_max_position);
  rope_.freq_factors = c.rope_scaling.freq_factors.data();
  attn_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  const int64_t t = options.max_batch_tokens;
  rows_.resize(t);
  x_.resize(t * c.hidden_size);
  h_.resize(t * c.hidden_size);
  tmp_.resize(t * c.hidden_size);
  q_.resize(t * c.q_size());
  attn_.resize(t * c.q_size());
  k_.resize(t * c.kv_size());
  v_.resize(t * c.kv_size());
  gate_.resize(t * c.intermediate_size);
  up_.resize(t * c.intermediate_size);
  rope_cs_.resize(t * c.head_dim);
  // Per thread: scores of one KV head's query heads over the longest context (f32), or the keys
  // of a chunk packed and a tile's scores (bf16; left untouched until used).
  const int threads = pool_threads_.num_threads();
  if (bf16_attention_) {
    attn_bf16_scratch_bytes_ = kernels::PagedAttentionBf16ScratchBytes(
        options.max_model_len, c.num_heads / c.num_kv_heads, c.head_dim, c.sliding_window > 0);
    attn_bf16_scratch_.reset(new uint8_t[threads * attn_bf16_scratch_bytes_]);
    attn_items_.reserve(static_cast<size_t>(t * c.num_heads));
  } else {
    attn_scratch_per_thread_ = static_cast<size_t>(c.num_heads / c.num_kv_heads) * options.max_model_len;
    attn_scratch_.resize(static_cast<size_t>(threads) * attn_scratch_per_thread_);
  }
  logit_in_.resize(options.max_logit_rows * c.hidden_size);
  if (options.compute_dtype == ComputeDType::kBF16) {
    const int64_t widest = std::max({c.hidden_size, c.q_size(), c.intermediate_size});
    x_bf16_.resize(static_cast<size_t>(std::max(t, options.max_logit_rows) * widest));
  }
  if (options.prefill_gemm == PrefillGemm::kOpenBlas) {
    kernels::SetBlasThreads(pool_threads_.num_threads());
    blas_scratch_.resize(std::max(c.intermediate_size, c.q_size()) *
                         std::max(c.hidden_size, c.q_size()));
  }
}

absl::Status CpuModelRunner::Validate(const ForwardBatch& batch) const {
  return ValidateForwardBatch(batch, options_, kv_->spec().block_size, kv_->num_blocks(),
                              config_.vocab_size);
}

bool CpuModelRunner::ProjectsByBlas(int64_t rows) const {
  return options_.prefill_gemm == PrefillGemm::kOpenBlas && rows >= kBlasMinRows;
}

void CpuModelRunner::Project(const float* x, int64_t rows, int64_t ldx,
                             const kernels::LinearOutput* outputs, int num_outputs, int64_t layer,
                             const LoraTarget* targets) {
  const bool lora = targets != nullptr && PlanLoraDeltas(layer, targets, num_outputs, outputs);
  if (ProjectsByBlas(rows)) {
    for (int i = 0; i < num_outputs; ++i) {
      kernels::BlasLinear(x, rows, ldx, *outputs[i].w, outputs[i].y, outputs[i].ldy,
                          &blas_scratch_, &pool_threads_);
    }
    if (lora) {
      kernels::LoraAddMulti(x, ldx, lora_deltas_.data(), static_cast<int>(lora_deltas_.size()),
                            lora_scratch_.data(), &pool_threads_);
    }
    return;
  }
  if (options_.compute_dtype == ComputeDType::kBF16) {
    // Each row rounded once for all the matrices that read it (q/k/v, gate/up).
    const int64_t k = outputs[0].w->cols;
    uint16_t* xb = x_bf16_.data();
    if (rows >= 16) {
      pool_threads_.ParallelFor(rows, 4, [&](int64_t b, int64_t e) {
        kernels::RoundRowsToBf16(x + b * ldx, e - b, k, ldx, xb + b * k, k);
      });
    } else {
      kernels::RoundRowsToBf16(x, rows, k, ldx, xb, k);
    }
    ProjectBf16(xb, rows, k, outputs, num_outputs, lora);
    return;
  }
  if (!lora) {
    kernels::LinearMulti(x, rows, ldx, outputs, num_outputs, &pool_threads_);
    return;
  }
  kernels::LoraShrink(x, ldx, lora_deltas_.data(), static_cast<int>(lora_deltas_.size()),
                      lora_scratch_.data(), &pool_threads_);
  WithLoraEpilogues(outputs, num_outputs, false, [&](const kernels::LinearOutput* with) {
    kernels::LinearMulti(x, rows, ldx, with, num_outputs, &pool_threads_);
  });
}

void CpuModelRunner::ProjectBf16(const uint16_t* xb, int64_t rows, int64_t k,
                                 const kernels::LinearOutput* outputs, int num_outputs, bool lora) {
  if (!lora) {
    kernels::LinearBf16Multi(xb, rows, k, outputs, num_outputs, &pool_threads_);
    return;
  }
  kernels::LoraShrinkBf16(xb, k, lora_deltas_.data(), static_cast<int>(lora_deltas_.size()),
                          lora_scratch_.data(), lora_scratch_bf16_.data(), &pool_threads_);
  WithLoraEpilogues(outputs, num_outputs, true, [&](const kernels::LinearOutput* with) {
    kernels::LinearBf16Multi(xb, rows, k, with, num_outputs, &pool_threads_);
  });
}

absl::Status CpuModelRunner::Forward(const ForwardBatch& batch, float* logits) {
  PD_RETURN_IF_ERROR(Validate(batch));
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  int64_t n = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceChunk& chunk = batch.sequences[s];
    for (size_t i = 0; i < chunk.tokens.size(); ++i) {
      rows_[n++] = Row{static_cast<int32_t>(s), chunk.start_position + static_cast<int64_t>(i)};
    }
  }
  const int64_t rows = n;
  lap_ = std::chrono::steady_clock::now();
  pool_threads_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const SequenceChunk& chunk = batch.sequences[rows_[r].seq];
      const int32_t token = chunk.tokens[rows_[r].position - chunk.start_position];
      kernels::EmbeddingRow(weights_->embed_tokens(), token, &x_[r * hidden]);
      kernels::RopeCosSin(rope_, c.head_dim, rows_[r].position, &rope_cs_[r * c.head_dim]);
    }
  });

  if (bf16_attention_) PlanAttentionBf16(batch);  // The same calls in every layer.
  PlanLora(batch);
  Lap(ForwardPhase::kEmbedding);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) Layer(layer, batch, rows);

  // Final norm and lm_head on the rows that are sampled (each sequence's last num_logits).
  int64_t m = 0;
  int64_t r = 0;
  for (const SequenceChunk& chunk : batch.sequences) {
    r += static_cast<int64_t>(chunk.tokens.size());
    for (int64_t row = r - chunk.num_logits; row < r; ++row) {
      kernels::RmsNorm(&x_[row * hidden], weights_->final_norm().data(), hidden,
                       static_cast<float>(c.rms_norm_eps), &logit_in_[m * hidden]);
      ++m;
    }
  }
  if (m > 0) {
    // Never OpenBLAS here: a sequence's logits must not depend on how many rows are sampled.
    const kernels::LinearOutput out{&matrices_->lm_head(), logits, c.vocab_size};
    if (options_.compute_dtype == ComputeDType::kBF16) {
      kernels::RoundRowsToBf16(logit_in_.data(), m, hidden, hidden, x_bf16_.data(), hidden);
      kernels::LinearBf16Multi(x_bf16_.data(), m, hidden, &out, 1, &pool_threads_);
    } else {
      kernels::LinearMulti(logit_in_.data(), m, hidden, &out, 1, &pool_threads_);
    }
  }
  Lap(ForwardPhase::kLogits);
  return absl::OkStatus();
}

void CpuModelRunner::PlanLora(const ForwardBatch& batch) {
  lora_runs_.clear();
  int64_t row = 0;
  for (const SequenceChunk& chunk : batch.sequences) {
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    if (chunk.lora != nullptr) {
      if (!lora_runs_.empty() && lora_runs_.back().adapter == chunk.lora &&
          lora_runs_.back().end == row) {
        lora_runs_.back().end += n;
      } else {
        lora_runs_.push_back({row, row + n, chunk.lora});
      }
    }
    row += n;
  }
  // An adapter's runs one after another: its matrices are read from memory once a step and from
  // cache for its later runs (the order of the terms does not change any row's bits).
  std::stable_sort(lora_runs_.begin(), lora_runs_.end(),
                   [](const LoraRun& a, const LoraRun& b) { return a.adapter < b.adapter; });
  if (options_.compute_dtype == ComputeDType::kBF16) {
    // Packed in the order the linear layers sum in, once per adapter and process.
    for (const LoraRun& run : lora_runs_) run.adapter->PackBf16(matrices_->layer(0).o.layout);
  }
}

bool CpuModelRunner::PlanLoraDeltas(int64_t layer, const LoraTarget* targets, int num_outputs,
                                    const kernels::LinearOutput* outputs) {
  if (lora_runs_.empty()) return false;
  const bool bf16 = options_.compute_dtype == ComputeDType::kBF16;
  lora_deltas_.clear();
  // Grouped by output: output i's deltas are [lora_first_[i], lora_first_[i + 1]).
  for (int i = 0; i < num_outputs; ++i) {
    lora_first_[static_cast<size_t>(i)] = static_cast<int>(lora_deltas_.size());
    for (const LoraRun& run : lora_runs_) {
      const LoraAdapter::Matrices* m = run.adapter->matrices(layer, targets[i]);
      if (m == nullptr) continue;
      kernels::LoraDelta d;
      d.a = bf16 ? &m->a_panels : &m->a_ref;
      d.b = bf16 ? &m->b_panels : &m->b_ref;
      d.begin = run.begin;
      d.end = run.end;
      d.y = outputs[i].y;
      d.ldy = outputs[i].ldy;
      lora_deltas_.push_back(d);
    }
  }
  lora_first_[static_cast<size_t>(num_outputs)] = static_cast<int>(lora_deltas_.size());
  if (lora_deltas_.empty()) return false;
  const auto need = static_cast<size_t>(
      kernels::LoraPlanScratch(lora_deltas_.data(), static_cast<int>(lora_deltas_.size())));
  if (lora_scratch_.size() < need) lora_scratch_.resize(need);
  if (bf16 && lora_scratch_bf16_.size() < need) lora_scratch_bf16_.resize(need);
  return true;
}

void CpuModelRunner::WithLoraEpilogues(const kernels::LinearOutput* outputs, int num_outputs,
                                       bool bf16,
                                       absl::FunctionRef<void(const kernels::LinearOutput*)> run) {
  // Each output's columns, once computed, get its deltas' expands on the same thread.
  struct Expand {
    const CpuModelRunner* r;
    int first, last;
    bool bf16;
    void operator()(int64_t lo, int64_t hi) const {
      for (int d = first; d < last; ++d) {
        const kernels::LoraDelta& delta = r->lora_deltas_[static_cast<size_t>(d)];
        if (bf16) {
          kernels::LoraExpandColumnsBf16(delta, r->lora_scratch_bf16_.data(), lo, hi);
        } else {
          kernels::LoraExpandColumns(delta, r->lora_scratch_.data(), lo, hi);
        }
      }
    }
  };
  constexpr int kMaxOutputs = 3;
  PD_CHECK(num_outputs <= kMaxOutputs);
  Expand expands[kMaxOutputs];
  std::optional<absl::FunctionRef<void(int64_t, int64_t)>> refs[kMaxOutputs];
  kernels::LinearOutput with[kMaxOutputs];
  for (int i = 0; i < num_outputs; ++i) {
    expands[i] = {this, lora_first_[static_cast<size_t>(i)], lora_first_[static_cast<size_t>(i) + 1], bf16};
    refs[i].emplace(expands[i]);
    with[i] = outputs[i];
    if (expands[i].first < expands[i].last) with[i].after = &*refs[i];
  }
  run(with);
}

void CpuModelRunner::AttentionF32(const ForwardBatch& batch, const kernels::KvPagesView& view,
                                  int64_t rows) {
  const ModelConfig& c = config_;
  const int64_t qs = c.q_size();
  // Items are dealt round-robin (ThreadPool::ForEachItem, which lets a free thread take a late
  // one's): a prefill chunk's later rows attend to more keys, so contiguous ranges would leave one
  // thread with most of the work.
  // An item is (row, KV head): its query heads read each key and value once
  // (PagedAttentionKvGroup; same bits). Only with fewer such items than threads are they split
  // per query head: at batch 1 per-head items read each KV head's context once per query head,
  // and with SmolLM's 3 KV heads on 2 threads the grouped split (2:1) was still faster
  // (bench/RESULTS.md).
  const int threads = pool_threads_.num_threads();
  const bool grouped = rows * c.num_kv_heads >= threads;
  const int64_t per_row = grouped ? c.num_kv_heads : c.num_heads;
  const int64_t items = rows * per_row;
  pool_threads_.ForEachItem(items, [&](int t, int64_t i) {
    float* scratch = &attn_scratch_[static_cast<size_t>(t) * attn_scratch_per_thread_];
    {
      const int64_t r = i / per_row, h = i % per_row;
      const SequenceChunk& chunk = batch.sequences[rows_[r].seq];
      if (grouped) {
        kernels::PagedAttentionKvGroup(view, chunk.block_table.data(), rows_[r].position,
                                       c.sliding_window, &q_[r * qs], c.num_heads, attn_scale_, h,
                                       &attn_[r * qs], scratch);
      } else {
        kernels::PagedAttention(view, chunk.block_table.data(), rows_[r].position,
                                c.sliding_window, &q_[r * qs], c.num_heads, attn_scale_, h, h + 1,
                                &attn_[r * qs], scratch);
      }
    }
  });
}

void CpuModelRunner::PlanAttentionBf16(const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  const int64_t group = c.num_heads / c.num_kv_heads;
  const int threads = pool_threads_.num_threads();
  // A chunk's tiles are shared among the threads (each packs the keys it reads); a chunk of one
  // tile (decode) is one call per KV head, or per query head when there are fewer calls than
  // threads (as AttentionF32). Shares of one chunk and KV head are consecutive, so dealing the
  // calls round-robin gives them to different threads. Any split gives the same bits.
  constexpr int64_t kTile = kernels::kAttentionBf16RowsPerTile;
  int64_t calls = 0;
  for (const SequenceChunk& chunk : batch.sequences) {
    const int64_t tiles = (static_cast<int64_t>(chunk.tokens.size()) + kTile - 1) / kTile;
    calls += std::min<int64_t>(tiles, threads) * c.num_kv_heads;
  }
  const bool split_heads = calls < threads;
  attn_items_.clear();
  int64_t row = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const int64_t n = static_cast<int64_t>(batch.sequences[s].tokens.size());
    const int64_t tiles = (n + kTile - 1) / kTile;
    const int64_t shares = std::min<int64_t>(tiles, threads);
    const bool per_head = split_heads && tiles == 1;
    for (int64_t h = 0; h < c.num_heads; h += per_head ? 1 : group) {
      for (int64_t share = 0; share < shares; ++share) {
        attn_items_.push_back(AttentionItem{static_cast<int32_t>(s), row, n, share, shares, h,
                                            per_head ? h + 1 : h + group});
      }
    }
    row += n;
  }
}

void CpuModelRunner::AttentionBf16(const ForwardBatch& batch, const kernels::KvPagesView& view) {
  const ModelConfig& c = config_;
  const int64_t qs = c.q_size();
  const int64_t items = static_cast<int64_t>(attn_items_.size());
  // Attention sums in the linear layers' order: AMX tiles where they run on AMX (attention_bf16.h).
  const MatrixLayout order = matrices_->layer(0).o.layout;
  pool_threads_.ForEachItem(items, [&](int t, int64_t i) {
    uint8_t* scratch = attn_bf16_scratch_.get() + static_cast<size_t>(t) * attn_bf16_scratch_bytes_;
    {
      const AttentionItem& it = attn_items_[i];
      const SequenceChunk& chunk = batch.sequences[it.seq];
      kernels::PagedAttentionBf16(view, chunk.block_table.data(), chunk.start_position, it.count,
                                  it.share, it.shares, c.sliding_window, &q_[it.row * qs], qs,
                                  c.num_heads, attn_scale_, it.head_begin, it.head_end,
                                  &attn_[it.row * qs], qs, scratch, attn_bf16_scratch_bytes_,
                                  order);
    }
  });
}

void CpuModelRunner::Layer(int64_t layer, const ForwardBatch& batch, int64_t rows) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layer(layer);
  const CpuMatrices::Layer& p = matrices_->layer(layer);
  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), hd = c.head_dim;
  const int64_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Attention block.
  pool_threads_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      kernels::RmsNorm(&x_[r * hidden], w.input_norm.data(), hidden, eps, &h_[r * hidden]);
    }
  });
  const kernels::LinearOutput qkv[3] = {
      {&p.q, q_.data(), qs}, {&p.k, k_.data(), kvs}, {&p.v, v_.data(), kvs}};
  Lap(ForwardPhase::kInputNorm);
  constexpr LoraTarget kQkv[3] = {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV};
  Project(h_.data(), rows, hidden, qkv, 3, layer, kQkv);
  Lap(ForwardPhase::kQkv);

  kernels::KvPagesView view;
  view.layer_base = kv_->LayerBase(layer);
  view.page_bytes = kv_->spec().PageBytes();
  view.block_size = kv_->spec().block_size;
  view.num_kv_heads = c.num_kv_heads;
  view.head_dim = hd;
  view.dtype = kv_->spec().dtype;
  pool_threads_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* q = &q_[r * qs];
      float* k = &k_[r * kvs];
      float* v = &v_[r * kvs];
      if (c.qkv_bias) {
        kernels::AddBias(q, w.q_bias.data(), qs);
        kernels::AddBias(k, w.k_bias.data(), kvs);
        kernels::AddBias(v, w.v_bias.data(), kvs);
      }
      const float* cs = &rope_cs_[r * hd];
      for (int64_t h = 0; h < c.num_heads; ++h) {
        if (c.qk_norm) kernels::RmsNorm(q + h * hd, w.q_norm.data(), hd, eps, q + h * hd);
        kernels::ApplyRope(q + h * hd, hd, cs);
      }
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        if (c.qk_norm) kernels::RmsNorm(k + h * hd, w.k_norm.data(), hd, eps, k + h * hd);
        kernels::ApplyRope(k + h * hd, hd, cs);
      }
      const SequenceChunk& chunk = batch.sequences[rows_[r].seq];
      kernels::StoreKv(view, chunk.block_table.data(), rows_[r].position, k, v);
    }
  });

  Lap(ForwardPhase::kRopeKvStore);
  if (layer_callback_) {
    layer_callback_(layer);
    Lap(ForwardPhase::kLayerCallback);
  }

  // Every row's KV is stored before any row attends (a chunk attends to its own earlier rows).
  if (bf16_attention_) {
    AttentionBf16(batch, view);
  } else {
    AttentionF32(batch, view, rows);
  }
  Lap(ForwardPhase::kAttention);

  const kernels::LinearOutput o[1] = {{&p.o, tmp_.data(), hidden}};
  constexpr LoraTarget kO[1] = {LoraTarget::kO};
  Project(attn_.data(), rows, qs, o, 1, layer, kO);
  Lap(ForwardPhase::kOProjection);
  pool_threads_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* x = &x_[r * hidden];
      if (c.o_bias) kernels::AddBias(&tmp_[r * hidden], w.o_bias.data(), hidden);
      kernels::AddInPlace(x, &tmp_[r * hidden], hidden);
      kernels::RmsNorm(x, w.post_attention_norm.data(), hidden, eps, &h_[r * hidden]);
    }
  });

  // MLP block.
  const kernels::LinearOutput gate_up[2] = {{&p.gate, gate_.data(), inter},
                                            {&p.up, up_.data(), inter}};
  Lap(ForwardPhase::kResidualNorm);
  constexpr LoraTarget kGateUp[2] = {LoraTarget::kGate, LoraTarget::kUp};
  Project(h_.data(), rows, hidden, gate_up, 2, layer, kGateUp);
  Lap(ForwardPhase::kGateUp);
  // Under bf16 compute the down projection reads the activations rounded to bf16: each row is
  // rounded as it is made, a piece at a time through a buffer in L1, so its f32 values never go
  // to memory and back (the same bits as rounding the whole f32 row after).
  const bool bf16_down = options_.compute_dtype == ComputeDType::kBF16 && !ProjectsByBlas(rows);
  uint16_t* act_bf16 = x_bf16_.data();
  pool_threads_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* gate = &gate_[r * inter];
      if (c.mlp_bias) {
        kernels::AddBias(gate, w.gate_bias.data(), inter);
        kernels::AddBias(&up_[r * inter], w.up_bias.data(), inter);
      }
      if (!bf16_down) {
        kernels::SiluMul(gate, &up_[r * inter], inter, gate);
        continue;
      }
      constexpr int64_t kPiece = 1024;
      alignas(64) float piece[kPiece];
      for (int64_t i = 0; i < inter; i += kPiece) {
        const int64_t len = std::min(kPiece, inter - i);
        kernels::SiluMul(gate + i, &up_[r * inter + i], len, piece);
        kernels::RoundRowsToBf16(piece, 1, len, len, act_bf16 + r * inter + i, len);
      }
    }
  });
  const kernels::LinearOutput down[1] = {{&p.down, tmp_.data(), hidden}};
  Lap(ForwardPhase::kActivation);
  constexpr LoraTarget kDown[1] = {LoraTarget::kDown};
  if (bf16_down) {
    ProjectBf16(act_bf16, rows, inter, down, 1, PlanLoraDeltas(layer, kDown, 1, down));
  } else {
    Project(gate_.data(), rows, inter, down, 1, layer, kDown);
  }
  Lap(ForwardPhase::kDown);
  pool_threads_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (c.mlp_bias) kernels::AddBias(&tmp_[r * hidden], w.down_bias.data(), hidden);
      kernels::AddInPlace(&x_[r * hidden], &tmp_[r * hidden], hidden);
    }
  });
  Lap(ForwardPhase::kResidual);
}

}  // namespace pdserve
