#include "common/http/http_request.h"

#include <gtest/gtest.h>

namespace pdserve::http {
namespace {

struct Parsed {
  bool ok;
  HttpRequest req;
  RequestError error;
};

Parsed Parse(std::string_view head, HeadLimits limits = {}) {
  Parsed p;
  p.ok = ParseRequestHead(head, limits, &p.req, &p.error);
  return p;
}

TEST(ParseRequestHead, ReadsTheRequestLineAndHeaders) {
  const Parsed p = Parse(
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type:  application/json \r\n"
      "Content-Length: 12\r\nX-Empty:\r\n\r\n");
  ASSERT_TRUE(p.ok) << p.error.message;
  EXPECT_EQ(p.req.method, "POST");
  EXPECT_EQ(p.req.target, "/v1/completions?x=1");
  EXPECT_EQ(p.req.path, "/v1/completions");
  EXPECT_EQ(p.req.minor_version, 1);
  EXPECT_EQ(p.req.content_length, 12u);
  EXPECT_TRUE(p.req.keep_alive);
  EXPECT_FALSE(p.req.expect_continue);
  ASSERT_NE(p.req.Header("content-type"), nullptr);
  EXPECT_EQ(*p.req.Header("content-type"), "application/json");
  ASSERT_NE(p.req.Header("x-empty"), nullptr);
  EXPECT_EQ(*p.req.Header("x-empty"), "");
  EXPECT_EQ(p.req.Header("authorization"), nullptr);
}

TEST(ParseRequestHead, KeepAliveFollowsTheVersionAndConnection) {
  EXPECT_FALSE(
      Parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, CLOSE\r\n\r\n").req.keep_alive);
  EXPECT_FALSE(Parse("GET / HTTP/1.0\r\n\r\n").req.keep_alive);  // No Host needed in 1.0.
  EXPECT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").req.keep_alive);
  EXPECT_TRUE(
      Parse("GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n").req.expect_continue);
}

TEST(ParseRequestHead, RefusesWithTheRightStatus) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"GET / HTTP/1.1\r\n\r\n", 400},  // No Host.
      {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
      {"GET / HTTP/1.1 x\r\nHost: a\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400},
      {"GET / HTTX/1.1\r\nHost: a\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01z\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
       "chunked\r\n\r\n",
       501},
      {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
       400},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 17\r\n\r\n", 413},
      {"GET / HTTP/1.1\r\nHost: a\r\n\r\nX", 400},
  };
  HeadLimits limits;
  limits.max_body_bytes = 16;
  for (const auto& [head, status] : cases) {
    const Parsed p = Parse(head, limits);
    EXPECT_FALSE(p.ok) << head;
    EXPECT_EQ(p.error.status, status) << head << ": " << p.error.message;
    EXPECT_FALSE(p.error.message.empty());
  }
  // Equal repeated lengths are one length.
  EXPECT_TRUE(
      Parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n").ok);
}

TEST(ParseRequestHead, BoundsTheHeadAndItsHeaders) {
  HeadLimits limits;
  limits.max_headers = 3;
  limits.max_head_bytes = 100;
  EXPECT_TRUE(Parse("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n", limits).ok);
  Parsed p = Parse("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits);
  EXPECT_EQ(p.error.status, 431);
  p = Parse("GET / HTTP/1.1\r\nHost: a\r\nA: " + std::string(100, 'x') + "\r\n\r\n", limits);
  EXPECT_EQ(p.error.status, 431);
}

TEST(ParseRequestHead, ChunkedBodies) {
  const Parsed p = Parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n");
  ASSERT_TRUE(p.ok) << p.error.message;
  EXPECT_TRUE(p.req.chunked);
  EXPECT_EQ(p.req.content_length, 0u);
}

// Decodes `wire` fed `step` bytes at a time.
struct Decoded {
  ChunkedDecoder::Result result;
  std::string body, rest;
  RequestError error;
};

Decoded Decode(const std::string& wire, size_t step, size_t max_body = 1 << 20) {
  ChunkedDecoder d(max_body);
  Decoded out;
  std::string in;
  out.result = ChunkedDecoder::Result::kMore;
  for (size_t i = 0; i < wire.size() && out.result == ChunkedDecoder::Result::kMore; i += step) {
    in += wire.substr(i, step);
    out.result = d.Feed(&in, &out.body, &out.error);
  }
  out.rest = in;
  return out;
}

TEST(ChunkedDecoder, DecodesWhateverTheSplit) {
  const std::string wire =
      "5\r\nhello\r\n1b; ext=\"x;y\"\r\n, and twenty-six more bytes\r\nA \r\n0123456789\r\n"
      "0\r\nX-Trailer: t\r\n\r\nGET /next";
  for (size_t step : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, wire.size()}) {
    const Decoded d = Decode(wire, step);
    EXPECT_EQ(d.result, ChunkedDecoder::Result::kDone) << step << ": " << d.error.message;
    EXPECT_EQ(d.body, "hello, and twenty-six more bytes0123456789") << step;
    if (step == 1) {
      EXPECT_EQ(d.rest, "");  // Fed a byte at a time, it stopped at the body's end.
    } else if (step == wire.size()) {
      EXPECT_EQ(d.rest, "GET /next");  // What follows is left for the next request.
    }
  }
  EXPECT_EQ(Decode("0\r\n\r\n", 1).result, ChunkedDecoder::Result::kDone);
  // A size line of exactly 1 KiB (an extension pads it) passes, whatever the split; 1 KiB + 1 not.
  const std::string at_bound = "1;" + std::string(1022, 'e') + "\r\nx\r\n0\r\n\r\n";
  const std::string past_bound = "1;" + std::string(1023, 'e') + "\r\nx\r\n0\r\n\r\n";
  for (size_t step : {size_t{1}, at_bound.size()}) {
    EXPECT_EQ(Decode(at_bound, step).body, "x") << step;
    EXPECT_EQ(Decode(past_bound, step).error.status, 400) << step;
  }
}

TEST(ChunkedDecoder, RefusesMalformedAndOversizedBodies) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"x\r\n", 400},
      {"\r\n", 400},
      {"-1\r\n", 400},
      {"1000000000000000\r\n", 400},  // 16 hex digits.
      {"3\r\nabcd\r\n", 400},         // Data longer than announced.
      {"3\r\nabc\n\n", 400},
      {std::string(2000, '1'), 400},  // A size line that never ends.
      {"11\r\n", 413},                // 17 bytes > 16.
      {"8\r\n12345678\r\n9\r\n", 413},
      {"0\r\n" + std::string(9000, 'x'), 431},
  };
  for (const auto& [wire, status] : cases) {
    const Decoded d = Decode(wire, wire.size(), 16);
    EXPECT_EQ(d.result, ChunkedDecoder::Result::kError) << wire.substr(0, 40);
    EXPECT_EQ(d.error.status, status) << wire.substr(0, 40) << ": " << d.error.message;
  }
}

TEST(FindHeadEnd, FindsTheBlankLine) {
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\r\n"), 0u);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\r\n\r\nbody"), 27u);
}

}  // namespace
}  // namespace pdserve::http
