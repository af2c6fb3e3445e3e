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
  EXPECT_FALSE(Parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, CLOSE\r\n\r\n").req.keep_alive);
  EXPECT_FALSE(Parse("GET / HTTP/1.0\r\n\r\n").req.keep_alive);  // No Host needed in 1.0.
  EXPECT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").req.keep_alive);
  EXPECT_TRUE(Parse("GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n").req.expect_continue);
}

TEST(ParseRequestHead, RefusesWithTheRightStatus) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"GET / HTTP/1.1\r\n\r\n", 400},                                        // No Host.
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
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 411},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400},
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
  EXPECT_TRUE(Parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n").ok);
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

TEST(FindHeadEnd, FindsTheBlankLine) {
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\r\n"), 0u);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: a\r\n\r\nbody"), 27u);
}

}  // namespace
}  // namespace pdserve::http
