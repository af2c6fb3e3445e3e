// Fuzzes the HTTP/1.1 request head parser and the chunked body decoder (the bytes come from any
// client on --http-listen and --metrics-listen). No input may crash; an accepted head must satisfy
// what the server relies on; a chunked body decodes the same whether its bytes arrive at once or
// one at a time.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/http/http_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  pdserve::http::HeadLimits limits;
  limits.max_head_bytes = 4096;
  limits.max_headers = 16;
  limits.max_body_bytes = 1 << 20;
  const size_t end = pdserve::http::FindHeadEnd(bytes);
  pdserve::http::HttpRequest req;
  pdserve::http::RequestError error;
  if (!pdserve::http::ParseRequestHead(bytes.substr(0, end == 0 ? size : end), limits, &req,
                                       &error)) {
    if (error.message.empty() || error.status < 400 || error.status > 505) __builtin_trap();
    return 0;
  }
  if (end == 0 || req.content_length > limits.max_body_bytes ||
      req.headers.size() > limits.max_headers ||
      req.target.compare(0, req.path.size(), req.path) != 0 || req.method.empty() ||
      req.minor_version > 9) {
    __builtin_trap();
  }
  for (const auto& [name, value] : req.headers) {
    for (char c : name) {
      if (c >= 'A' && c <= 'Z') __builtin_trap();
    }
    if (!value.empty() && (value.front() == ' ' || value.back() == ' ')) __builtin_trap();
  }
  if (!req.chunked) return 0;
  using pdserve::http::ChunkedDecoder;
  const std::string body_bytes(bytes.substr(end));
  ChunkedDecoder whole(1024);
  std::string in = body_bytes, body;
  pdserve::http::RequestError e1, e2;
  const ChunkedDecoder::Result r1 = whole.Feed(&in, &body, &e1);
  ChunkedDecoder bytewise(1024);
  std::string in2, body2;
  ChunkedDecoder::Result r2 = ChunkedDecoder::Result::kMore;
  for (size_t i = 0; i < body_bytes.size() && r2 == ChunkedDecoder::Result::kMore; ++i) {
    in2 += body_bytes[i];
    r2 = bytewise.Feed(&in2, &body2, &e2);
  }
  if (r1 != r2 || body.size() > 1024) __builtin_trap();
  if (r1 == ChunkedDecoder::Result::kDone && (body != body2 || in2.size() != 0)) __builtin_trap();
  if (r1 == ChunkedDecoder::Result::kError && e1.status != e2.status) __builtin_trap();
  return 0;
}
