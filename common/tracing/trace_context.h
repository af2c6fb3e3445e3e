// W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` header a request
// carries between processes, "00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>", and
// `tracestate`, passed on unchanged.
#ifndef PDSERVE_COMMON_TRACING_TRACE_CONTEXT_H_
#define PDSERVE_COMMON_TRACING_TRACE_CONTEXT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pdserve {

struct TraceContext {
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};
  uint8_t flags = 0;  // Bit 0: sampled.
  std::string tracestate;

  // A context to propagate (a non-zero trace id and span id).
  bool valid() const;
  bool sampled() const { return (flags & 1) != 0; }
};

// The context a traceparent header names, or nullopt when it is malformed (wrong length or
// separators, upper-case or non-hex digits, version ff, an all-zero trace or span id): the
// request then starts a new trace, as the specification says. A future version's header is read
// by its first four fields.
std::optional<TraceContext> ParseTraceparent(std::string_view header);
std::string FormatTraceparent(const TraceContext& context);

// Lower-case hex of an id.
std::string HexId(const uint8_t* bytes, size_t n);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRACING_TRACE_CONTEXT_H_
