#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/tracing/otlp_encoder.h"
#include "common/tracing/span.h"
#include "common/tracing/trace_context.h"
#include "common/tracing/tracer.h"

namespace pdserve {
namespace {

TEST(Traceparent, ParsesTheSpecificationsExampleAndFormatsItBack) {
  const std::string h = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  auto c = ParseTraceparent(h);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(HexId(c->trace_id.data(), 16), "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(HexId(c->span_id.data(), 8), "b7ad6b7169203331");
  EXPECT_TRUE(c->sampled());
  EXPECT_EQ(FormatTraceparent(*c), h);
  // A later version may add fields: its first four are read.
  EXPECT_TRUE(ParseTraceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-extra"));
}

TEST(Traceparent, MalformedHeadersAreRefused) {
  for (const char* bad : {
           "",
           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",    // short flags
           "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",   // upper case
           "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // version ff
           "00-00000000000000000000000000000000-b7ad6b7169203331-01",   // zero trace id
           "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   // zero span id
           "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // separator
           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",  // version 00 has 4 fields
           "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",   // not hex
       }) {
    EXPECT_FALSE(ParseTraceparent(bad).has_value()) << bad;
  }
}

// A collector that keeps the bodies it was sent.
class Collector {
 public:
  Collector() {
    server_.Post("/v1/traces", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(req.body);
      types_.push_back(req.get_header_value("Content-Type"));
      res.status = 200;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Collector() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1/traces"; }
  std::vector<std::string> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }
  std::vector<std::string> types() {
    std::lock_guard<std::mutex> lock(mu_);
    return types_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> bodies_, types_;
};

TEST(Tracer, SampledSpansReachTheCollectorAndChildrenFollowTheirParent) {
  Collector collector;
  TracingOptions o;
  o.endpoint = collector.url();
  o.resource = {{"service.name", std::string("pdserve-test")}};
  auto tracer = Tracer::Start(o);
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  {
    Span root = Span::FromHeaders(tracer->get(), "root", SpanKind::kServer,
                                  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v");
    ASSERT_TRUE(root.recording());
    EXPECT_EQ(HexId(root.context().trace_id.data(), 16), "0af7651916cd43dd8448eb211c80319c");
    EXPECT_EQ(root.context().tracestate, "k=v");
    Span child = root.Child("child", SpanKind::kClient);
    child.Set("gen_ai.usage.output_tokens", int64_t{7});
    child.AddEvent("first_token");
    EXPECT_EQ(child.context().trace_id, root.context().trace_id);
    EXPECT_NE(child.context().span_id, root.context().span_id);
    // The header a child sends downstream names the child.
    EXPECT_EQ(ParseTraceparent(child.traceparent())->span_id, child.context().span_id);
  }
  (*tracer)->Flush();
  EXPECT_EQ((*tracer)->exported(), 2);
  EXPECT_EQ((*tracer)->dropped(), 0);
  const auto bodies = collector.bodies();
  ASSERT_FALSE(bodies.empty());
  EXPECT_EQ(collector.types()[0], "application/x-protobuf");
  std::string all;
  for (const std::string& b : bodies) all += b;
  for (const char* s : {"root", "child", "first_token", "gen_ai.usage.output_tokens", "pdserve-test", "k=v"}) {
    EXPECT_NE(all.find(s), std::string::npos) << s;
  }
}

TEST(Tracer, AnUnsampledTraceRecordsNothingButStillPropagates) {
  Collector collector;
  TracingOptions o;
  o.endpoint = collector.url();
  o.sample_ratio = 0;
  auto tracer = Tracer::Start(o);
  ASSERT_TRUE(tracer.ok());
  Span root = Span::Start(tracer->get(), "root", SpanKind::kServer, TraceContext{});
  EXPECT_FALSE(root.recording());
  ASSERT_TRUE(root.context().valid());
  EXPECT_FALSE(root.context().sampled());
  Span child = root.Child("child");
  EXPECT_FALSE(child.recording());
  EXPECT_EQ(child.context().trace_id, root.context().trace_id);
  // A caller's sampled traceparent wins over the ratio.
  Span theirs = Span::FromHeaders(tracer->get(), "x", SpanKind::kServer,
                                  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "");
  EXPECT_TRUE(theirs.recording());
  // Without a tracer: nothing, and no context.
  Span none = Span::Start(nullptr, "x", SpanKind::kServer, TraceContext{});
  EXPECT_FALSE(none.recording());
  EXPECT_EQ(none.traceparent(), "");
}

TEST(Tracer, AGoneCollectorDropsAndCountsWithoutBlocking) {
  TracingOptions o;
  {
    httplib::Server probe;  // A port nobody listens on any more.
    const int port = probe.bind_to_any_port("127.0.0.1");
    o.endpoint = "http://127.0.0.1:" + std::to_string(port) + "/v1/traces";
  }
  o.max_queue = 8;
  o.timeout = std::chrono::milliseconds(200);
  auto tracer = Tracer::Start(o);
  ASSERT_TRUE(tracer.ok());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) Span::Start(tracer->get(), "s", SpanKind::kInternal, TraceContext{});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  // The flush gives up after one export timeout; the batch then in flight is counted once its
  // request fails (within its own timeouts).
  const auto flush_start = std::chrono::steady_clock::now();
  (*tracer)->Flush();
  EXPECT_LT(std::chrono::steady_clock::now() - flush_start, std::chrono::milliseconds(400));
  for (int i = 0; i < 200 && (*tracer)->dropped() < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*tracer)->exported(), 0);
  EXPECT_EQ((*tracer)->dropped(), 100);
}

TEST(Tracer, BadOptionsNameTheFlag) {
  TracingOptions o;
  o.endpoint = "collector:4318";
  EXPECT_NE(Tracer::Start(o).status().message().find("--otlp-traces-endpoint"), std::string::npos);
  o.endpoint = "http://c:4318";
  o.sample_ratio = 1.5;
  EXPECT_NE(Tracer::Start(o).status().message().find("--trace-sample-ratio"), std::string::npos);
  o.endpoint.clear();
  o.sample_ratio = 1;
  EXPECT_EQ(Tracer::Start(o).value(), nullptr);
}

}  // namespace
}  // namespace pdserve
