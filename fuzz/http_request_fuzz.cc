// Fuzzes the HTTP/1.1 request head parser (the bytes come from any client on --http-listen and
// --metrics-listen). No input may crash; an accepted head must satisfy what the server relies on.
#include <cstddef>
#include <cstdint>
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
  if (!pdserve::http::ParseRequestHead(bytes.substr(0, end == 0 ? size : end), limits, &req, &error)) {
    if (error.message.empty() || error.status < 400 || error.status > 505) __builtin_trap();
    return 0;
  }
  if (end == 0 || req.content_length > limits.max_body_bytes || req.headers.size() > limits.max_headers ||
      req.target.compare(0, req.path.size(), req.path) != 0 || req.method.empty() || req.minor_version > 9) {
    __builtin_trap();
  }
  for (const auto& [name, value] : req.headers) {
    for (char c : name) {
      if (c >= 'A' && c <= 'Z') __builtin_trap();
    }
    if (!value.empty() && (value.front() == ' ' || value.back() == ' ')) __builtin_trap();
  }
  return 0;
}
