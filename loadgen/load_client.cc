#include "loadgen/load_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/host_port.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

RequestResult RunOne(v1::Generation::Stub* stub, const BenchRequest& request, int64_t index,
                     const LoadOptions& options) {
  RequestResult out;
  out.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  v1::GenerateRequest r;
  r.set_request_id(Str("bench-", index));
  r.mutable_token_ids()->mutable_ids()->Assign(request.prompt.begin(), request.prompt.end());
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(static_cast<int32_t>(request.output_tokens));
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000)));
  if (!options.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + options.api_key);
  const auto start = Clock::now();
  Clock::time_point last;
  auto reader = stub->Generate(&ctx, r);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.token_ids_size() > 0) {
      const auto now = Clock::now();
      if (out.completion_tokens == 0) {
        out.ttft_seconds = Since(start, now);
      } else {
        out.itl_seconds.push_back(Since(last, now));
      }
      last = now;
      out.completion_tokens += response.token_ids_size();
    }
    if (response.has_usage()) out.cached_tokens = response.usage().cached_tokens();
  }
  out.status = FromGrpcStatus(reader->Finish());
  out.e2e_seconds = Since(start, Clock::now());
  if (out.status.ok() && out.completion_tokens == 0) {
    out.status = absl::InternalError("the stream ended without tokens");
  }
  return out;
}

// One request through the OpenAI HTTP API, streamed (SSE) with usage.
RequestResult RunOneHttp(const BenchRequest& request, int64_t index, const LoadOptions& options) {
  RequestResult out;
  out.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  auto address = ParseHostPort(options.http_address, "--http-server", PortUse::kPeer);
  if (!address.ok()) {
    out.status = address.status();
    return out;
  }
  httplib::Client client(address->host, address->port);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000));
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  const bool chat = options.endpoint == "openai-chat";
  nlohmann::json body = {{"max_tokens", request.output_tokens}, {"temperature", 0}, {"ignore_eos", true},
                         {"stream", true}, {"stream_options", {{"include_usage", true}}},
                         {"user", Str("bench-", index)}};
  if (chat) {
    // The prompt as text, outside the timed part.
    auto detok = client.Post("/detokenize", headers, nlohmann::json({{"tokens", request.prompt}}).dump(),
                             "application/json");
    if (!detok || detok->status != 200) {
      out.status = absl::UnavailableError(Str("POST /detokenize failed: ", detok ? detok->body : "no response"));
      return out;
    }
    const auto text = nlohmann::json::parse(detok->body, nullptr, false);
    body["messages"] = {{{"role", "user"}, {"content", text.value("prompt", "")}}};
  } else {
    body["prompt"] = request.prompt;
  }
  httplib::Request req;
  req.method = "POST";
  req.path = chat ? "/v1/chat/completions" : "/v1/completions";
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer, error;
  int64_t chunks = 0;
  Clock::time_point last;
  const auto start = Clock::now();
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const auto j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        error = j["error"].value("message", "error event");
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        out.completion_tokens = j["usage"].value("completion_tokens", 0);
        out.prompt_tokens = j["usage"].value("prompt_tokens", out.prompt_tokens);
        if (j["usage"].contains("prompt_tokens_details")) {
          out.cached_tokens = j["usage"]["prompt_tokens_details"].value("cached_tokens", 0);
        }
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const auto& c = j["choices"][0];
      const std::string content = chat ? (c.contains("delta") ? c["delta"].value("content", "") : "") : c.value("text", "");
      if (content.empty()) continue;
      const auto now = Clock::now();
      if (chunks++ == 0) {
        out.ttft_seconds = Since(start, now);
      } else {
        out.itl_seconds.push_back(Since(last, now));
      }
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = client.send(req, res, err);
  out.e2e_seconds = Since(start, Clock::now());
  if (!sent) {
    out.status = absl::UnavailableError(Str("HTTP request failed: ", httplib::to_string(err)));
  } else if (res.status != 200) {
    out.status = absl::UnavailableError(Str("HTTP ", res.status, ": ", res.body));
  } else if (!error.empty()) {
    out.status = absl::UnavailableError(error);
  } else if (chunks == 0 || out.completion_tokens == 0) {
    out.status = absl::InternalError("the stream ended without tokens");
  }
  return out;
}

// Redraws "[#####     ] done/total" on stderr until Stop().
class ProgressBar {
 public:
  ProgressBar(const std::atomic<int64_t>* done, int64_t total) : done_(done), total_(total) {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_; })) Draw();
      Draw();
      std::fputc('\n', stderr);
    });
  }
  ~ProgressBar() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void Draw() const {
    constexpr int kWidth = 40;
    const int64_t done = done_->load();
    const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total_, 1));
    std::fprintf(stderr, "\r[%s%s] %lld/%lld requests", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_));
    std::fflush(stderr);
  }
  const std::atomic<int64_t>* done_;
  const int64_t total_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

double RequestResult::TpotSeconds() const {
  if (completion_tokens <= 1) return 0;
  return (e2e_seconds - ttft_seconds) / static_cast<double>(completion_tokens - 1);
}

LoadRun RunLoad(const std::shared_ptr<grpc::Channel>& channel,
                const std::vector<BenchRequest>& requests, const LoadOptions& options) {
  auto stub = v1::Generation::NewStub(channel);
  LoadRun run;
  run.results.resize(requests.size());
  std::atomic<int64_t> done{0};
  std::unique_ptr<ProgressBar> bar;
  if (options.progress) bar = std::make_unique<ProgressBar>(&done, requests.size());
  std::vector<std::thread> threads;
  std::atomic<size_t> next{0};  // With max_concurrency: the next request a stream takes.
  const auto start = Clock::now();
  auto arrival = [&](size_t i) {
    return start + std::chrono::microseconds(static_cast<int64_t>(requests[i].arrival_seconds * 1e6));
  };
  if (options.max_concurrency > 0) {
    // max_concurrency streams: each takes the next request in arrival order, waits for its
    // arrival time if it is early, and runs it (a late request starts as soon as a stream frees).
    const size_t streams = std::min<size_t>(options.max_concurrency, requests.size());
    threads.reserve(streams);
    for (size_t s = 0; s < streams; ++s) {
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
          std::this_thread::sleep_until(arrival(i));
          run.results[i] = options.endpoint == "grpc"
                               ? RunOne(stub.get(), requests[i], static_cast<int64_t>(i), options)
                               : RunOneHttp(requests[i], static_cast<int64_t>(i), options);
          ++done;
        }
      });
    }
  } else {
    threads.reserve(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      std::this_thread::sleep_until(arrival(i));
      threads.emplace_back([&, i] {
        run.results[i] = options.endpoint == "grpc"
                             ? RunOne(stub.get(), requests[i], static_cast<int64_t>(i), options)
                             : RunOneHttp(requests[i], static_cast<int64_t>(i), options);
        ++done;
      });
    }
  }
  for (std::thread& t : threads) t.join();
  run.wall_seconds = Since(start, Clock::now());
  return run;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t index = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(values.size())));
  return values[index - 1];
}

Distribution Describe(const std::vector<double>& values) {
  Distribution d;
  if (values.empty()) return d;
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  return d;
}

absl::Status ParseSlo(const std::string& text, Slo* slo) {
  *slo = Slo();
  for (absl::string_view item : absl::StrSplit(text, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    double ms = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0) || std::isinf(ms)) {
      return absl::InvalidArgumentError(
          Str("--goodput: '", item, "' is not KEY:MILLISECONDS with a positive number"));
    }
    if (kv[0] == "ttft") {
      slo->ttft_ms = ms;
    } else if (kv[0] == "tpot") {
      slo->tpot_ms = ms;
    } else if (kv[0] == "e2el") {
      slo->e2e_ms = ms;
    } else {
      return absl::InvalidArgumentError(
          Str("--goodput: '", kv[0], "' is not ttft, tpot or e2el"));
    }
  }
  return absl::OkStatus();
}

LoadSummary Summarize(const LoadRun& run, const Slo& slo) {
  LoadSummary s;
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t cached = 0;
  for (const RequestResult& r : run.results) {
    if (!r.status.ok()) {
      if (s.failed++ == 0) s.first_error = r.status.ToString();
      continue;
    }
    ++s.ok;
    ttft.push_back(r.ttft_seconds);
    if (r.completion_tokens > 1) tpot.push_back(r.TpotSeconds());
    itl.insert(itl.end(), r.itl_seconds.begin(), r.itl_seconds.end());
    e2e.push_back(r.e2e_seconds);
    s.prompt_tokens += r.prompt_tokens;
    cached += r.cached_tokens;
    s.completion_tokens += r.completion_tokens;
    const bool good = (slo.ttft_ms <= 0 || r.ttft_seconds * 1e3 <= slo.ttft_ms) &&
                      (slo.tpot_ms <= 0 || r.TpotSeconds() * 1e3 <= slo.tpot_ms) &&
                      (slo.e2e_ms <= 0 || r.e2e_seconds * 1e3 <= slo.e2e_ms);
    if (good && slo.any()) ++s.good;
  }
  s.hit_rate = s.prompt_tokens > 0
                   ? static_cast<double>(cached) / static_cast<double>(s.prompt_tokens)
                   : 0;
  s.ttft = Describe(ttft);
  s.tpot = Describe(tpot);
  s.itl = Describe(itl);
  s.e2e = Describe(e2e);
  s.duration_seconds = run.wall_seconds;
  if (run.wall_seconds > 0) {
    s.requests_per_second = static_cast<double>(s.ok) / run.wall_seconds;
    s.output_tokens_per_second = static_cast<double>(s.completion_tokens) / run.wall_seconds;
    s.total_tokens_per_second =
        static_cast<double>(s.prompt_tokens + s.completion_tokens) / run.wall_seconds;
    s.goodput = static_cast<double>(s.good) / run.wall_seconds;
  }
  return s;
}

}  // namespace pdserve
