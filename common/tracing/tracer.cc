#include "common/tracing/tracer.h"

#include <algorithm>

#include <httplib.h>

#include <cmath>

#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/tracing/otlp_encoder.h"

namespace pdserve {

absl::Status ValidateTracingOptions(const TracingOptions& o) {
  if (!(o.sample_ratio >= 0 && o.sample_ratio <= 1)) {
    return absl::InvalidArgumentError(
        Str("--trace-sample-ratio: must be in [0, 1], not ", o.sample_ratio));
  }
  if (o.endpoint.empty()) return absl::OkStatus();
  const bool http = o.endpoint.rfind("http://", 0) == 0, https = o.endpoint.rfind("https://", 0) == 0;
  const size_t host = o.endpoint.find("://") + 3;
  if ((!http && !https) || host >= o.endpoint.size() || o.endpoint[host] == '/') {
    return absl::InvalidArgumentError(
        Str("--otlp-traces-endpoint: '", o.endpoint,
            "' is not an http:// or https:// URL (OTLP/HTTP, e.g. http://collector:4318/v1/traces)"));
  }
  return absl::OkStatus();
}

Tracer::Tracer(const TracingOptions& options) : options_(options) {
  const size_t host = options_.endpoint.find("://") + 3;
  const size_t slash = options_.endpoint.find('/', host);
  scheme_host_port_ = options_.endpoint.substr(0, slash);
  path_ = slash == std::string::npos ? "/v1/traces" : options_.endpoint.substr(slash);
  // As OpenTelemetry's TraceIdRatioBased sampler: a trace whose id's last 8 bytes (big-endian)
  // are below ratio * 2^64 is kept (ratio 1: every trace; 2^64 itself is not a uint64).
  sample_all_ = options_.sample_ratio >= 1;
  if (!sample_all_) sample_below_ = static_cast<uint64_t>(std::ldexp(options_.sample_ratio, 64));
}

absl::StatusOr<std::unique_ptr<Tracer>> Tracer::Start(const TracingOptions& options) {
  if (absl::Status s = ValidateTracingOptions(options); !s.ok()) return s;
  if (options.endpoint.empty()) return std::unique_ptr<Tracer>();
  std::unique_ptr<Tracer> t(new Tracer(options));
  t->thread_ = std::thread([raw = t.get()] { raw->Loop(); });
  return t;
}

Tracer::~Tracer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // What is still queued goes within one export timeout, whatever the collector does.
    give_up_at_ = std::chrono::steady_clock::now() + options_.timeout;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Tracer::Sample(const std::array<uint8_t, 16>& trace_id) const {
  if (sample_all_) return true;
  uint64_t low = 0;
  for (int i = 8; i < 16; ++i) low = (low << 8) | trace_id[i];
  return low < sample_below_;
}

void Tracer::Submit(std::unique_ptr<SpanData> span) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++submitted_;
    if (queue_.size() >= options_.max_queue || stop_) {
      ++handled_;
      dropped_.fetch_add(1);
      return;
    }
    queue_.push_back(std::move(span));
    if (queue_.size() < options_.max_batch) return;
  }
  wake_.notify_one();
}

void Tracer::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  flush_ = true;
  // One deadline for the whole flush (a stalled collector took 2 s a batch, 16 s at shutdown):
  // past it the spans still queued are dropped, and counted.
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  give_up_at_ = std::min(give_up_at_, deadline);
  wake_.notify_one();
  flushed_.wait_until(lock, deadline, [&] { return handled_ >= target || stop_; });
}

void Tracer::Loop() {
  std::vector<std::unique_ptr<SpanData>> batch;
  for (;;) {
    bool stop;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A full batch, a flush or a stop goes at once; a partial one after the interval.
      wake_.wait_for(lock, options_.interval, [&] {
        return stop_ || flush_ || queue_.size() >= options_.max_batch;
      });
      if (queue_.empty()) flush_ = false;
      stop = stop_;
      if (std::chrono::steady_clock::now() >= give_up_at_) {
        // A flush or the stop is past its deadline: what is queued is dropped, not sent.
        dropped_.fetch_add(static_cast<int64_t>(queue_.size()));
        handled_ += queue_.size();
        queue_.clear();
        flush_ = false;
        if (!stop_) give_up_at_ = std::chrono::steady_clock::time_point::max();
      }
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (!batch.empty()) {
      const bool sent = Send(batch);
      (sent ? exported_ : dropped_).fetch_add(static_cast<int64_t>(batch.size()));
      std::lock_guard<std::mutex> lock(mu_);
      handled_ += batch.size();
      batch.clear();
    }
    flushed_.notify_all();
    if (stop) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
    }
  }
}

bool Tracer::Send(const std::vector<std::unique_ptr<SpanData>>& batch) {
  httplib::Client client(scheme_host_port_);
  const auto seconds = [](std::chrono::milliseconds ms) {
    return std::pair<time_t, time_t>(ms.count() / 1000, (ms.count() % 1000) * 1000);
  };
  const auto [s, us] = seconds(options_.timeout);
  client.set_connection_timeout(s, us);
  client.set_read_timeout(s, us);
  client.set_write_timeout(s, us);
  const std::string body = EncodeOtlpTraces(options_.resource, batch);
  httplib::Result r = client.Post(path_, body, "application/x-protobuf");
  const bool ok = r && r->status >= 200 && r->status < 300;
  if (!ok && !unreachable_) {
    unreachable_ = true;
    PD_LOG(Warning) << "tracing: the OTLP collector at " << options_.endpoint << " did not take "
                    << batch.size() << " spans ("
                    << (r ? Str("HTTP ", r->status) : httplib::to_string(r.error()))
                    << "); spans are dropped (pdserve_trace_spans_dropped_total) until it does";
  } else if (ok && unreachable_) {
    unreachable_ = false;
    PD_LOG(Info) << "tracing: the OTLP collector at " << options_.endpoint << " takes spans again";
  }
  return ok;
}

}  // namespace pdserve
