// Spans: what one step of a request did, when, with which attributes, ready for OTLP.
//
// A Span is a handle on the span being recorded: it ends when End() is called or it is
// destroyed, and then goes to its Tracer's exporter. A default Span, or one of a trace that is
// not sampled, records nothing (every call is a cheap no-op) but still has the context to pass
// downstream, so that the next process follows the same sampling decision.
#ifndef PDSERVE_COMMON_TRACING_SPAN_H_
#define PDSERVE_COMMON_TRACING_SPAN_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/tracing/trace_context.h"

namespace pdserve {

class Tracer;

enum class SpanKind : int { kInternal = 1, kServer = 2, kClient = 3, kProducer = 4 };

struct SpanAttribute {
  std::string key;
  std::variant<std::string, int64_t, double, bool, std::vector<std::string>> value;
};

struct SpanEvent {
  uint64_t time_ns = 0;
  std::string name;
  std::vector<SpanAttribute> attributes;
};

struct SpanData {
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};
  std::array<uint8_t, 8> parent_span_id{};  // All zero: a root span.
  std::string tracestate;
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  uint64_t start_ns = 0, end_ns = 0;  // Unix time.
  std::vector<SpanAttribute> attributes;
  std::vector<SpanEvent> events;
  bool error = false;
  std::string status_message;
};

uint64_t UnixNanos();

class Span {
 public:
  Span() = default;
  Span(Span&& other) noexcept = default;
  Span& operator=(Span&& other) noexcept;
  ~Span() { End(); }

  // A span of `tracer` (null: a Span that does nothing) under `parent`: a valid parent is
  // followed (its sampled flag decides); an invalid one starts a new trace that `tracer`
  // samples by its ratio.
  static Span Start(Tracer* tracer, std::string_view name, SpanKind kind,
                    const TraceContext& parent);
  // Under the parent a W3C traceparent header names (malformed or empty: a new trace).
  static Span FromHeaders(Tracer* tracer, std::string_view name, SpanKind kind,
                          std::string_view traceparent, std::string_view tracestate);

  Span Child(std::string_view name, SpanKind kind = SpanKind::kInternal) const;

  bool recording() const { return data_ != nullptr; }
  // The context to send downstream (invalid without a tracer).
  const TraceContext& context() const { return context_; }
  std::string traceparent() const;

  void Set(std::string_view key, std::string value);
  void Set(std::string_view key, const char* value) { Set(key, std::string(value)); }
  void Set(std::string_view key, int64_t value);
  void Set(std::string_view key, int value) { Set(key, static_cast<int64_t>(value)); }
  void Set(std::string_view key, double value);
  void Set(std::string_view key, bool value);
  void Set(std::string_view key, std::vector<std::string> value);
  void AddEvent(std::string_view name, std::vector<SpanAttribute> attributes = {});
  void SetError(std::string_view message);
  void End();

 private:
  Tracer* tracer_ = nullptr;
  TraceContext context_;
  std::unique_ptr<SpanData> data_;  // Null: not recording.
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRACING_SPAN_H_
