#include "common/tracing/span.h"

#include <chrono>
#include <random>

#include "common/tracing/tracer.h"

namespace pdserve {
namespace {

template <size_t N>
std::array<uint8_t, N> RandomId() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(UnixNanos()) ^
                                   reinterpret_cast<uintptr_t>(&rng));
  std::array<uint8_t, N> id{};
  for (;;) {
    for (size_t i = 0; i < N; i += 8) {
      const uint64_t r = rng();
      for (size_t j = 0; j < 8 && i + j < N; ++j) id[i + j] = static_cast<uint8_t>(r >> (8 * j));
    }
    for (uint8_t b : id) {
      if (b != 0) return id;  // All zero is the invalid id.
    }
  }
}

}  // namespace

uint64_t UnixNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

Span& Span::operator=(Span&& other) noexcept {
  if (this != &other) {
    End();
    tracer_ = other.tracer_;
    context_ = std::move(other.context_);
    data_ = std::move(other.data_);
  }
  return *this;
}

Span Span::Start(Tracer* tracer, std::string_view name, SpanKind kind, const TraceContext& parent) {
  Span s;
  if (tracer == nullptr) return s;
  s.tracer_ = tracer;
  const bool root = !parent.valid();
  s.context_.trace_id = root ? RandomId<16>() : parent.trace_id;
  s.context_.span_id = RandomId<8>();
  s.context_.tracestate = root ? "" : parent.tracestate;
  const bool sampled = root ? tracer->Sample(s.context_.trace_id) : parent.sampled();
  s.context_.flags = static_cast<uint8_t>((root ? 0 : parent.flags & ~1) | (sampled ? 1 : 0));
  if (!sampled) return s;
  s.data_ = std::make_unique<SpanData>();
  s.data_->trace_id = s.context_.trace_id;
  s.data_->span_id = s.context_.span_id;
  if (!root) s.data_->parent_span_id = parent.span_id;
  s.data_->tracestate = s.context_.tracestate;
  s.data_->name = std::string(name);
  s.data_->kind = kind;
  s.data_->start_ns = UnixNanos();
  return s;
}

Span Span::FromHeaders(Tracer* tracer, std::string_view name, SpanKind kind,
                       std::string_view traceparent, std::string_view tracestate) {
  TraceContext parent;
  if (std::optional<TraceContext> p = ParseTraceparent(traceparent)) {
    parent = *p;
    parent.tracestate = std::string(tracestate);
  }
  return Start(tracer, name, kind, parent);
}

Span Span::Child(std::string_view name, SpanKind kind) const {
  if (tracer_ == nullptr) return Span();
  return Start(tracer_, name, kind, context_);
}

std::string Span::traceparent() const {
  return context_.valid() ? FormatTraceparent(context_) : std::string();
}

void Span::Set(std::string_view key, std::string value) {
  if (data_) data_->attributes.push_back({std::string(key), std::move(value)});
}
void Span::Set(std::string_view key, int64_t value) {
  if (data_) data_->attributes.push_back({std::string(key), value});
}
void Span::Set(std::string_view key, double value) {
  if (data_) data_->attributes.push_back({std::string(key), value});
}
void Span::Set(std::string_view key, bool value) {
  if (data_) data_->attributes.push_back({std::string(key), value});
}
void Span::Set(std::string_view key, std::vector<std::string> value) {
  if (data_) data_->attributes.push_back({std::string(key), std::move(value)});
}

void Span::AddEvent(std::string_view name, std::vector<SpanAttribute> attributes) {
  if (data_) data_->events.push_back({UnixNanos(), std::string(name), std::move(attributes)});
}

void Span::SetError(std::string_view message) {
  if (!data_) return;
  data_->error = true;
  data_->status_message = std::string(message);
}

void Span::End() {
  if (!data_) return;
  data_->end_ns = UnixNanos();
  tracer_->Submit(std::move(data_));
}

}  // namespace pdserve
