// Spans as an OTLP ExportTraceServiceRequest in protobuf's wire format (the OTLP/HTTP body,
// Content-Type application/x-protobuf), written directly: opentelemetry-proto's field numbers
// (collector/trace/v1 trace_service, trace/v1 trace, common/v1 common, resource/v1 resource).
// tests/e2e/test_tracing.py decodes it with the protos themselves.
#ifndef PDSERVE_COMMON_TRACING_OTLP_ENCODER_H_
#define PDSERVE_COMMON_TRACING_OTLP_ENCODER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/tracing/span.h"

namespace pdserve {

// One ResourceSpans (the resource's attributes) with one ScopeSpans (scope "pdserve").
std::string EncodeOtlpTraces(const std::vector<SpanAttribute>& resource,
                             const std::vector<std::unique_ptr<SpanData>>& spans);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRACING_OTLP_ENCODER_H_
