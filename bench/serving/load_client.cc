#include "bench/serving/load_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

RequestResult RunOne(v1::Generation::Stub* stub, const BenchRequest& request, int64_t index,
                     int64_t output_tokens, double timeout_seconds) {
  RequestResult out;
  out.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  v1::GenerateRequest r;
  r.set_request_id(Str("bench-", index));
  r.mutable_token_ids()->mutable_ids()->Assign(request.prompt.begin(), request.prompt.end());
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(static_cast<int32_t>(output_tokens));
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  const auto start = Clock::now();
  Clock::time_point first, last;
  auto reader = stub->Generate(&ctx, r);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.token_ids_size() > 0) {
      if (out.completion_tokens == 0) first = Clock::now();
      last = Clock::now();
      out.completion_tokens += response.token_ids_size();
    }
    if (response.has_usage()) out.cached_tokens = response.usage().cached_tokens();
  }
  out.status = FromGrpcStatus(reader->Finish());
  if (out.status.ok() && out.completion_tokens == 0) {
    out.status = absl::InternalError("the stream ended without tokens");
  }
  if (out.status.ok()) {
    out.ttft_seconds = Since(start, first);
    if (out.completion_tokens > 1) {
      out.tpot_seconds = Since(first, last) / static_cast<double>(out.completion_tokens - 1);
    }
  }
  return out;
}

}  // namespace

LoadRun RunLoad(const std::string& server, const std::vector<BenchRequest>& requests,
                int64_t output_tokens, double timeout_seconds) {
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  LoadRun run;
  run.results.resize(requests.size());
  std::vector<std::thread> threads;
  threads.reserve(requests.size());
  const auto start = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<int64_t>(
                                              requests[i].arrival_seconds * 1e6)));
    threads.emplace_back([&, i] {
      run.results[i] = RunOne(stub.get(), requests[i], static_cast<int64_t>(i), output_tokens,
                              timeout_seconds);
    });
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

LoadSummary Summarize(const LoadRun& run) {
  LoadSummary s;
  std::vector<double> ttft, tpot;
  int64_t prompt = 0, cached = 0, completion = 0;
  for (const RequestResult& r : run.results) {
    if (!r.status.ok()) {
      if (s.failed++ == 0) s.first_error = r.status.ToString();
      continue;
    }
    ++s.ok;
    ttft.push_back(r.ttft_seconds);
    if (r.completion_tokens > 1) tpot.push_back(r.tpot_seconds);
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    completion += r.completion_tokens;
  }
  s.hit_rate = prompt > 0 ? static_cast<double>(cached) / static_cast<double>(prompt) : 0;
  s.ttft_p50 = Percentile(ttft, 50);
  s.ttft_p90 = Percentile(ttft, 90);
  s.tpot_p50 = Percentile(tpot, 50);
  s.tpot_p90 = Percentile(tpot, 90);
  if (run.wall_seconds > 0) {
    s.requests_per_second = static_cast<double>(s.ok) / run.wall_seconds;
    s.output_tokens_per_second = static_cast<double>(completion) / run.wall_seconds;
  }
  return s;
}

}  // namespace pdserve
