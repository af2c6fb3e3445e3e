#include "common/engine/llm_engine.h"

#include <algorithm>
#include <future>
#include <random>

#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/engine/shared_weights.h"
#include "common/model/gguf_model.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/lora_registry.h"
#include "kernels/cpu/linear_bf16.h"  // AmxEnabled
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include <xxhash.h>
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

// EOS ids from generation_config.json, which instruct models use for end-of-turn tokens.
std::vector<int32_t> GenerationConfigEos(const std::string& dir) {
  std::vector<int32_t> ids;
  auto text = ReadFileToString(JoinPath(dir, "generation_config.json"));
  if (!text.ok()) return ids;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("eos_token_id")) return ids;
  const auto& e = j["eos_token_id"];
  if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
  if (e.is_array()) {
    for (const auto& x : e) {
      if (x.is_number_integer()) ids.push_back(x.get<int32_t>());
    }
  }
  return ids;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<LLMEngine>> LLMEngine::Create(const std::string& model_dir,
                                                             const EngineOptions& options) {
  std::unique_ptr<LLMEngine> e(new LLMEngine());
  e->options_ = options;
  e->model_dir_ = model_dir;
  PD_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  if (options.shared_weights != nullptr) {
    PD_ASSIGN_OR_RETURN(e->weights_,
                        options.shared_weights->Load(config, model_dir, options.weight_dtype));
  } else {
    PD_ASSIGN_OR_RETURN(e->weights_, ModelWeights::Load(config, model_dir, options.weight_dtype));
  }
  e->eos_ids_ = config.eos_token_ids;
  for (int32_t id : GenerationConfigEos(model_dir)) {
    if (id >= 0 && id < config.vocab_size &&
        std::find(e->eos_ids_.begin(), e->eos_ids_.end(), id) == e->eos_ids_.end()) {
      e->eos_ids_.push_back(id);
    }
  }
  return Build(std::move(e), std::nullopt);
}

absl::StatusOr<std::unique_ptr<LLMEngine>> LLMEngine::CreateSynthetic(const ModelConfig& config,
                                                                      const EngineOptions& options,
                                                                      uint64_t seed) {
  std::unique_ptr<LLMEngine> e(new LLMEngine());
  e->options_ = options;
  e->weights_ = ModelWeights::Synthetic(config, seed, /*materialize=*/options.backend == "cpu");
  e->eos_ids_ = config.eos_token_ids;
  return Build(std::move(e),
               options.backend == "cpu" ? std::nullopt : std::optional<uint64_t>(seed));
}

absl::StatusOr<std::unique_ptr<LLMEngine>> LLMEngine::Build(std::unique_ptr<LLMEngine> e,
                                                            std::optional<uint64_t> synthetic_seed) {
  const EngineOptions& options = e->options_;
  const ModelConfig& config = e->weights_->config();
  if (options.block_size < 1 || options.block_size > 1024) {
    return absl::InvalidArgumentError(Str("block_size must be in [1, 1024], got ",
                                          options.block_size));
  }
  if (options.max_num_seqs < 1 || options.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("max_num_seqs and max_num_batched_tokens must be positive");
  }
  if (options.backend == "cuda" && e->weights_->quantized()) {
    return absl::UnimplementedError(
        Str("--device cuda with quantized weights (", e->weights_->weight_format(),
            "): the CUDA kernels read f32/bf16/f16 matrices only; quantized formats run on "
            "--device cpu"));
  }
  PD_RETURN_IF_ERROR(options.speculative.Validate());
  if (options.backend != "cpu" && options.lora != nullptr) {
    return absl::UnimplementedError(
        Str("--lora-modules or --enable-lora-runtime-updates with --device ", options.backend,
            ": LoRA adapters run on --device cpu "
            "only (the CUDA runner has no LoRA kernels yet)"));
  }
  if (options.backend != "cpu" && options.speculative.enabled()) {
    // Identity with plain decoding rests on a position's logits being the same bits inside a
    // chunk as alone; cuBLASLt's GEMMs do not promise that.
    return absl::UnimplementedError(
        Str("--speculative ", SpeculativeMethodName(options.speculative.method), " with --device ",
            options.backend, ": speculative decoding runs on --device cpu, where a drafted "
            "position computes the same bits as plain decoding"));
  }
  KvCacheSpec spec{config.num_layers, config.num_kv_heads, config.head_dim, options.block_size,
                   options.kv_dtype};
  int64_t num_blocks = options.num_kv_blocks;
  if (num_blocks <= 0 && !(options.kv_cache_gib > 0) && options.backend == "cuda") {
    // As vLLM: what the GPU has left at --gpu-memory-utilization.
    PD_ASSIGN_OR_RETURN(const size_t bytes,
                        DeviceKvBudgetBytes(options.backend, options.gpu_memory_utilization, config,
                                            options.max_num_batched_tokens,
                                            options.engines_per_device));
    num_blocks = KvPool::BlocksForBytes(spec, bytes);
    PD_LOG(Info) << "KV cache: " << (bytes >> 20) << " MiB of GPU memory ("
                 << options.gpu_memory_utilization << " of it, less weights and buffers): "
                 << num_blocks << " blocks";
  }
  if (num_blocks <= 0) {
    if (!(options.kv_cache_gib > 0)) {
      return absl::InvalidArgumentError("kv cache size must be positive");
    }
    num_blocks = KvPool::BlocksForBytes(
        spec, static_cast<size_t>(options.kv_cache_gib * static_cast<double>(1ull << 30)));
  }
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(Str("the KV cache holds no block of ", spec.BlockBytes(),
                                          " bytes; give it more memory"));
  }
  const int64_t pool_tokens = num_blocks * options.block_size;
  if (options.max_model_len > 0) {
    if (options.max_model_len > pool_tokens) {
      return absl::InvalidArgumentError(Str(
          "max_model_len ", options.max_model_len, " needs ", options.max_model_len,
          " tokens of KV cache but the pool holds ", pool_tokens, " (", num_blocks,
          " blocks); raise the KV cache memory or lower max_model_len"));
    }
    e->max_model_len_ = options.max_model_len;
  } else {
    e->max_model_len_ = std::min(config.max_position_embeddings, pool_tokens);
    if (e->max_model_len_ < config.max_position_embeddings) {
      PD_LOG(Info) << "max_model_len capped to " << e->max_model_len_
                   << " tokens: what the KV cache holds (model allows "
                   << config.max_position_embeddings << ")";
    }
  }
  // A device backend keeps the pages in its own memory: the host pool is only their layout.
  PD_ASSIGN_OR_RETURN(e->pool_, KvPool::Create(spec, num_blocks, options.backend == "cpu"));
  e->blocks_ = std::make_unique<BlockManager>(num_blocks, options.block_size,
                                              options.enable_prefix_caching);
  e->blocks_->EnableEvents(options.enable_kv_events);
  e->scheduler_ = std::make_unique<Scheduler>(
      SchedulerOptions{options.max_num_seqs, options.max_num_batched_tokens, options.speculative.enabled(),
                       options.max_loras},
      e->blocks_.get());
  ModelRunnerOptions ro;
  ro.threads = options.threads;
  ro.max_batch_tokens = options.max_num_batched_tokens;
  // A speculating decode asks for logits at each drafted position too.
  const int64_t logit_rows_per_seq =
      1 + (options.speculative.enabled() ? options.speculative.num_tokens : 0);
  ro.max_logit_rows = options.max_num_seqs * logit_rows_per_seq;
  ro.max_model_len = e->max_model_len_;
  ro.prefill_gemm = options.prefill_gemm;
  PD_ASSIGN_OR_RETURN(ro.compute_dtype,
                      ResolveComputeDType(options.backend, options.compute_dtype,
                                          e->weights_->dtype(), options.prefill_gemm));
  e->compute_dtype_ = ro.compute_dtype;
  ro.weight_huge_pages = options.weight_huge_pages;
  ro.synthetic_weights_seed = synthetic_seed;
  ro.shared_weights = options.shared_weights.get();
  if (options.compute_dtype == ComputeDType::kAuto) {
    PD_LOG(Info) << "compute dtype " << ComputeDTypeName(ro.compute_dtype) << " (auto: "
                 << DTypeName(e->weights_->dtype()) << " weights"
                 << (ro.compute_dtype == ComputeDType::kF32 && e->weights_->dtype() == DType::kBF16
                         ? ", no bf16 dot instructions on this CPU)"
                         : ")");
  }
  PD_ASSIGN_OR_RETURN(e->runner_,
                      options.runner_factory
                          ? options.runner_factory(ro, e->weights_.get(), e->pool_.get())
                          : CreateModelRunner(options.backend, ro, e->weights_.get(), e->pool_.get()));
  e->logits_.resize(static_cast<size_t>(ro.max_logit_rows) * config.vocab_size);
  if (!options.kv_tiers.empty()) {
    // A device pool is reached through two PoolDevices (the scheduler thread's and the I/O
    // thread's streams); a host pool directly.
    std::unique_ptr<PoolDevice> store_device, load_device;
    if (e->runner_->kv_memory() != nullptr && e->runner_->kv_memory() != e->pool_->data()) {
      if (!options.kv_tier_device) {
        return absl::UnimplementedError(
            Str("KV cache tiers with --device ", options.backend, ": this build has no way to copy its pool"));
      }
      PD_ASSIGN_OR_RETURN(store_device, options.kv_tier_device());
      PD_ASSIGN_OR_RETURN(load_device, options.kv_tier_device());
    }
    if (!options.enable_prefix_caching) {
      return absl::InvalidArgumentError(
          "--kv-offload-disk/--kv-store need the prefix cache (their blocks are the prefix cache's)");
    }
    if (options.kv_tiers.size() > KvOffload::kMaxTiers) {
      return absl::InvalidArgumentError(Str("at most ", KvOffload::kMaxTiers, " KV cache tiers"));
    }
    if (options.kv_offload_buffers < 1) {
      return absl::InvalidArgumentError("kv offload buffers must be >= 1");
    }
    e->offload_ = std::make_unique<KvOffload>(options.kv_tiers, spec, e->kv_memory(), num_blocks,
                                              e->TierModelKey(), options.kv_offload_buffers,
                                              options.enable_kv_events, std::move(store_device),
                                              std::move(load_device));
    e->tier_load_faster_ = options.kv_tier_load == KvTierLoad::kFaster ||
                           (options.kv_tier_load == KvTierLoad::kAuto && options.backend != "cpu");
  }
  if (options.speculative.method == SpeculativeMethod::kSuffix) {
    e->recent_outputs_ = std::make_unique<SuffixTrie>(options.speculative.suffix_depth);
  }
  e->sampled_.reserve(options.max_num_seqs);
  return e;
}

absl::Status LLMEngine::ValidateRequest(const std::string& request_id,
                                        const std::vector<int32_t>& prompt,
                                        const SamplingParams& params) const {
  const ModelConfig& c = config();
  if (sequences_.contains(request_id)) {
    return absl::AlreadyExistsError(Str("request_id '", request_id, "' is already running"));
  }
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: must hold at least one token");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(Str("prompt: token id ", prompt[i], " at position ", i,
                                            " is outside the vocabulary of ", c.vocab_size));
    }
  }
  if (static_cast<int64_t>(prompt.size()) >= max_model_len_) {
    return absl::InvalidArgumentError(Str("prompt: ", prompt.size(),
                                          " tokens leave no room to generate within "
                                          "max_model_len ", max_model_len_));
  }
  return params.Validate(c.vocab_size);
}

std::unique_ptr<Sequence> LLMEngine::NewSequence(const std::string& request_id,
                                                 std::vector<int32_t> prompt,
                                                 const SamplingParams& params) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_id_++;
  seq->request_id = request_id;
  seq->num_prompt_tokens = static_cast<int64_t>(prompt.size());
  seq->params = params;
  const uint64_t seed = params.seed ? *params.seed : std::random_device{}();
  seq->sampler.Init(seed, prompt, params.max_tokens);
  seq->tokens = std::move(prompt);
  // Room for the tokens it will likely reach, so the decode loop does not grow these: the whole
  // of max_tokens up to 4,096 output tokens (beyond, they double, rarely). A full reservation for
  // a 128K max_tokens would pin 512 KiB per waiting request.
  constexpr int64_t kReservedOutputTokens = 4096;
  const int64_t most = std::min<int64_t>(
      seq->num_prompt_tokens + std::min<int64_t>(params.max_tokens, kReservedOutputTokens),
      max_model_len_);
  seq->tokens.reserve(static_cast<size_t>(std::max<int64_t>(most, seq->num_prompt_tokens)));
  seq->block_hashes.reserve(static_cast<size_t>((most + blocks_->block_size() - 1) / blocks_->block_size()));
  seq->arrival = Clock::now();
  return seq;
}

absl::Status LLMEngine::AttachLora(Sequence* seq) {
  const std::string& name = seq->params.lora_name;
  if (name.empty()) return absl::OkStatus();
  if (options_.lora == nullptr) {
    return absl::NotFoundError(Str("lora_name: no LoRA adapter named '", name,
                                   "' is served (this worker serves none: --lora-modules)"));
  }
  auto adapter = options_.lora->Acquire(name);
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(), Str("lora_name: ", adapter.status().message()));
  }
  seq->lora = *std::move(adapter);
  seq->hash_root = seq->lora->kv_root();
  return absl::OkStatus();
}

bool LLMEngine::OverlapMasks() const {
  if (constraints_ == nullptr) return false;
  return options_.overlap_masks < 0 ? options_.backend == "cuda" : options_.overlap_masks > 0;
}

absl::Status LLMEngine::EnsureConstraintCache() {
  if (constraints_ != nullptr) return absl::OkStatus();
  const std::string& path = options_.tokenizer.empty() ? model_dir_ : options_.tokenizer;
  if (path.empty()) {
    return absl::FailedPreconditionError(
        "constraint: this worker has no tokenizer (random weights without --tokenizer), and "
        "structured outputs need its tokens' bytes");
  }
  auto tokenizer = LoadModelTokenizer(path);
  if (!tokenizer.ok()) {
    return absl::FailedPreconditionError(Str("constraint: structured outputs need the tokenizer: ",
                                             tokenizer.status().message()));
  }
  const int64_t n = std::min<int64_t>((*tokenizer)->vocab_size(), config().vocab_size);
  std::vector<std::string> bytes(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (auto b = (*tokenizer)->TokenBytes(id)) bytes[static_cast<size_t>(id)] = std::move(*b);
  }
  constraints_ = std::make_unique<structured::ConstraintCache>(std::move(bytes), config().vocab_size, eos_ids_);
  return absl::OkStatus();
}

absl::Status LLMEngine::StartConstraint(Sequence* seq, const char* what) {
  if (seq->params.constraint == nullptr) return absl::OkStatus();
  PD_RETURN_IF_ERROR(EnsureConstraintCache());
  auto tc = constraints_->Start(*seq->params.constraint);
  if (!tc.ok()) return tc.status();
  for (int64_t i = seq->num_prompt_tokens; i < static_cast<int64_t>(seq->tokens.size()); ++i) {
    if (!(*tc)->Accept(seq->tokens[static_cast<size_t>(i)])) {
      return absl::InvalidArgumentError(Str(what, ": token ", seq->tokens[static_cast<size_t>(i)],
                                            " at position ", i - seq->num_prompt_tokens,
                                            " is not allowed by the ", seq->params.constraint->field(),
                                            " constraint"));
    }
  }
  seq->constraint = std::move(*tc);
  return absl::OkStatus();
}

absl::Status LLMEngine::AddRequest(const std::string& request_id, std::vector<int32_t> prompt,
                                   const SamplingParams& params, const RequestOptions& options) {
  PD_RETURN_IF_ERROR(ValidateRequest(request_id, prompt, params));
  const std::vector<int32_t>& resumed = options.resume_output;
  for (size_t i = 0; i < resumed.size(); ++i) {
    if (resumed[i] < 0 || resumed[i] >= config().vocab_size) {
      return absl::InvalidArgumentError(Str("resume_output_ids: token id ", resumed[i], " at position ",
                                            i, " is outside the vocabulary of ", config().vocab_size));
    }
  }
  if (static_cast<int64_t>(resumed.size()) >= params.max_tokens) {
    return absl::InvalidArgumentError(Str("resume_output_ids: ", resumed.size(),
                                          " tokens leave nothing to generate within max_tokens ",
                                          params.max_tokens));
  }
  if (static_cast<int64_t>(prompt.size() + resumed.size()) >= max_model_len_) {
    return absl::InvalidArgumentError(Str("resume_output_ids: prompt and ", resumed.size(),
                                          " resumed tokens leave no room within max_model_len ",
                                          max_model_len_));
  }
  std::unique_ptr<Sequence> seq = NewSequence(request_id, std::move(prompt), params);
  PD_RETURN_IF_ERROR(AttachLora(seq.get()));
  for (int32_t t : resumed) {  // As if sampled here; their KV is computed with the prompt's.
    seq->tokens.push_back(t);
    seq->sampler.Accept(t);
  }
  PD_RETURN_IF_ERROR(StartConstraint(seq.get(), "resume_output_ids"));
  if (offload_ == nullptr || !StartTierLoad(seq.get())) scheduler_->AddWaiting(seq.get());
  if (options.hold_blocks_after_finish) options_by_request_[request_id] = options;
  sequences_.emplace(request_id, std::move(seq));
  return absl::OkStatus();
}

absl::StatusOr<RemotePrefillPlan> LLMEngine::ReserveForRemotePrefill(
    const std::string& request_id, std::vector<int32_t> prompt, const SamplingParams& params) {
  PD_RETURN_IF_ERROR(ValidateRequest(request_id, prompt, params));
  std::unique_ptr<Sequence> seq = NewSequence(request_id, std::move(prompt), params);
  PD_RETURN_IF_ERROR(AttachLora(seq.get()));
  PD_RETURN_IF_ERROR(StartConstraint(seq.get(), "output"));
  const int64_t bs = blocks_->block_size();
  const int64_t len = seq->num_prompt_tokens;
  ExtendBlockHashes(seq->tokens, bs, &seq->block_hashes, seq->hash_root);
  PD_ASSIGN_OR_RETURN(BlockManager::AdmitPlan plan,
                      blocks_->PlanAdmit(seq->block_hashes, (len - 1) / bs, len, len));
  blocks_->CommitAdmit(seq->id, plan, static_cast<int64_t>(seq->tokens.capacity()));
  seq->num_computed = plan.num_cached_tokens;
  seq->num_cached_prompt_tokens = plan.num_cached_tokens;
  seq->admitted_before = true;
  seq->first_scheduled = Clock::now();
  seq->remote_reserved = true;
  RemotePrefillPlan out;
  const auto table = blocks_->BlockTable(seq->id);
  out.blocks.assign(table.begin(), table.end());
  out.cached_tokens = plan.num_cached_tokens;
  out.tier_loading = offload_ != nullptr && LoadFromTiers(seq.get(), plan.num_cached_tokens / bs);
  sequences_.emplace(request_id, std::move(seq));
  return out;
}

int64_t LLMEngine::CachedPrefixTokens(const std::vector<int32_t>& prompt,
                                      std::string_view lora_name) const {
  const int64_t bs = blocks_->block_size();
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (len == 0) return 0;
  BlockHash root;
  if (!lora_name.empty()) {
    const auto r = options_.lora != nullptr ? options_.lora->KvRoot(lora_name) : std::nullopt;
    if (!r) return 0;
    root = *r;
  }
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(prompt, bs, &hashes, root);
  auto probe = blocks_->PlanAdmit(hashes, (len - 1) / bs, 0, 0);
  return probe.ok() ? probe->num_cached_tokens : 0;
}

absl::Status LLMEngine::CompleteRemotePrefill(const std::string& request_id,
                                              const SampledToken& first,
                                              int64_t prefill_cached_tokens,
                                              std::vector<RequestOutput>* outputs) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(Str("no reservation for request '", request_id, "'"));
  }
  Sequence* seq = it->second.get();
  if (seq->num_generated() != 0 || first.token < 0 || first.token >= config().vocab_size) {
    return absl::InvalidArgumentError(Str("bad first token ", first.token, " for '", request_id, "'"));
  }
  if (seq->constraint != nullptr && !seq->constraint->Mask().Test(first.token)) {
    return absl::InvalidArgumentError(Str("first token ", first.token, " for '", request_id,
                                          "' is not allowed by its ", seq->params.constraint->field(),
                                          " constraint"));
  }
  if (seq->tier_loading) {
    return absl::FailedPreconditionError(Str("request '", request_id, "' is still loading from the KV cache tiers"));
  }
  seq->remote_reserved = false;
  seq->num_computed = seq->num_prompt_tokens;
  Publish(seq, seq->block_hashes);
  stats_.prompt_tokens_computed += seq->num_prompt_tokens - seq->num_cached_prompt_tokens;
  seq->num_cached_prompt_tokens =
      std::clamp<int64_t>(prefill_cached_tokens, 0, seq->num_prompt_tokens);
  RequestOutput out = MakeOutput(*seq);
  const std::optional<std::string> reason = Append(seq, first, &out);
  out.completion_tokens = seq->num_generated();
  out.ttft_seconds = Seconds(seq->first_token - seq->arrival);
  if (reason) {
    SetFinished(*seq, *reason, &out);
    Finish(seq);
  } else {
    scheduler_->AddWaiting(seq);  // Joins without a new allocation (it holds its blocks).
  }
  outputs->push_back(std::move(out));
  return absl::OkStatus();
}

bool LLMEngine::HasScheduledWork() const {
  if (offload_ != nullptr && offload_->HasPendingLoads()) return true;
  return scheduler_->num_running() > 0 || scheduler_->num_waiting() > 0;
}

absl::Span<const BlockId> LLMEngine::BlockTable(const std::string& request_id) const {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return {};
  return blocks_->BlockTable(it->second->id);
}

void LLMEngine::ReleaseHeld(const std::string& request_id) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end() || !it->second->held) return;
  blocks_->Free(it->second->id);
  --held_;
  sequences_.erase(it);
}

std::string LLMEngine::numerics() const {
  if (device() != "cpu") return device() + "/bf16";
  // Quantized weights name their block formats: a worker on Q4_K computes other logits than one
  // on bf16 weights of the same model, and the router says so (NumericsWatch).
  const std::string weights = weights_->quantized() ? "+" + weights_->weight_format() : "";
  if (compute_dtype_ == ComputeDType::kF32) return "f32" + weights;
  return (kernels::AmxEnabled() ? "bf16/amx" : "bf16/vdpbf16ps") + weights;
}

std::string LLMEngine::AbortKeepingBlocks(const std::string& request_id,
                                          std::vector<RequestOutput>* outputs) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return "";
  if (outputs != nullptr && !it->second->held) {
    RequestOutput out = MakeOutput(*it->second);
    SetFinished(*it->second, "abort", &out);
    outputs->push_back(std::move(out));
  }
  std::unique_ptr<Sequence> seq = std::move(it->second);
  sequences_.erase(it);
  options_by_request_.erase(request_id);
  if (!seq->held) {
    scheduler_->RemoveKeepBlocks(seq.get());
    seq->held = true;
    ++held_;
  }
  // A name no request id can take (ids are printable; this has a NUL).
  std::string name = Str(request_id, std::string_view("\0kept#", 6), ++next_kept_);
  seq->request_id = name;
  sequences_.emplace(name, std::move(seq));
  return name;
}

void LLMEngine::SetLayerObserver(LayerObserver observer) {
  layer_observer_ = std::move(observer);
  if (layer_observer_) {
    runner_->SetLayerCallback([this](int64_t layer) { layer_observer_(layer, schedule_); });
  } else {
    runner_->SetLayerCallback(nullptr);
  }
}

void LLMEngine::Draft(Sequence* seq) {
  seq->draft.clear();
  const SpeculativeOptions& so = options_.speculative;
  const int32_t asked = seq->params.num_speculative_tokens;
  int64_t k = asked < 0 ? so.num_tokens : std::min(asked, so.num_tokens);
  // Nothing past what the request may still produce (every accepted draft is followed by one
  // sampled token) or past the context (the drafts' positions must exist).
  k = std::min({k, seq->params.max_tokens - seq->num_generated() - 1,
                max_model_len_ - static_cast<int64_t>(seq->tokens.size())});
  if (k <= 0) return;
  k = seq->speculation.NextLength(static_cast<int32_t>(k));
  if (k <= 0) return;
  if (so.method == SpeculativeMethod::kNgram) {
    NgramPropose(seq->tokens, so.ngram_min, so.ngram_max, static_cast<int32_t>(k), &seq->draft);
    return;
  }
  // Suffix decoding: the request's own index (its prompt's last kSuffixPromptTokens and all its
  // output, brought up to date here) and the worker's recent outputs; the likelier draft wins.
  constexpr int64_t kSuffixPromptTokens = 4096;
  if (seq->suffix == nullptr) {
    if (!spare_suffixes_.empty()) {
      seq->suffix = std::move(spare_suffixes_.back());
      spare_suffixes_.pop_back();
      seq->suffix->Clear();
    } else {
      seq->suffix = std::make_unique<SuffixTrie>(so.suffix_depth);
    }
    seq->suffix_indexed = std::max<int64_t>(0, seq->num_prompt_tokens - kSuffixPromptTokens);
    // Growing the index's tables as it fills costs more than what is indexed (each growth
    // copies them into fresh memory): room for the prompt and the first kSuffixOutputRoom
    // tokens of output at once.
    constexpr int64_t kSuffixOutputRoom = 256;
    seq->suffix->Reserve(static_cast<int64_t>(seq->tokens.size()) - seq->suffix_indexed +
                         std::min(seq->params.max_tokens - seq->num_generated(), kSuffixOutputRoom));
  }
  seq->suffix->Append(absl::MakeConstSpan(seq->tokens).subspan(seq->suffix_indexed));
  seq->suffix_indexed = static_cast<int64_t>(seq->tokens.size());
  const auto own = seq->suffix->ProposeForCurrent(static_cast<int32_t>(k), so.suffix_min_prob,
                                                  &seq->draft);
  if (static_cast<int64_t>(seq->draft.size()) < k) {  // The recent outputs may know more.
    const auto recent = recent_outputs_->ProposeFrom(seq->tokens, static_cast<int32_t>(k), so.suffix_min_prob,
                                                     &seq->recent_match, &suffix_scratch_);
    if (recent.score > own.score) seq->draft.swap(suffix_scratch_);
  }
}

void LLMEngine::DraftForRunning() {
  drafting_.clear();
  draft_acceptance_.clear();
  draft_lengths_.clear();
  draft_seconds_ = 0;
  draft_decoding_ = 0;
  if (options_.speculative.step_budget && draft_ledger_.Paused()) return;
  const Clock::time_point start = Clock::now();
  int64_t rows = 0, decoding = 0;
  for (Sequence* seq : scheduler_->running()) {
    rows += seq->num_uncomputed();
    if (seq->num_uncomputed() != 1) continue;
    ++decoding;
    Draft(seq);
    if (seq->constraint != nullptr) seq->draft.resize(seq->constraint->AllowedPrefix(seq->draft));
    if (seq->draft.empty()) continue;
    drafting_.push_back(seq);
    draft_acceptance_.push_back(seq->speculation.acceptance);
    draft_lengths_.push_back(static_cast<int32_t>(seq->draft.size()));
  }
  // Past the step's ridge a drafted row costs what a plain one does: keep what pays.
  if (options_.speculative.step_budget) {
    BudgetDrafts(step_cost_, std::min(rows, options_.max_num_batched_tokens),
                 static_cast<double>(decoding), draft_acceptance_, absl::MakeSpan(draft_lengths_));
  }
  for (size_t i = 0; i < drafting_.size(); ++i) {
    drafting_[i]->draft.resize(static_cast<size_t>(draft_lengths_[i]));
  }
  draft_seconds_ = Seconds(Clock::now() - start);
  draft_decoding_ = decoding;
}

void LLMEngine::AccountDrafts(int64_t drafted, int64_t accepted, double sample_seconds,
                              int64_t sampled_rows) {
  if (!options_.speculative.step_budget || !step_cost_.ready() || draft_decoding_ == 0) return;
  if (drafted == 0 && draft_seconds_ == 0) return;
  // An accepted token saves a plain decode step's time per token; the drafts cost their
  // drafting, their rows (the cost model's slope) and their share of the sampling.
  const double per_token =
      (step_cost_.a() + step_cost_.b() * static_cast<double>(draft_decoding_)) / static_cast<double>(draft_decoding_);
  const double cost = draft_seconds_ + step_cost_.b() * static_cast<double>(drafted) +
                      sample_seconds * static_cast<double>(drafted) / static_cast<double>(std::max<int64_t>(1, sampled_rows));
  draft_ledger_.Record(per_token * static_cast<double>(accepted), cost);
}

void LLMEngine::RememberOutput(const Sequence& seq) {
  // Bounded: past kMaxRecentNodes the index starts again from the outputs that follow.
  constexpr int64_t kMaxRecentNodes = int64_t{1} << 20;
  if (recent_outputs_->num_nodes() > kMaxRecentNodes) recent_outputs_->Clear();
  recent_outputs_->Append(absl::MakeConstSpan(seq.tokens).subspan(seq.num_prompt_tokens));
  recent_outputs_->EndSequence();
}

absl::Status LLMEngine::Step(std::vector<RequestOutput>* outputs) {
  const Clock::time_point step_start = Clock::now();
  if (offload_ != nullptr && offload_->HasPendingLoads()) {
    PollTierLoads();
    // Nothing else to step: wait a little for a load rather than spin.
    if (offload_->HasPendingLoads() && scheduler_->num_running() == 0 && scheduler_->num_waiting() == 0) {
      offload_->WaitForLoad(std::chrono::milliseconds(1));
      PollTierLoads();
    }
  }
  if (offload_ != nullptr) TierLoadsForWaiting();
  if (options_.speculative.enabled()) DraftForRunning();
  scheduler_->Schedule(&schedule_);
  if (schedule_.chunks.empty()) return absl::OkStatus();
  ++stats_.steps;
  batch_.sequences.clear();
  sampled_.clear();
  bool decode_only = true;  // Every chunk a decode token (and its draft): a step the cost model fits.
  for (const ScheduledChunk& chunk : schedule_.chunks) {
    Sequence* seq = chunk.seq;
    const int64_t drafted = static_cast<int64_t>(seq->draft.size());
    const bool completes = seq->num_computed + chunk.num_tokens - drafted ==
                           static_cast<int64_t>(seq->tokens.size());
    decode_only = decode_only && completes && chunk.num_tokens == 1 + drafted;
    SequenceChunk sc;
    if (drafted > 0) {  // The last token, then the draft; logits at each position.
      seq->step_tokens.assign(1, seq->tokens.back());
      seq->step_tokens.insert(seq->step_tokens.end(), seq->draft.begin(), seq->draft.end());
      sc.tokens = seq->step_tokens;
    } else {
      sc.tokens = absl::MakeConstSpan(seq->tokens).subspan(seq->num_computed, chunk.num_tokens);
    }
    sc.start_position = seq->num_computed;
    sc.block_table = blocks_->BlockTable(seq->id);
    sc.num_logits = completes ? static_cast<int32_t>(1 + drafted) : 0;
    sc.lora = seq->lora.get();
    batch_.sequences.push_back(sc);
    if (completes) sampled_.push_back(seq);
    if (seq->num_computed < seq->num_prompt_tokens) {
      stats_.prompt_tokens_computed +=
          std::min(seq->num_prompt_tokens, seq->num_computed + chunk.num_tokens) -
          seq->num_computed;
    }
  }
  const Clock::time_point forward_start = Clock::now();
  stats_.schedule_seconds += Seconds(forward_start - step_start);
  // Masks not computed before: on a second thread while the forward pass runs (nothing of the
  // constraints is touched by this thread until it is joined).
  std::future<void> masks;
  if (OverlapMasks()) {
    cold_masks_.clear();
    for (Sequence* seq : sampled_) {
      if (seq->constraint != nullptr && !seq->constraint->MaskReady()) cold_masks_.push_back(seq);
    }
    if (!cold_masks_.empty()) {
      stats_.structured_masks_overlapped += static_cast<int64_t>(cold_masks_.size());
      masks = std::async(std::launch::async, [this] {
        for (Sequence* seq : cold_masks_) seq->constraint->PrepareMask();
      });
    }
  }
  const absl::Status forward = runner_->Forward(batch_, logits_.data());
  if (masks.valid()) masks.wait();
  PD_RETURN_IF_ERROR(forward);
  const Clock::time_point forward_end = Clock::now();
  stats_.forward_seconds += Seconds(forward_end - forward_start);
  if (decode_only && options_.speculative.enabled()) {
    step_cost_.Observe(batch_.num_tokens(), Seconds(forward_end - forward_start));
  }
  if (tier_load_faster_ && batch_.num_tokens() >= std::max<int64_t>(64, options_.max_num_batched_tokens / 4)) {
    // Prefill's cost a token, from steps big enough to be mostly prefill: a moving average.
    const double per_token = Seconds(forward_end - forward_start) / static_cast<double>(batch_.num_tokens());
    prefill_token_seconds_ = prefill_token_seconds_ == 0 ? per_token : prefill_token_seconds_ + 0.1 * (per_token - prefill_token_seconds_);
  }

  for (const ScheduledChunk& chunk : schedule_.chunks) {
    Sequence* seq = chunk.seq;
    // A draft's KV counts once its token is accepted (below).
    seq->num_computed += chunk.num_tokens - static_cast<int64_t>(seq->draft.size());
    PublishComputed(seq);
  }
  const int64_t vocab = config().vocab_size;
  const Clock::time_point sample_start = Clock::now();
  stats_.schedule_seconds += Seconds(sample_start - forward_end);
  size_t row = 0;
  int64_t step_drafted = 0, step_accepted = 0;
  for (Sequence* seq : sampled_) {
    RequestOutput out = MakeOutput(*seq);
    std::optional<std::string> reason;
    // Walk the positions as plain decoding would, one seeded draw each: a draft token is kept
    // exactly when it is the token drawn, and the first draw that differs ends the walk.
    const int64_t drafted = static_cast<int64_t>(seq->draft.size());
    int64_t accepted = 0;
    for (int64_t i = 0; i <= drafted; ++i) {
      const float* logits = &logits_[(row + i) * vocab];
      if (logits_observer_) logits_observer_(seq->request_id, logits, vocab);
      const uint64_t* allowed = nullptr;
      if (seq->constraint != nullptr) {
        const structured::TokenMask& mask = seq->constraint->Mask();
        if (mask.allowed == 0) {
          // A dead end: no token of the vocabulary continues the output and it cannot end
          // here (the grammar needs bytes no token has, or a key every token would repeat).
          reason = kFinishConstraintDeadEnd;
          break;
        }
        allowed = mask.words.data();
      }
      const SampledToken t = sampler_.Sample(logits, vocab, seq->params, seq->sampler, allowed);
      reason = Append(seq, t, &out);
      if (reason || i == drafted || t.token != seq->draft[i]) break;
      ++accepted;
      ++seq->num_computed;  // The draft's KV, computed this step, is the token's.
    }
    row += static_cast<size_t>(drafted + 1);
    step_drafted += drafted;
    step_accepted += accepted;
    if (drafted > 0) {
      EndSpeculation(seq, drafted, accepted, reason.has_value());
    } else if (options_.speculative.enabled()) {
      seq->speculation.Idle();
    }
    out.completion_tokens = seq->num_generated();
    out.ttft_seconds = Seconds(seq->first_token - seq->arrival);
    if (reason) {
      SetFinished(*seq, *reason, &out);
      // The worker's recent outputs feed drafts: while the ledger has paused drafting (it does
      // not pay on this model and machine) they are not indexed either, and when it has not, the
      // indexing is a cost of drafting like any other (the ledger weighs it).
      if (recent_outputs_ != nullptr && !(options_.speculative.step_budget && draft_ledger_.pause() > 0)) {
        const Clock::time_point remember_start = Clock::now();
        RememberOutput(*seq);
        draft_seconds_ += Seconds(Clock::now() - remember_start);
      }
      Finish(seq);  // Destroys seq.
    }
    outputs->push_back(std::move(out));
  }
  const Clock::time_point step_end = Clock::now();
  stats_.sample_seconds += Seconds(step_end - sample_start);
  if (options_.speculative.enabled()) {
    AccountDrafts(step_drafted, step_accepted, Seconds(step_end - sample_start), static_cast<int64_t>(row));
  }
  stats_.step_seconds += Seconds(step_end - step_start);
  return absl::OkStatus();
}

absl::Span<const int32_t> LLMEngine::EventTokens(const Sequence& seq) const {
  if (!options_.kv_event_tokens) return {};
  return seq.tokens;
}

void LLMEngine::PublishComputed(Sequence* seq) {
  const int64_t bs = blocks_->block_size();
  ExtendBlockHashes(seq->tokens, bs, &seq->block_hashes, seq->hash_root);
  Publish(seq, absl::MakeConstSpan(seq->block_hashes)
                   .subspan(0, std::min<size_t>(seq->block_hashes.size(), seq->num_computed / bs)));
}

void LLMEngine::Publish(Sequence* seq, absl::Span<const BlockHash> hashes) {
  if (offload_ == nullptr) {
    blocks_->Publish(seq->id, hashes, EventTokens(*seq), nullptr, seq->params.lora_name);
    return;
  }
  indexed_.clear();
  const absl::Span<const int32_t> tokens = EventTokens(*seq);
  blocks_->Publish(seq->id, hashes, tokens, &indexed_, seq->params.lora_name);
  // The newly indexed blocks come in the order of `hashes`: their parents and tokens for events.
  const int64_t bs = blocks_->block_size();
  size_t i = 0;
  for (const auto& [hash, block] : indexed_) {
    while (i < hashes.size() && !(hashes[i] == hash)) ++i;
    if (i == hashes.size()) break;
    const BlockHash parent = i == 0 ? BlockHash{} : hashes[i - 1];
    const auto own = tokens.size() >= (i + 1) * static_cast<size_t>(bs)
                         ? tokens.subspan(i * static_cast<size_t>(bs), static_cast<size_t>(bs))
                         : absl::Span<const int32_t>();
    offload_->OfferStored(hash, parent, block, own, seq->params.lora_name);
  }
  // Before anything may reuse the blocks (a device pool's copies are only queued until then).
  offload_->FlushOffers();
}

void LLMEngine::TierLoadsForWaiting() {
  // A request that arrived while the pool had no room for it waits without having asked the
  // tiers; once it heads the queue and its blocks fit, it asks them before the scheduler admits
  // it (a full pool is when a tier's prefixes matter most). In queue order, a few a step.
  for (int i = 0; i < 8; ++i) {
    Sequence* head = scheduler_->waiting_head();
    if (head == nullptr || head->tier_tried || head->admitted_before) return;
    scheduler_->PopWaitingHead();
    if (!StartTierLoad(head, /*at_head=*/true)) {
      scheduler_->PushWaitingFront(head);
      return;
    }
  }
}

bool LLMEngine::StartTierLoad(Sequence* seq, bool at_head) {
  const int64_t bs = blocks_->block_size();
  const int64_t len = static_cast<int64_t>(seq->tokens.size());
  ExtendBlockHashes(seq->tokens, bs, &seq->block_hashes, seq->hash_root);
  const int64_t max_blocks = (len - 1) / bs;  // At least one token is computed (its logits).
  auto probe = blocks_->PlanAdmit(seq->block_hashes, max_blocks, 0, 0);
  if (!probe.ok()) {
    seq->tier_tried = true;
    return false;
  }
  const int64_t cached = probe->num_cached_tokens / bs;
  const auto next = absl::MakeConstSpan(seq->block_hashes).subspan(static_cast<size_t>(cached),
                                                                     static_cast<size_t>(max_blocks - cached));
  if (offload_->Holds(next) == 0) {
    seq->tier_tried = true;
    return false;
  }
  // The whole prompt's blocks now (as a remote prefill reserves them): the tier's land in the
  // blocks after the pool's cached prefix.
  auto plan = blocks_->PlanAdmit(seq->block_hashes, max_blocks, len, seq->num_prompt_tokens);
  // No room: queued as usual, the tiers asked again once it heads the queue (TierLoadsForWaiting).
  if (!plan.ok() || plan->num_cached_tokens != cached * bs) return false;
  seq->tier_tried = true;
  blocks_->CommitAdmit(seq->id, *plan, static_cast<int64_t>(seq->tokens.capacity()));
  seq->num_computed = plan->num_cached_tokens;
  seq->num_cached_prompt_tokens = std::min(plan->num_cached_tokens, seq->num_prompt_tokens);
  seq->admitted_before = true;
  seq->first_scheduled = Clock::now();
  if (LoadFromTiers(seq, cached)) return true;
  // Not in the tiers after all (Holds probed them), or not worth loading: computed, admitted.
  if (at_head) {
    scheduler_->PushWaitingFront(seq);
  } else {
    scheduler_->AddWaiting(seq);
  }
  return true;
}

bool TierLoadPays(int64_t blocks, int64_t pending_blocks, double seconds_per_block, int64_t block_tokens,
                  double seconds_per_token) {
  if (!(seconds_per_block > 0) || !(seconds_per_token > 0)) return true;  // Not measured yet: load.
  const double load = static_cast<double>(pending_blocks + blocks) * seconds_per_block;
  const double compute = static_cast<double>(blocks * block_tokens) * seconds_per_token;
  return load <= compute;
}

bool LLMEngine::LoadFromTiers(Sequence* seq, int64_t cached_blocks) {
  const int64_t bs = blocks_->block_size();
  const int64_t max_blocks = (static_cast<int64_t>(seq->tokens.size()) - 1) / bs;
  if (cached_blocks >= max_blocks) return false;
  const auto next = absl::MakeConstSpan(seq->block_hashes)
                        .subspan(static_cast<size_t>(cached_blocks), static_cast<size_t>(max_blocks - cached_blocks));
  const int64_t found = offload_->Holds(next);
  if (found == 0) return false;
  if (tier_load_faster_ &&
      !TierLoadPays(found, offload_->PendingBlocks(), offload_->SecondsPerBlock(), bs, prefill_token_seconds_)) {
    // Computed instead; one decline in kTierProbeEvery loads anyway, so the tiers' figure stays
    // current (a tier that got faster, or a queue that drained).
    if (++tier_loads_declined_ % kTierProbeEvery != 0) return false;
  }
  const auto table = blocks_->BlockTable(seq->id);
  std::vector<BlockHash> hashes(next.begin(), next.begin() + found);
  std::vector<BlockId> targets(table.begin() + cached_blocks, table.begin() + cached_blocks + found);
  seq->tier_loading = true;
  tier_loads_[static_cast<uint64_t>(seq->id)] = seq->request_id;
  offload_->StartLoad(static_cast<uint64_t>(seq->id), std::move(hashes), std::move(targets));
  return true;
}

void LLMEngine::PollTierLoads() {
  std::vector<KvOffload::LoadDone> done;
  offload_->Poll(&done);
  const int64_t bs = blocks_->block_size();
  for (const KvOffload::LoadDone& d : done) {
    auto name = tier_loads_.find(d.tag);
    if (name == tier_loads_.end()) continue;
    auto it = sequences_.find(name->second);
    tier_loads_.erase(name);
    if (it == sequences_.end()) continue;
    Sequence* seq = it->second.get();
    if (seq->held) {  // Aborted while loading: its blocks were kept for the load; now they go.
      ReleaseHeld(seq->request_id);
      continue;
    }
    seq->tier_loading = false;
    const int64_t cached_blocks = seq->num_computed / bs;
    // The loaded blocks are computed KV now: published (a later request finds them in the pool),
    // counted as cached prompt tokens (they were not computed for this request).
    seq->num_computed += d.loaded * bs;
    seq->num_cached_prompt_tokens = std::min(seq->num_computed, seq->num_prompt_tokens);
    Publish(seq, absl::MakeConstSpan(seq->block_hashes).subspan(0, static_cast<size_t>(cached_blocks + d.loaded)));
    if (seq->remote_reserved) {
      // The decode worker now asks its prefill worker for the pages after these.
      tier_reservations_.push_back({seq->request_id, seq->num_computed});
      continue;
    }
    scheduler_->AddWaiting(seq);  // Joins with its blocks (the rest of its prompt is prefilled).
  }
}

BlockHash LLMEngine::TierModelKey() const {
  // Everything that fixes a block's bits: the model's shape, its weights' bytes, the arithmetic
  // (numerics: compute dtype, block formats, AMX's order), the pool's layout.
  const ModelConfig& c = config();
  const KvCacheSpec& spec = pool_->spec();
  const RopeScaling& rs = c.rope_scaling;
  std::string canonical = Str(
      "pdserve-kv-tier-v1|", ModelFamilyName(c.family), "|", c.vocab_size, "|", c.hidden_size, "|",
      c.intermediate_size, "|", c.num_layers, "|", c.num_heads, "|", c.num_kv_heads, "|", c.head_dim, "|",
      absl::StrFormat("%a|%a|%d|%a|%a|%a|%d", c.rms_norm_eps, c.rope_theta, static_cast<int>(rs.type),
                      rs.factor, rs.low_freq_factor, rs.high_freq_factor,
                      static_cast<int>(rs.original_max_position)),
      "|", c.tie_word_embeddings, c.qkv_bias, c.o_bias, c.mlp_bias, c.qk_norm, "|", c.sliding_window, "|",
      numerics(), "|", KvDTypeName(spec.dtype), "|", spec.block_size, "|", spec.PageBytes());
  for (float f : rs.freq_factors) canonical += absl::StrFormat("|%a", f);
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, canonical.data(), canonical.size());
  auto bytes = [&](const void* p, size_t n) {
    if (p != nullptr && n > 0) XXH3_128bits_update(state, p, n);
  };
  auto floats = [&](const std::vector<float>& v) { bytes(v.data(), v.size() * sizeof(float)); };
  const ModelWeights& w = *weights_;
  bytes(w.embed_tokens().data, w.embed_tokens().bytes());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layer(l);
    for (const MatrixRef* m : {&lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.o_proj, &lw.gate_proj, &lw.up_proj,
                               &lw.down_proj}) {
      bytes(m->data, m->bytes());
    }
    for (const std::vector<float>* v : {&lw.input_norm, &lw.post_attention_norm, &lw.q_bias, &lw.k_bias,
                                        &lw.v_bias, &lw.o_bias, &lw.q_norm, &lw.k_norm, &lw.gate_bias,
                                        &lw.up_bias, &lw.down_bias}) {
      floats(*v);
    }
  }
  floats(w.final_norm());
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return BlockHash{h.low64, h.high64};
}

void LLMEngine::EndSpeculation(Sequence* seq, int64_t drafted, int64_t accepted, bool finished) {
  stats_.spec_drafts += 1;
  stats_.spec_draft_tokens += drafted;
  stats_.spec_accepted_tokens += accepted;
  for (int64_t i = 0; i < accepted; ++i) ++stats_.spec_accepted_by_position[i];
  seq->speculation.Record(static_cast<int32_t>(drafted), static_cast<int32_t>(accepted));
  seq->draft.clear();
  // Accepted tokens' full blocks are published (as plain decoding would have by now); rejected
  // positions' slots go back to the pool unless the request ends (its blocks go together).
  PublishComputed(seq);
  if (!finished) blocks_->Truncate(seq->id, static_cast<int64_t>(seq->tokens.size()));
}

RequestOutput LLMEngine::MakeOutput(const Sequence& seq) const {
  RequestOutput out;
  out.request_id = seq.request_id;
  out.prompt_tokens = seq.num_prompt_tokens;
  out.completion_tokens = seq.num_generated();
  out.cached_tokens = seq.num_cached_prompt_tokens;
  out.e2e_seconds = Seconds(Clock::now() - seq.arrival);
  return out;
}

std::optional<std::string> LLMEngine::Append(Sequence* seq, const SampledToken& t,
                                             RequestOutput* out) {
  const Clock::time_point now = Clock::now();
  if (seq->first_token == Clock::time_point{}) {  // Resumed tokens came from elsewhere.
    seq->first_token = now;
    out->first_token = true;
  } else {
    out->itl_seconds = Seconds(now - seq->last_token);
  }
  seq->last_token = now;
  out->e2e_seconds = Seconds(now - seq->arrival);
  seq->tokens.push_back(t.token);
  seq->sampler.Accept(t.token);
  ++stats_.generated_tokens;
  out->tokens.push_back(TokenOutput{t.token, t.logprob, t.top_logprobs});
  const SamplingParams& p = seq->params;
  const bool eos = std::find(eos_ids_.begin(), eos_ids_.end(), t.token) != eos_ids_.end();
  if (seq->constraint != nullptr) {
    // The mask allowed it: EOS where the output is complete (ignore_eos or not: nothing else
    // may follow), any other token moves the matcher.
    if (eos) return "stop";
    seq->constraint->Accept(t.token);
  }
  if (!p.ignore_eos && eos) return "stop";
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t.token) !=
      p.stop_token_ids.end()) {
    return "stop";
  }
  if (seq->num_generated() >= p.max_tokens) return "length";
  if (static_cast<int64_t>(seq->tokens.size()) >= max_model_len_) return "length";
  return std::nullopt;
}

void LLMEngine::SetFinished(const Sequence& seq, const std::string& reason,
                            RequestOutput* out) const {
  out->finished = true;
  out->finish_reason = reason;
  const Clock::time_point zero{};
  const Clock::time_point now = Clock::now();
  const Clock::time_point scheduled = seq.first_scheduled == zero ? now : seq.first_scheduled;
  out->queue_seconds = Seconds(scheduled - seq.arrival);
  if (seq.first_token != zero) {
    out->prefill_seconds = Seconds(seq.first_token - scheduled);
    out->decode_seconds = Seconds(seq.last_token - seq.first_token);
  } else {
    out->prefill_seconds = Seconds(now - scheduled);  // Aborted before its first token.
  }
}

void LLMEngine::Finish(Sequence* seq) {
  // Its suffix index (if it drafted) goes to the next request that drafts; a few are kept.
  constexpr size_t kMaxSpareSuffixes = 16;
  if (seq->suffix != nullptr && spare_suffixes_.size() < kMaxSpareSuffixes) {
    spare_suffixes_.push_back(std::move(seq->suffix));
  }
  auto opt = options_by_request_.find(seq->request_id);
  if (opt != options_by_request_.end()) {
    const bool hold = opt->second.hold_blocks_after_finish;
    options_by_request_.erase(opt);
    if (hold) {
      scheduler_->RemoveKeepBlocks(seq);
      seq->held = true;
      ++held_;
      return;
    }
  }
  scheduler_->Remove(seq);
  sequences_.erase(seq->request_id);
}

bool LLMEngine::Abort(const std::string& request_id, std::vector<RequestOutput>* outputs) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return false;
  if (it->second->held) {
    ReleaseHeld(request_id);
    return true;
  }
  if (it->second->tier_loading) {
    // Its blocks are being written by the tier's load: held under another name until it ends.
    const uint64_t tag = static_cast<uint64_t>(it->second->id);
    const std::string held = AbortKeepingBlocks(request_id, outputs);
    tier_loads_[tag] = held;
    return true;
  }
  options_by_request_.erase(request_id);
  RequestOutput out = MakeOutput(*it->second);
  SetFinished(*it->second, "abort", &out);
  Finish(it->second.get());
  if (outputs != nullptr) outputs->push_back(std::move(out));
  return true;
}

EngineStats LLMEngine::Stats() const {
  EngineStats s = stats_;
  if (constraints_ != nullptr) {
    s.structured_compiled = constraints_->compiled();
    s.structured_masks_computed = constraints_->masks_computed();
    s.structured_mask_lookups = constraints_->mask_lookups();
  }
  s.running = scheduler_->num_running();
  s.waiting = scheduler_->num_waiting();
  s.preemptions = scheduler_->num_preemptions();
  s.kv = blocks_->Stats();
  s.forward_phase_seconds = runner_->phase_seconds();
  if (offload_ != nullptr) {
    s.offload = offload_->stats();
    s.offload.declined_loads = tier_loads_declined_ - tier_loads_declined_ / kTierProbeEvery;
    for (const auto& t : offload_->tiers()) s.tiers.emplace_back(std::string(t->name()), t->Stats());
  }
  return s;
}

void LLMEngine::LoraRequestNames(std::vector<std::string>* running,
                                 std::vector<std::string>* waiting) const {
  running->clear();
  waiting->clear();
  if (options_.lora == nullptr) return;
  absl::flat_hash_set<const Sequence*> in_batch;
  for (const Sequence* seq : scheduler_->running()) {
    in_batch.insert(seq);
    if (seq->lora != nullptr) running->push_back(seq->params.lora_name);
  }
  // Every other unfinished request: queued, loading from a tier, awaiting its remote prefill.
  for (const auto& [id, seq] : sequences_) {
    if (seq->lora != nullptr && !seq->held && !in_batch.contains(seq.get())) {
      waiting->push_back(seq->params.lora_name);
    }
  }
  for (auto* names : {running, waiting}) {
    std::sort(names->begin(), names->end());
    names->erase(std::unique(names->begin(), names->end()), names->end());
  }
}

}  // namespace pdserve
