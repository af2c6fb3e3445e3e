// The router's handler: the worker registry (static lists for now), worker choice (round-robin
// for now), request validation and tokenization. router_grpc_service.h serves the public API
// over it. Thread-safe after Create.
#ifndef PDSERVE_ROUTER_ROUTER_H_
#define PDSERVE_ROUTER_ROUTER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model_config.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/tokenizer.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

struct RouterOptions {
  std::string model_dir;  // config.json and tokenizer files; no weights are read.
  std::vector<std::string> prefill;  // host:port of prefill workers (may be empty).
  std::vector<std::string> decode;   // host:port of decode workers (at least one).
  absl::Duration worker_wait = absl::Seconds(60);  // How long Create waits for workers.
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 256;
};

// What the router sends down for one validated request.
struct RoutedRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams params;  // seed resolved
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  std::chrono::system_clock::time_point deadline;
};

class Router {
 public:
  // Loads the model's config and tokenizer, connects to the workers and waits (up to
  // worker_wait) until every one answers GetWorkerInfo with the same model and KV layout.
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);

  // Checks every field and tokenizes; InvalidArgument naming the field and the reason.
  absl::StatusOr<RoutedRequest> Prepare(const v1::GenerateRequest& request,
                                        std::chrono::system_clock::time_point deadline) const;
  // Round-robin choices.
  internal::v1::DecodeWorker::Stub* PickDecode();
  std::string PickPrefill();  // Empty when there is no prefill tier.

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const v1::ModelInfo& model_info() const { return model_info_; }

 private:
  Router() = default;
  RouterOptions options_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<internal::v1::DecodeWorker::Stub>> decode_;
  v1::ModelInfo model_info_;
  std::atomic<uint64_t> next_decode_{0};
  std::atomic<uint64_t> next_prefill_{0};
  std::atomic<uint64_t> next_request_{1};
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTER_H_
