// A process's tracer: the sampling ratio and the exporter. Ended spans are queued (bounded) and
// a background thread sends them in batches as OTLP/HTTP protobuf (otlp_encoder.h) to the
// collector. When the collector is slow or gone, spans are dropped and counted; a request never
// waits for tracing. An unreachable collector is logged once, and again once it answers.
#ifndef PDSERVE_COMMON_TRACING_TRACER_H_
#define PDSERVE_COMMON_TRACING_TRACER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tracing/span.h"

namespace pdserve {

struct TracingOptions {
  // The OTLP/HTTP traces URL (http://collector:4318/v1/traces); empty: tracing off.
  std::string endpoint;
  double sample_ratio = 1.0;  // New traces kept; a request's own traceparent decides for it.
  std::vector<SpanAttribute> resource;  // service.name and the like.
  size_t max_queue = 4096;              // Spans waiting for export; past it they are dropped.
  size_t max_batch = 512;
  std::chrono::milliseconds interval{200};  // A partial batch waits at most this long.
  std::chrono::milliseconds timeout{2000};  // Per export request.
};

// The checks that need no connection (the flags' names in the messages).
absl::Status ValidateTracingOptions(const TracingOptions& options);

class Tracer {
 public:
  // Null when options.endpoint is empty.
  static absl::StatusOr<std::unique_ptr<Tracer>> Start(const TracingOptions& options);
  // Sends what is queued within one export timeout (the rest is dropped), then stops.
  ~Tracer();

  bool Sample(const std::array<uint8_t, 16>& trace_id) const;
  void Submit(std::unique_ptr<SpanData> span);
  // Waits until every span submitted before the call was sent or dropped, at most one export
  // timeout in all: past it, what is still queued is dropped (and counted).
  void Flush();

  int64_t exported() const { return exported_.load(); }
  int64_t dropped() const { return dropped_.load(); }

 private:
  explicit Tracer(const TracingOptions& options);
  void Loop();
  // One batch; returns whether the collector took it.
  bool Send(const std::vector<std::unique_ptr<SpanData>>& batch);

  const TracingOptions options_;
  std::string scheme_host_port_, path_;
  uint64_t sample_below_ = 0;  // Sample a trace whose id's last 8 bytes are below this.
  bool sample_all_ = true;

  std::mutex mu_;
  std::condition_variable wake_, flushed_;
  std::deque<std::unique_ptr<SpanData>> queue_;
  uint64_t submitted_ = 0, handled_ = 0;  // Spans queued and spans sent or dropped since start.
  bool stop_ = false;
  bool flush_ = false;
  // When a flush or the stop gives up on the spans still queued (max: not now).
  std::chrono::steady_clock::time_point give_up_at_ = std::chrono::steady_clock::time_point::max();
  std::atomic<int64_t> exported_{0}, dropped_{0};
  bool unreachable_ = false;  // Exporter thread: logged as unreachable.
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRACING_TRACER_H_
