#include "planner/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/base/check.h"
#include "common/base/rng.h"
#include "common/base/strings.h"
#include "common/kvcache/block_hash.h"
#include "nlohmann/json.hpp"
#include "planner/latency_histogram.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

absl::StatusOr<double> Number(const Json& j, const char* key, std::string_view source) {
  if (!j.contains(key) || !j[key].is_number()) {
    return absl::InvalidArgumentError(Str(source, ": '", key, "' is missing or not a number"));
  }
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(Str(source, ": '", key, "' must be a finite number >= 0"));
  }
  return v;
}

class VectorSource : public RequestSource {
 public:
  explicit VectorSource(std::vector<SimRequest> requests) : requests_(std::move(requests)) {}
  absl::StatusOr<bool> Next(SimRequest* out) override {
    if (next_ >= requests_.size()) return false;
    *out = std::move(requests_[next_++]);
    return true;
  }

 private:
  std::vector<SimRequest> requests_;
  size_t next_ = 0;
};

class TraceSource : public RequestSource {
 public:
  TraceSource(std::string path, std::ifstream in, const TraceOptions& options)
      : path_(std::move(path)), in_(std::move(in)), options_(options) {
    block_ = std::max<int64_t>(1, std::llround(static_cast<double>(options.trace_block_tokens) *
                                               options.length_scale));
  }

  absl::StatusOr<bool> Next(SimRequest* out) override {
    std::string line;
    for (;;) {
      if (options_.max_requests > 0 && read_ >= options_.max_requests) return false;
      if (!std::getline(in_, line)) return false;
      ++line_no_;
      if (line.find_first_not_of(" \t\r") != std::string::npos) break;
    }
    ++read_;
    const std::string where = Str(path_, " line ", line_no_);
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(Str(where, ": not a JSON object"));
    }
    auto ts = Number(j, "timestamp", where);
    auto in = Number(j, "input_length", where);
    auto outlen = Number(j, "output_length", where);
    for (const auto* s : {&ts, &in, &outlen}) {
      if (!s->ok()) return s->status();
    }
    if (*in < 1 || *outlen < 1) {
      return absl::InvalidArgumentError(Str(where, ": input_length and output_length must be >= 1"));
    }
    // Bounded before the prompt is allocated (and before a length past int32 wraps).
    if (*in * options_.length_scale > static_cast<double>(kMaxTraceLength) ||
        *outlen > static_cast<double>(kMaxTraceLength)) {
      return absl::InvalidArgumentError(Str(where, ": input_length (after --trace-length-scale) and output_length "
                                                   "must be at most ", kMaxTraceLength, " tokens"));
    }
    if (!j.contains("hash_ids") || !j["hash_ids"].is_array()) {
      return absl::InvalidArgumentError(Str(where, ": 'hash_ids' is missing or not an array"));
    }
    const double arrival = *ts / 1000.0 * options_.time_scale;
    if (arrival < last_arrival_) {
      return absl::InvalidArgumentError(Str(where, ": timestamp ", *ts, " is before the line before it"));
    }
    last_arrival_ = arrival;
    const int64_t len = std::max<int64_t>(1, std::llround(*in * options_.length_scale));
    out->arrival_seconds = arrival;
    out->output_tokens = std::max<int64_t>(1, std::llround(*outlen));
    out->prompt.resize(static_cast<size_t>(len));
    const Json& ids = j["hash_ids"];
    ids_.clear();
    for (size_t b = 0; b < ids.size(); ++b) {
      if (!ids[b].is_number_integer()) {
        return absl::InvalidArgumentError(Str(where, ": hash_ids[", b, "] is not an integer"));
      }
      ids_.push_back(static_cast<uint64_t>(ids[b].get<int64_t>()));
    }
    const uint64_t vocab = static_cast<uint64_t>(options_.vocab_size);
    for (int64_t pos = 0; pos < len; ++pos) {
      const size_t b = static_cast<size_t>(pos / block_);
      // The same id gives the same tokens wherever it appears; past the ids' blocks, this
      // request's own tokens.
      const uint64_t key = b < ids_.size()
                               ? Mix64(ids_[b] * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(pos % block_))
                               : Mix64(~(static_cast<uint64_t>(line_no_) << 24 ^ static_cast<uint64_t>(pos)));
      out->prompt[static_cast<size_t>(pos)] = static_cast<int32_t>(key % vocab);
    }
    return true;
  }

 private:
  const std::string path_;
  std::ifstream in_;
  const TraceOptions options_;
  int64_t block_ = 1;
  int64_t line_no_ = 0, read_ = 0;
  double last_arrival_ = 0;
  std::vector<uint64_t> ids_;
};

enum class EventKind : uint8_t { kArrival, kStepEnd, kTransferDone, kTierLoadDone };

struct Event {
  double time;
  uint64_t order;  // Ties in time run in the order they were posted.
  EventKind kind;
  int64_t who;     // The worker (kStepEnd) or the request (kTransferDone, kTierLoadDone).
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : order > o.order; }
};

// A request in flight, under its arrival index (the request id its workers know). Looked up for
// every token it gets, so kept small (with its key, one cache line); its per-token gaps, when
// requests are kept, live beside it in Cluster::itls_, and a remote prefill's transfer in
// Cluster::transfers_.
struct Flight {
  double arrival = 0;
  double first = -1, last = 0;
  int32_t decode = 0, prefill = -1;
  int32_t prompt_len = 0;
  int32_t cached_tokens = 0;  // Prompt tokens found cached where it was prefilled.
  int32_t completion_tokens = 0;
  bool remote_prefill = false;
};
static_assert(sizeof(Flight) + sizeof(int64_t) <= 64);

// A remote prefill's pages, from its reservation on the decode worker to their arrival.
struct Transfer {
  // When the prefill worker's link will have sent the pages submitted so far (streamed per layer
  // as each step computes them), and how many prompt tokens' pages those are (from what the
  // decode worker had cached on).
  double pages_sent_at = 0;
  int64_t sent_tokens = 0;
  int64_t prefill_cached = 0;
  int32_t first_token = 0;  // What the prefill worker sampled.
};

// A request's prompt blocks loading from the KV cache tiers into a worker's pool.
struct TierLoad {
  int64_t worker = 0;
  int64_t blocks = 0;
};

struct Worker {
  std::unique_ptr<SimWorker> engine;
  std::unique_ptr<SimTier> host;  // Its KV cache tier in host memory (null: none).
  std::unique_ptr<SimTier> disk;  // Its KV cache tier on disk (null: none).
  double io_free = 0;             // When its I/O thread has finished the loads queued so far.
  SimWorkerStats stats;
  bool busy = false;
  double step_start = 0;
  double recent = 0, recent_at = 0;  // The router's decayed prompt blocks sent lately.
  double usage_area = 0, usage_now = 0, usage_at = 0;
};

class Cluster {
 public:
  Cluster(const SimProfile& profile, const ClusterOptions& options)
      : profile_(profile), options_(options), rng_(Mix64(options.seed)) {
    SimWorker::Options wo = options.worker;
    const uint64_t vocab = static_cast<uint64_t>(std::max<int64_t>(profile.vocab_size, 2));
    wo.next_token = [vocab](int64_t request, int64_t position) {
      // A hash of (request, position) scaled into [0, vocab) by a multiply, not a division (a
      // 64-bit modulo was 5% of a decode-heavy simulation).
      const uint64_t h = Mix64(static_cast<uint64_t>(request) * 0xD1B54A32D192ED03ull +
                               static_cast<uint64_t>(position));
      return static_cast<int32_t>((static_cast<unsigned __int128>(h) * vocab) >> 64);
    };
    const SimTierOptions& tiers = options.tiers;
    if (tiers.store_blocks > 0) store_ = std::make_unique<SimTier>(tiers.store_blocks, tiers.store);
    for (int64_t i = 0; i < options.prefill_workers + options.decode_workers; ++i) {
      Worker w;
      if (tiers.host_blocks > 0) w.host = std::make_unique<SimTier>(tiers.host_blocks, tiers.host);
      if (tiers.disk_blocks > 0) w.disk = std::make_unique<SimTier>(tiers.disk_blocks, tiers.disk);
      if (w.host != nullptr || w.disk != nullptr || store_ != nullptr) {
        // Write-through: every block the worker publishes is offered to each of its tiers.
        wo.on_publish = [host = w.host.get(), disk = w.disk.get(), store = store_.get()](const BlockHash& h) {
          if (host != nullptr) host->Insert(h);
          if (disk != nullptr) disk->Insert(h);
          if (store != nullptr) store->Insert(h);
        };
      }
      w.engine = std::make_unique<SimWorker>(wo);
      w.stats.tier = i < options.prefill_workers ? "prefill" : "decode";
      workers_.push_back(std::move(w));
    }
  }

  absl::StatusOr<ClusterResult> Run(RequestSource& source) {
    const auto wall_start = std::chrono::steady_clock::now();
    SimRequest pending;
    bool have = false;
    auto fetch = [&]() -> absl::Status {
      const double before = pending.arrival_seconds;
      auto next = source.Next(&pending);
      if (!next.ok()) return next.status();
      have = *next;
      if (have && next_index_ > 0 && pending.arrival_seconds < before) {
        return absl::InvalidArgumentError(Str("request ", next_index_, " arrives at ",
                                              pending.arrival_seconds, " s, before the one before it"));
      }
      if (have) Post(pending.arrival_seconds, EventKind::kArrival, 0);
      return absl::OkStatus();
    };
    if (absl::Status s = fetch(); !s.ok()) return s;
    result_.first_arrival_seconds = have ? pending.arrival_seconds : 0;
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      switch (e.kind) {
        case EventKind::kArrival:
          Route(std::move(pending));
          if (absl::Status s = fetch(); !s.ok()) return s;
          break;
        case EventKind::kStepEnd:
          EndStep(e.who);
          break;
        case EventKind::kTransferDone:
          TransferDone(e.who);
          break;
        case EventKind::kTierLoadDone:
          TierLoadDone(e.who);
          break;
      }
    }
    result_.end_seconds = now_;
    const double span = std::max(1e-12, now_ - result_.first_arrival_seconds);
    Summarize(now_ - result_.first_arrival_seconds);
    for (Worker& w : workers_) {
      Touch(w);
      w.stats.kv_usage_mean = w.usage_area / span;
      w.stats.preemptions = w.engine->num_preemptions();
      w.stats.used_blocks_at_end = w.engine->kv().used_blocks;
      result_.steps += w.stats.steps;
      result_.workers.push_back(w.stats);
    }
    for (const Worker& w : workers_) {
      if (w.disk != nullptr) result_.disk_evictions += w.disk->evictions();
      if (w.host != nullptr) result_.host_evictions += w.host->evictions();
    }
    if (store_ != nullptr) result_.store_evictions = store_->evictions();
    result_.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    return std::move(result_);
  }

 private:
  void Post(double time, EventKind kind, int64_t who) { events_.push(Event{time, order_++, kind, who}); }

  // The KV usage integral, brought up to now; then the usage as it is now.
  void Touch(Worker& w) {
    w.usage_area += w.usage_now * (now_ - w.usage_at);
    const KvCacheStats kv = w.engine->kv();
    w.usage_now = kv.usage();
    w.usage_at = now_;
    w.stats.kv_usage_max = std::max(w.stats.kv_usage_max, w.usage_now);
  }

  // Starts a step on an idle worker that has work.
  void Kick(int64_t index) {
    Worker& w = workers_[static_cast<size_t>(index)];
    if (w.busy) return;
    StepShape shape;
    // A worker steps while it has work (DecodeWorker::Loop). A step that runs nothing changes
    // nothing, unless it preempted (it then returns before admitting): the next one may run.
    // Otherwise only an event (an arrival, pages, blocks released) can: they kick it again.
    bool runs = w.engine->BeginStep(&shape);
    for (int retry = 0; !runs && !w.engine->schedule().preempted.empty() && retry < 1000; ++retry) {
      runs = w.engine->BeginStep(&shape);
    }
    Touch(w);
    if (!runs) return;
    const double cost = std::max(1e-9, profile_.step.Predict(shape));
    w.busy = true;
    w.step_start = now_;
    ++w.stats.steps;
    result_.step_sequences += shape.sequences;
    w.stats.busy_seconds += cost;
    Post(now_ + cost, EventKind::kStepEnd, index);
  }

  // The router's view of one tier, as WorkerPool::Choose builds it.
  RoutingDecision Choose(int64_t first, int64_t count, const std::vector<BlockHash>& hashes,
                         int64_t prompt_blocks, std::vector<WorkerCandidate>* candidates) {
    candidates->clear();
    const int64_t bs = options_.worker.block_size;
    for (int64_t i = first; i < first + count; ++i) {
      Worker& w = workers_[static_cast<size_t>(i)];
      WorkerCandidate c;
      const KvCacheStats kv = w.engine->kv();
      c.active_blocks = kv.used_blocks;
      c.waiting = w.engine->num_waiting();
      w.recent *= std::exp2(-(now_ - w.recent_at) / options_.recent_half_life_seconds);
      w.recent_at = now_;
      c.recent_blocks = w.recent;
      c.cached_prefix_blocks =
          w.engine->CachedPrefixTokens(hashes, static_cast<int64_t>(hashes.size()) * bs + 1) / bs;
      const TierRun run = FindTierRun(w, hashes, c.cached_prefix_blocks, static_cast<int64_t>(hashes.size()));
      // A worker whose tiers read slower than it computes reports so (KvOffloadInfo::loads_declined):
      // the router counts none of their blocks.
      c.tier_prefix_blocks = LoadDeclined(w, run) ? 0 : run.host + run.disk + run.store;
      candidates->push_back(c);
    }
    rng_ = Mix64(rng_ + 0x9E3779B97F4A7C15ull);
    const RoutingDecision d = ChooseWorker(options_.routing, *candidates, prompt_blocks, round_robin_++,
                                           static_cast<double>(rng_ >> 11) * 0x1.0p-53);
    Worker& chosen = workers_[static_cast<size_t>(first) + d.index];
    chosen.recent += static_cast<double>(prompt_blocks);
    ++chosen.stats.requests;
    if (d.fell_back) ++result_.guard_fallbacks;
    return d;
  }

  void Route(SimRequest r) {
    const int64_t index = next_index_++;
    if (options_.keep_requests) result_.requests.emplace_back();
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    // As the router's request validation: a prompt that leaves no room, or whose max_tokens
    // (the output length) would run past the context, is refused, not served.
    const int64_t context = options_.worker.max_model_len;
    if (len == 0 || len >= context || r.output_tokens < 1 || len + r.output_tokens > context) {
      SimRequestResult res;
      res.prompt_tokens = len;
      res.ok = false;
      res.error = len == 0 ? "empty prompt"
                  : r.output_tokens < 1 ? "output_tokens must be >= 1"
                  : len >= context ? Str("prompt of ", len, " tokens leaves no room to generate within max_model_len ", context)
                                   : Str("max_tokens ", r.output_tokens, " and a ", len,
                                         "-token prompt exceed the context length of ", context);
      if (summary_.failed++ == 0) summary_.first_error = res.error;
      if (options_.keep_requests) result_.requests[static_cast<size_t>(index)] = std::move(res);
      return;
    }
    const int64_t bs = options_.worker.block_size;
    std::vector<BlockHash> hashes;
    ExtendBlockHashes(r.prompt, bs, &hashes);
    const int64_t prompt_blocks = (len + bs - 1) / bs;
    const int64_t np = options_.prefill_workers;
    const RoutingDecision d = Choose(np, options_.decode_workers, hashes, prompt_blocks, &candidates_);
    Flight f;
    f.arrival = r.arrival_seconds;
    f.decode = static_cast<int32_t>(np + static_cast<int64_t>(d.index));
    f.prompt_len = static_cast<int32_t>(len);
    const int64_t uncached =
        len - (candidates_[d.index].cached_prefix_blocks + candidates_[d.index].tier_prefix_blocks) * bs;
    bool saturated = true;
    for (int64_t i = 0; i < np; ++i) {
      saturated = saturated && workers_[static_cast<size_t>(i)].engine->num_waiting() >= options_.prefill_max_waiting;
    }
    if (np > 0 && uncached > options_.local_prefill_tokens && !saturated) {
      f.prefill = static_cast<int32_t>(Choose(0, np, hashes, prompt_blocks, &candidates_).index);
    }
    Worker& dec = workers_[static_cast<size_t>(f.decode)];
    // The decode worker's own check (DecodeWorker::Start), then its reservation.
    int64_t decode_cached = 0;  // Prompt tokens the decode worker's reservation found cached.
    bool remote = f.prefill >= 0 &&
                  len - dec.engine->CachedPrefixTokens(hashes, len) > options_.local_prefill_tokens;
    if (remote) {
      remote = dec.engine->Reserve(index, r.prompt, r.output_tokens, &decode_cached, hashes);
      if (!remote) ++result_.reserve_refusals;
    }
    if (remote) {
      transfers_[index].sent_tokens = decode_cached;  // The pages the decode worker lacks are sent.
      AddWithTiers(f.prefill, index, std::move(r.prompt), 1, /*hold_after_finish=*/true, std::move(hashes));
      ++result_.remote_prefills;
      f.remote_prefill = true;
      Touch(dec);
      flights_.emplace(index, f);
      Kick(f.prefill);
    } else {
      f.prefill = -1;
      AddWithTiers(f.decode, index, std::move(r.prompt), r.output_tokens, /*hold_after_finish=*/false,
                   std::move(hashes));
      ++result_.local_prefills;
      flights_.emplace(index, f);
      Kick(f.decode);
    }
    result_.peak_in_flight = std::max<int64_t>(result_.peak_in_flight, static_cast<int64_t>(flights_.size()));
  }

  // A run of prompt blocks after the pool's prefix that the tiers hold: the worker's host memory
  // first, then its disk, then the store, each where the one before's run ends.
  struct TierRun {
    int64_t host = 0, disk = 0, store = 0;
  };
  TierRun FindTierRun(const Worker& w, const std::vector<BlockHash>& hashes, int64_t from, int64_t to) const {
    TierRun run;
    int64_t i = from;
    if (w.host != nullptr) {
      while (i < to && w.host->Contains(hashes[static_cast<size_t>(i)])) ++i;
      run.host = i - from;
    }
    if (w.disk != nullptr) {
      const int64_t start = i;
      while (i < to && w.disk->Contains(hashes[static_cast<size_t>(i)])) ++i;
      run.disk = i - start;
    }
    if (store_ != nullptr) {
      const int64_t start = i;
      while (i < to && store_->Contains(hashes[static_cast<size_t>(i)])) ++i;
      run.store = i - start;
    }
    return run;
  }

  // SimWorker::Add, or, when the tiers hold the prompt's next blocks, AddLoading and a load on the
  // worker's I/O thread (as LLMEngine::StartTierLoad).
  void AddWithTiers(int64_t worker, int64_t request, std::vector<int32_t> prompt, int64_t output_tokens,
                    bool hold, std::vector<BlockHash> hashes) {
    Worker& w = workers_[static_cast<size_t>(worker)];
    if (w.host == nullptr && w.disk == nullptr && store_ == nullptr) {
      w.engine->Add(request, std::move(prompt), output_tokens, hold, std::move(hashes));
      return;
    }
    const int64_t bs = options_.worker.block_size;
    const int64_t len = static_cast<int64_t>(prompt.size());
    ExtendBlockHashes(prompt, bs, &hashes);
    const int64_t cached = w.engine->CachedPrefixTokens(hashes, len) / bs;
    const TierRun run = FindTierRun(w, hashes, cached, (len - 1) / bs);
    const int64_t blocks = run.host + run.disk + run.store;
    const double cost = LoadSeconds(w, run);
    const bool declined = LoadDeclined(w, run);
    if (declined) ++result_.declined_loads;
    if (blocks == 0 || declined || !w.engine->AddLoading(request, prompt, output_tokens, hold, hashes, cached)) {
      w.engine->Add(request, std::move(prompt), output_tokens, hold, std::move(hashes));
      return;
    }
    for (int64_t i = cached; i < cached + blocks; ++i) {
      const BlockHash& h = hashes[static_cast<size_t>(i)];
      (i < cached + run.host ? w.host.get() : i < cached + run.host + run.disk ? w.disk.get() : store_.get())->Touch(h);
    }
    w.io_free = std::max(w.io_free, now_) + cost;
    loads_[request] = {worker, blocks};
    result_.host_loaded_tokens += run.host * bs;
    result_.disk_loaded_tokens += run.disk * bs;
    result_.store_loaded_tokens += run.store * bs;
    ++result_.tier_loads;
    Touch(w);
    Post(w.io_free, EventKind::kTierLoadDone, request);
  }

  double LoadSeconds(const Worker& w, const TierRun& run) const {
    const double block_bytes = static_cast<double>(profile_.kv_bytes_per_token * options_.worker.block_size);
    return (run.host > 0 ? w.host->cost().Load(run.host, block_bytes) : 0) +
           (run.disk > 0 ? w.disk->cost().Load(run.disk, block_bytes) : 0) +
           (run.store > 0 ? store_->cost().Load(run.store, block_bytes) : 0);
  }

  // --kv-tier-load faster: as LLMEngine's TierLoadPays, the run behind the loads already queued
  // on the worker's I/O thread against computing its tokens.
  bool LoadDeclined(const Worker& w, const TierRun& run) const {
    const int64_t blocks = run.host + run.disk + run.store;
    if (blocks == 0 || !options_.tiers.load_faster) return false;
    return std::max(w.io_free - now_, 0.0) + LoadSeconds(w, run) >
           static_cast<double>(blocks * options_.worker.block_size) * PrefillTokenSeconds();
  }

  // What the engine measures as its prefill cost a token: a full step of one fresh prompt.
  double PrefillTokenSeconds() const {
    const int64_t t = std::max<int64_t>(1, options_.worker.max_num_batched_tokens);
    StepShape s;
    s.AddChunk(t, 0);
    return profile_.step.Predict(s) / static_cast<double>(t);
  }

  void TierLoadDone(int64_t request) {
    auto it = loads_.find(request);
    PD_CHECK_MSG(it != loads_.end(), "TierLoadDone without a load");
    const TierLoad load = it->second;
    loads_.erase(it);
    workers_[static_cast<size_t>(load.worker)].engine->FinishLoad(request, load.blocks);
    Kick(load.worker);
  }

  void Token(int64_t request, Flight& f, double t) {
    if (f.first < 0) {
      f.first = t;
    } else {
      itl_.Add(t - f.last);
      if (options_.keep_requests) itls_[request].push_back(t - f.last);
    }
    f.last = t;
    ++f.completion_tokens;
  }

  // The request's last token: its figures into the summary (load_client's Summarize, per request).
  void Finish(int64_t request, Flight& f) {
    SimRequestResult res;
    res.prompt_tokens = f.prompt_len;
    res.cached_tokens = f.cached_tokens;
    res.completion_tokens = f.completion_tokens;
    res.remote_prefill = f.remote_prefill;
    res.ttft_seconds = f.first - f.arrival;
    res.e2e_seconds = f.last - f.arrival;
    ++summary_.ok;
    ttft_.Add(res.ttft_seconds);
    e2e_.Add(res.e2e_seconds);
    const double tpot = res.completion_tokens > 1
                            ? (res.e2e_seconds - res.ttft_seconds) / static_cast<double>(res.completion_tokens - 1)
                            : 0;
    if (res.completion_tokens > 1) tpot_.Add(tpot);
    summary_.prompt_tokens += res.prompt_tokens;
    cached_tokens_ += res.cached_tokens;
    summary_.completion_tokens += res.completion_tokens;
    const Slo& slo = options_.slo;
    if (slo.any() && (slo.ttft_ms <= 0 || res.ttft_seconds * 1e3 <= slo.ttft_ms) &&
        (slo.tpot_ms <= 0 || tpot * 1e3 <= slo.tpot_ms) && (slo.e2e_ms <= 0 || res.e2e_seconds * 1e3 <= slo.e2e_ms)) {
      ++summary_.good;
    }
    if (options_.keep_requests) {
      auto itl = itls_.find(request);
      if (itl != itls_.end()) {
        res.itl_seconds = std::move(itl->second);
        itls_.erase(itl);
      }
      result_.requests[static_cast<size_t>(request)] = std::move(res);
    }
    flights_.erase(request);
  }

  void Summarize(double duration) {
    LoadSummary& s = summary_;
    s.hit_rate = s.prompt_tokens > 0 ? static_cast<double>(cached_tokens_) / static_cast<double>(s.prompt_tokens) : 0;
    const std::pair<Distribution*, const LatencyHistogram*> dists[] = {
        {&s.ttft, &ttft_}, {&s.tpot, &tpot_}, {&s.itl, &itl_}, {&s.e2e, &e2e_}};
    for (const auto& [d, h] : dists) {
      d->mean = h->mean();
      d->p50 = h->Percentile(50);
      d->p90 = h->Percentile(90);
      d->p99 = h->Percentile(99);
    }
    s.duration_seconds = duration;
    if (duration > 0) {
      s.requests_per_second = static_cast<double>(s.ok) / duration;
      s.output_tokens_per_second = static_cast<double>(s.completion_tokens) / duration;
      s.total_tokens_per_second = static_cast<double>(s.prompt_tokens + s.completion_tokens) / duration;
      s.goodput = static_cast<double>(s.good) / duration;
    }
    result_.summary = s;
  }

  void EndStep(int64_t index) {
    Worker& w = workers_[static_cast<size_t>(index)];
    w.busy = false;
    const bool prefill_tier = index < options_.prefill_workers;
    if (prefill_tier) {
      // As PrefillWorker::OnLayer: each layer's pages of this step's chunks go to the decode
      // worker as the layer is computed (the prompt's blocks the decode worker lacks, the
      // prefill worker's cached ones with the first chunk).
      for (const ScheduledChunk& c : w.engine->schedule().chunks) {
        Transfer& f = transfers_.at(c.seq->id);
        const int64_t end = c.seq->num_computed + c.num_tokens;
        if (end <= f.sent_tokens) continue;
        const double bytes = static_cast<double>(end - f.sent_tokens) * static_cast<double>(profile_.kv_bytes_per_token);
        f.sent_tokens = end;
        f.pages_sent_at = LayerStreamDone(f.pages_sent_at, w.step_start, now_ - w.step_start, bytes,
                                          profile_.num_layers, profile_.transfer_bytes_per_second);
      }
    }
    emitted_.clear();
    w.engine->EndStep(&emitted_);
    Touch(w);
    // Each token looks its request up among every request in flight (thousands when a queue
    // builds): fetch their entries first, so that the misses overlap instead of queueing.
    if (!prefill_tier) {
      for (const SimWorker::Emitted& e : emitted_) flights_.prefetch(e.request);
    }
    for (const SimWorker::Emitted& e : emitted_) {
      if (prefill_tier) {
        // The prompt is computed and its first token sampled: the transfer ends once the last
        // pages are sent (and Finish's summary has crossed).
        Transfer& t = transfers_.at(e.request);
        t.first_token = e.token;
        t.prefill_cached = e.cached_prompt_tokens;
        Post(std::max(now_, t.pages_sent_at) + profile_.transfer_latency_seconds, EventKind::kTransferDone,
             e.request);
        continue;
      }
      Flight& f = flights_.at(e.request);
      if (e.first) f.cached_tokens = static_cast<int32_t>(e.cached_prompt_tokens);
      Token(e.request, f, now_);
      if (e.finished) Finish(e.request, f);
    }
    Kick(index);
  }

  void TransferDone(int64_t request) {
    Flight& f = flights_.at(request);
    Worker& pre = workers_[static_cast<size_t>(f.prefill)];
    pre.engine->ReleaseHeld(request);
    Touch(pre);
    Worker& dec = workers_[static_cast<size_t>(f.decode)];
    auto t = transfers_.find(request);
    PD_CHECK_MSG(t != transfers_.end(), "TransferDone without a transfer");
    const SimWorker::Emitted e =
        dec.engine->CompleteRemote(request, t->second.first_token, t->second.prefill_cached);
    transfers_.erase(t);
    Touch(dec);
    f.cached_tokens = static_cast<int32_t>(e.cached_prompt_tokens);
    const int64_t decode = f.decode;
    const int64_t prefill = f.prefill;
    Token(request, f, now_);
    if (e.finished) Finish(request, f);
    Kick(decode);
    Kick(prefill);  // Its held blocks are free: a prompt waiting for them may start.
  }

  const SimProfile& profile_;
  const ClusterOptions& options_;
  std::vector<Worker> workers_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t order_ = 0;
  double now_ = 0;
  absl::flat_hash_map<int64_t, Flight> flights_;
  absl::flat_hash_map<int64_t, Transfer> transfers_;
  absl::flat_hash_map<int64_t, TierLoad> loads_;  // By request.
  std::unique_ptr<SimTier> store_;  // The shared KV store (null: none).
  absl::flat_hash_map<int64_t, std::vector<double>> itls_;  // keep_requests: by arrival index.
  ClusterResult result_;
  std::vector<WorkerCandidate> candidates_;
  std::vector<SimWorker::Emitted> emitted_;
  uint64_t rng_, round_robin_ = 0;  // rng_: the softmax draws (routing temperature > 0).
  int64_t next_index_ = 0;
  LoadSummary summary_;
  int64_t cached_tokens_ = 0;
  LatencyHistogram ttft_, tpot_, itl_, e2e_;
};

}  // namespace

absl::StatusOr<SimProfile> ParseSimProfile(std::string_view json, std::string_view source,
                                           double kv_dtype_bytes) {
  const Json j = Json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(Str(source, ": not a JSON object"));
  if (!j.contains("format") || j["format"] != "pdserve-profile-v1") {
    return absl::InvalidArgumentError(Str(source, ": 'format' is not pdserve-profile-v1 (write it with pdserve profile)"));
  }
  for (const char* key : {"model", "step_cost", "transport"}) {
    if (!j.contains(key) || !j[key].is_object()) {
      return absl::InvalidArgumentError(Str(source, ": '", key, "' is missing or not an object"));
    }
  }
  SimProfile p;
  p.modelled = j.value("modelled", false);
  const Json& m = j["model"];
  p.model = m.value("name", "");
  const Json& sc = j["step_cost"];
  const std::string sc_where = Str(source, " step_cost");
  auto a = Number(sc, "a_seconds", sc_where);
  auto b = Number(sc, "b_per_token", sc_where);
  auto c = Number(sc, "c_per_prefill_pair", sc_where);
  auto d = Number(sc, "d_per_sequence", sc_where);
  auto e = Number(sc, "e_per_decode_key", sc_where);
  for (const auto* s : {&a, &b, &c, &d, &e}) {
    if (!s->ok()) return s->status();
  }
  // f: profiles written before the decode-only term have none (0: the old model).
  absl::StatusOr<double> f = 0.0;
  if (sc.contains("f_decode_only_seconds")) f = Number(sc, "f_decode_only_seconds", sc_where);
  if (!f.ok()) return f.status();
  p.step = StepTimeModel{*a, *b, *c, *d, *e, *f};
  if (p.step.a + p.step.b <= 0) {
    return absl::InvalidArgumentError(Str(sc_where, ": a step costs nothing (a_seconds and b_per_token are 0)"));
  }
  const std::string t_where = Str(source, " transport");
  auto lat = Number(j["transport"], "latency_seconds", t_where);
  auto bw = Number(j["transport"], "bytes_per_second", t_where);
  if (!lat.ok()) return lat.status();
  if (!bw.ok()) return bw.status();
  if (*bw <= 0) return absl::InvalidArgumentError(Str(t_where, ": 'bytes_per_second' must be > 0"));
  p.transfer_latency_seconds = *lat;
  p.transfer_bytes_per_second = *bw;
  const std::string m_where = Str(source, " model");
  auto vocab = Number(m, "vocab_size", m_where);
  if (!vocab.ok()) return vocab.status();
  p.vocab_size = static_cast<int64_t>(*vocab);
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"num_layers", &p.num_layers},
                            {"hidden_size", &p.hidden_size},
                            {"num_kv_heads", &p.num_kv_heads},
                            {"head_dim", &p.head_dim}}) {
    if (m.contains(key) && m[key].is_number_integer()) *field = m[key].get<int64_t>();
  }
  if (j.contains("engine") && j["engine"].is_object()) {
    const Json& en = j["engine"];
    auto kv = Number(en, "kv_bytes_per_token", Str(source, " engine"));
    if (!kv.ok()) return kv.status();
    p.kv_bytes_per_token = static_cast<int64_t>(*kv);
    if (en.contains("max_model_len") && en["max_model_len"].is_number_integer()) {
      p.max_model_len = en["max_model_len"].get<int64_t>();
    }
  } else {
    auto layers = Number(m, "num_layers", m_where);
    auto kv_heads = Number(m, "num_kv_heads", m_where);
    auto head_dim = Number(m, "head_dim", m_where);
    for (const auto* s : {&layers, &kv_heads, &head_dim}) {
      if (!s->ok()) return s->status();
    }
    p.kv_bytes_per_token = static_cast<int64_t>(2 * *layers * *kv_heads * *head_dim * kv_dtype_bytes);
  }
  // The model's own context bounds a request as the real router bounds it (profiles written
  // before it was recorded leave it to the engine section or the KV cache).
  if (m.contains("max_position_embeddings") && m["max_position_embeddings"].is_number_integer() &&
      m["max_position_embeddings"].get<int64_t>() > 0) {
    const int64_t context = m["max_position_embeddings"].get<int64_t>();
    p.max_model_len = p.max_model_len > 0 ? std::min(p.max_model_len, context) : context;
  }
  if (p.kv_bytes_per_token <= 0 || p.vocab_size < 2) {
    return absl::InvalidArgumentError(Str(source, ": KV bytes per token and vocab_size must be positive"));
  }
  return p;
}

absl::Status CheckProfileModel(const SimProfile& profile, const ModelConfig& c) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"vocab_size", {profile.vocab_size, c.vocab_size}},
      {"num_layers", {profile.num_layers, c.num_layers}},
      {"hidden_size", {profile.hidden_size, c.hidden_size}},
      {"num_kv_heads", {profile.num_kv_heads, c.num_kv_heads}},
      {"head_dim", {profile.head_dim, c.head_dim}}};
  for (const auto& [name, v] : fields) {
    if (v.first != 0 && v.first != v.second) {
      return absl::FailedPreconditionError(Str("the profile is of another model: its ", name, " is ", v.first,
                                               ", this model's ", v.second, " (profile '", profile.model, "')"));
    }
  }
  return absl::OkStatus();
}

absl::Status SizeWorkerPool(const SimProfile& profile, int64_t kv_blocks, double kv_memory_gib,
                            const std::string& flag_prefix, SimWorker::Options* w) {
  if (w->block_size < 1) return absl::InvalidArgumentError(Str(flag_prefix, "block-size: must be >= 1"));
  if (kv_blocks <= 0) {
    if (!(kv_memory_gib > 0) || !std::isfinite(kv_memory_gib)) {
      return absl::InvalidArgumentError(Str(flag_prefix, "kv-memory-gib: must be > 0"));
    }
    kv_blocks = static_cast<int64_t>(kv_memory_gib * (1ull << 30) /
                                     static_cast<double>(profile.kv_bytes_per_token * w->block_size));
  }
  w->num_blocks = kv_blocks;
  if (w->max_model_len <= 0) {
    const int64_t holds = kv_blocks * w->block_size;
    w->max_model_len = profile.max_model_len > 0 ? std::min(profile.max_model_len, holds) : holds;
  }
  return absl::OkStatus();
}

std::unique_ptr<RequestSource> ListSource(std::vector<SimRequest> requests) {
  return std::make_unique<VectorSource>(std::move(requests));
}

double LayerStreamDone(double link_free, double step_start, double step_seconds, double bytes,
                       int64_t layers, double bytes_per_second) {
  if (!(bytes_per_second > 0)) return std::max(link_free, step_start + step_seconds);
  const double layers_d = static_cast<double>(std::max<int64_t>(layers, 1));
  const double send = bytes / bytes_per_second;
  // Layer l's share is ready at step_start + (l + 1) * step_seconds / L and leaves after the
  // link is free and the shares before it are sent: the last share leaves at the latest of
  // these, a maximum of terms linear in l, so taken at l = 0 or l = L - 1.
  return std::max({link_free + send, step_start + step_seconds / layers_d + send,
                   step_start + step_seconds + send / layers_d});
}

absl::StatusOr<std::unique_ptr<RequestSource>> OpenTrace(const std::string& path,
                                                          const TraceOptions& options) {
  if (!(options.length_scale > 0) || !(options.time_scale > 0) || !std::isfinite(options.length_scale) ||
      !std::isfinite(options.time_scale)) {
    return absl::InvalidArgumentError("trace: the length and time scales must be finite and > 0");
  }
  if (options.trace_block_tokens < 1 || options.vocab_size < 2 || options.max_requests < 0) {
    return absl::InvalidArgumentError("trace: block tokens >= 1, vocabulary >= 2, max requests >= 0");
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(Str("trace: cannot read '", path, "'"));
  return std::unique_ptr<RequestSource>(new TraceSource(path, std::move(in), options));
}

absl::StatusOr<ClusterResult> SimulateCluster(const SimProfile& profile, const ClusterOptions& options,
                                              RequestSource& source) {
  const SimWorker::Options& w = options.worker;
  if (options.decode_workers < 1 || options.prefill_workers < 0) {
    return absl::InvalidArgumentError("decode workers must be >= 1 and prefill workers >= 0");
  }
  // Bounded before any worker is made: each holds its block manager's state for every block.
  const int64_t workers = options.prefill_workers + options.decode_workers;
  if (workers > kMaxSimWorkers) {
    return absl::InvalidArgumentError(Str("--prefill + --decode: ", workers, " workers, more than ", kMaxSimWorkers,
                                          " (simulate a slice of the cluster: the planner's answer scales)"));
  }
  if (w.num_blocks > kMaxSimBlocks || workers * w.num_blocks > kMaxSimBlocks) {
    return absl::InvalidArgumentError(
        Str(workers, " workers x ", w.num_blocks, " KV blocks each: more than ", kMaxSimBlocks,
            " blocks to simulate (~", kMaxSimBlocks * 32 >> 30, " GiB); fewer workers, --kv-blocks, "
            "--kv-memory-gib or a larger --block-size"));
  }
  // A tier's entries are made as blocks are published (at most the run's distinct blocks), so its
  // capacity costs nothing until used.
  const SimTierOptions& t = options.tiers;
  if (t.host_blocks < 0 || t.disk_blocks < 0 || t.store_blocks < 0 || !(t.host.latency_seconds >= 0) ||
      !(t.disk.latency_seconds >= 0) || !(t.store.latency_seconds >= 0) || !(t.host.bytes_per_second >= 0) ||
      !(t.disk.bytes_per_second >= 0) || !(t.store.bytes_per_second >= 0)) {
    return absl::InvalidArgumentError("KV cache tiers: sizes, latencies and bandwidths must be >= 0");
  }
  if (w.num_blocks < 1 || w.block_size < 1 || w.max_num_seqs < 1 || w.max_num_batched_tokens < 1 ||
      w.max_model_len < 2) {
    return absl::InvalidArgumentError(
        "worker: KV blocks, block size, max_num_seqs and max_num_batched_tokens must be >= 1, "
        "max_model_len >= 2");
  }
  if (w.num_blocks * w.block_size < w.max_model_len) {
    return absl::InvalidArgumentError(Str("worker: ", w.num_blocks, " KV blocks of ", w.block_size,
                                          " tokens cannot hold one max_model_len (", w.max_model_len,
                                          ") sequence"));
  }
  if (!(options.recent_half_life_seconds > 0) || options.local_prefill_tokens < 0) {
    return absl::InvalidArgumentError("recent half-life must be > 0 and local_prefill_tokens >= 0");
  }
  Cluster cluster(profile, options);
  return cluster.Run(source);
}

}  // namespace pdserve
