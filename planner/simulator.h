// The capacity planner's cluster simulator (issue 40): a discrete-event simulation, on a virtual
// clock, of one router in front of a prefill tier and a decode tier, driving pdserve's own code:
// each worker is a SimWorker (the engine's Scheduler and BlockManager: continuous batching,
// chunked prefill, the prefix cache, preemption, remote-prefill reservations), the router's
// choices are router/routing_policy's ChooseWorker over candidates built as WorkerPool builds
// them, and the local-versus-remote prefill decision is the router's and the decode worker's.
// Only the forward pass is replaced: a step costs what the profile's StepTimeModel predicts for
// its shape, and a prompt's KV pages take latency + bytes / bandwidth to reach the decode worker,
// each layer's share sent as the step computes it (LayerStreamDone), as the prefill worker does.
//
// What a request goes through (as in the real cluster):
//   arrival -> router picks a decode worker (and a prefill worker when the prompt's uncached part
//   exceeds local_prefill_tokens and the prefill tier is not saturated) -> remote: the decode
//   worker reserves the prompt's blocks (refused when its pool is busy: it prefills locally
//   instead), the prefill worker computes the prompt and samples the first token, its pages move,
//   the decode worker joins the request to its batch -> decode to output_tokens.
// Where it departs from the real cluster (each a modelling choice, see bench/RESULTS.md):
//   the router sees every worker's state as of now (the real one sees load reports every ~100 ms
//   and its own recent decisions); each request's pages have a link of their own (the real ones
//   to one decode worker share a connection); RPC and network times besides the KV transfer are
//   not charged; a step costs what the profile measured alone (tiers sharing a machine's cores
//   slow each other).
//
// Memory grows with the requests in flight (prompts and sequences are freed when a request ends),
// not with the run's length: the summary's distributions are histograms (latency_histogram.h).
#ifndef PDSERVE_PLANNER_SIMULATOR_H_
#define PDSERVE_PLANNER_SIMULATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "loadgen/load_client.h"
#include "common/model/model_config.h"
#include "planner/sim_tier.h"
#include "planner/sim_worker.h"
#include "planner/step_time.h"
#include "router/routing_policy.h"

namespace pdserve {

// What the simulator charges, read from a `pdserve profile` file.
struct SimProfile {
  std::string model;      // The profiled model's name.
  bool modelled = false;  // Written from a roofline, not measured.
  StepTimeModel step;
  double transfer_latency_seconds = 0;
  double transfer_bytes_per_second = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;  // 0: not in the profile.
  // The profiled model's shape (0 where the profile does not say), for CheckProfileModel.
  int64_t num_layers = 0, hidden_size = 0, num_kv_heads = 0, head_dim = 0;
};

// Parses a profile ("pdserve-profile-v1"); InvalidArgument naming the key that is missing or bad.
// kv_dtype_bytes: bytes per KV element for profiles that do not record the pool's bytes per token
// (roofline profiles): then 2 x layers x KV heads x head_dim x kv_dtype_bytes.
absl::StatusOr<SimProfile> ParseSimProfile(std::string_view json, std::string_view source,
                                           double kv_dtype_bytes = 2);

// FailedPrecondition naming the first field where the profile's model and `config` differ: a
// profile measured on another model plans for the wrong step costs.
absl::Status CheckProfileModel(const SimProfile& profile, const ModelConfig& config);

// Sizes a simulated worker's KV pool as the real worker sizes its own: `kv_blocks` when > 0,
// else `kv_memory_gib` over the profile's bytes per token and `worker->block_size`; and its
// max_model_len, when not set (<= 0), to the profile's, capped by what the pool holds.
// InvalidArgument naming `flag_prefix` + "kv-memory-gib" when it is not > 0.
absl::Status SizeWorkerPool(const SimProfile& profile, int64_t kv_blocks, double kv_memory_gib,
                            const std::string& flag_prefix, SimWorker::Options* worker);

// When a prefill step's pages have left on a link of `bytes_per_second` (<= 0: instantly) that
// is busy until `link_free`: the step computes its `layers` layers one after another in
// `step_seconds` from `step_start`, and each layer's share of `bytes` is sent once computed
// (PrefillWorker::OnLayer), in order. Overlap hides the transfer behind the compute unless the
// link is the slower of the two.
double LayerStreamDone(double link_free, double step_start, double step_seconds, double bytes,
                       int64_t layers, double bytes_per_second);

struct SimRequest {
  double arrival_seconds = 0;
  std::vector<int32_t> prompt;
  int64_t output_tokens = 1;
};

// Requests in arrival order, one at a time (a trace is read as the clock reaches it).
class RequestSource {
 public:
  virtual ~RequestSource() = default;
  // False at the end. A request out of order or malformed is an error naming it.
  virtual absl::StatusOr<bool> Next(SimRequest* out) = 0;
};

// The requests of a list (loadgen/workload's, for instance).
std::unique_ptr<RequestSource> ListSource(std::vector<SimRequest> requests);

// A Mooncake-format trace (../shared/traces/README.md): one JSON object a line with timestamp
// (ms), input_length, output_length and hash_ids (one id per `trace_block_tokens` tokens of the
// prompt; equal ids at equal positions are a shared prefix). Each id becomes the same run of
// token ids wherever it appears; the tokens past the ids' blocks are the request's own. Lengths
// and blocks are multiplied by length_scale (so 1/32 turns 512-token blocks into 16-token ones,
// a prefix cache block), arrival times by time_scale; at most max_requests (0: all).
struct TraceOptions {
  int64_t trace_block_tokens = 512;
  double length_scale = 1;
  double time_scale = 1;
  int64_t max_requests = 0;
  int64_t vocab_size = 32000;
};
absl::StatusOr<std::unique_ptr<RequestSource>> OpenTrace(const std::string& path,
                                                          const TraceOptions& options);

// What one simulation may hold, checked before it starts (a block's state is ~32 bytes).
inline constexpr int64_t kMaxSimWorkers = 4096;
inline constexpr int64_t kMaxSimBlocks = int64_t{1} << 27;
// A trace line's input or output length, at most (tokens: past any model's context).
inline constexpr int64_t kMaxTraceLength = int64_t{1} << 24;

// KV cache tiers (issue 59): each worker's host memory and disk and one store the cluster shares,
// in blocks (0: none), and what loading from each costs. As the real workers: every block a
// worker publishes is written through to each; a request whose next prompt blocks after the
// pool's prefix are there (host's first, then the disk's, then the store's) has its blocks
// reserved and waits for the load on its worker's I/O thread (one load at a time) before it
// runs. With `load_faster` (--kv-tier-load faster) a run is loaded only when its load, behind
// the loads queued on the I/O thread, ends sooner than computing its tokens would take (the
// profile's prefill cost a token of a full step); otherwise it is computed. Departures: stores cost nothing
// (the real ones run on the same I/O thread); a decode worker's reservation for a remote prefill
// does not load from the tiers first (the real one does, saving transfer bytes, not compute).
struct SimTierOptions {
  int64_t host_blocks = 0;   // Per worker.
  int64_t disk_blocks = 0;   // Per worker.
  int64_t store_blocks = 0;  // Shared.
  SimTierCost host{10e-6, 16e9};     // Pinned host memory, one I/O thread (its check ~17 GB/s).
  bool load_faster = false;
  SimTierCost disk{100e-6, 2e9};     // An NVMe drive.
  SimTierCost store{500e-6, 1.25e9};  // A Redis over 10 Gb/s Ethernet.
};

struct ClusterOptions {
  int64_t prefill_workers = 1;  // 0: every prompt prefilled on its decode worker.
  int64_t decode_workers = 1;
  SimWorker::Options worker;    // Both tiers' engines (next_token is the simulator's).
  RoutingOptions routing;
  SimTierOptions tiers;
  int64_t local_prefill_tokens = 32;  // As the router's and decode workers' flag.
  int64_t prefill_max_waiting = 8;    // As the router's: a tier this queued takes no more.
  double recent_half_life_seconds = 2;
  uint64_t seed = 1;
  Slo slo;  // For the summary's goodput.
  // Keep every request's record (ClusterResult::requests): memory then grows with the run.
  bool keep_requests = false;
};

struct SimWorkerStats {
  std::string tier;  // "prefill" or "decode"
  int64_t steps = 0;
  double busy_seconds = 0;
  double kv_usage_mean = 0;  // Time-weighted over the run.
  double kv_usage_max = 0;
  int64_t preemptions = 0;
  int64_t requests = 0;  // Routed to it.
  int64_t used_blocks_at_end = 0;  // 0 unless a block leaked.
};

struct SimRequestResult {
  bool ok = true;
  std::string error;
  double ttft_seconds = 0, e2e_seconds = 0;
  std::vector<double> itl_seconds;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  bool remote_prefill = false;
};

struct ClusterResult {
  // What `pdserve bench` reports, with its definitions (loadgen/load_client.h: Summarize),
  // over the virtual time from the first arrival to the last token; percentiles from
  // LatencyHistogram (within 0.1%).
  LoadSummary summary;
  std::vector<SimRequestResult> requests;  // In arrival order; with keep_requests only.
  std::vector<SimWorkerStats> workers;     // Prefill workers first.
  double first_arrival_seconds = 0, end_seconds = 0;  // Virtual.
  int64_t local_prefills = 0, remote_prefills = 0, reserve_refusals = 0, guard_fallbacks = 0;
  // KV cache tiers: prompt tokens loaded from each (also counted in summary's cached tokens),
  // the loads, and the blocks each tier evicted for its capacity.
  int64_t host_loaded_tokens = 0, disk_loaded_tokens = 0, store_loaded_tokens = 0, tier_loads = 0;
  int64_t declined_loads = 0;  // Runs the tiers held, computed instead (load_faster).
  int64_t host_evictions = 0, disk_evictions = 0, store_evictions = 0;
  int64_t steps = 0;
  int64_t step_sequences = 0;  // Summed over the steps: / steps is the mean batch.
  int64_t peak_in_flight = 0;
  double wall_seconds = 0;  // What the simulation itself took.
};

// Runs the requests to completion. InvalidArgument for bad options; the source's errors.
absl::StatusOr<ClusterResult> SimulateCluster(const SimProfile& profile, const ClusterOptions& options,
                                              RequestSource& source);

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_SIMULATOR_H_
