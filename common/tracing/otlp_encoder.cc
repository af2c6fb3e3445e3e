#include "common/tracing/otlp_encoder.h"

#include <cstring>

namespace pdserve {
namespace {

// Protobuf's wire format: tag = field << 3 | wire type; 0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32.
class Writer {
 public:
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void Tag(int field, int type) { Varint(static_cast<uint64_t>(field) << 3 | type); }
  void UintField(int field, uint64_t v) {
    Tag(field, 0);
    Varint(v);
  }
  void Fixed64Field(int field, uint64_t v) {
    Tag(field, 1);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void DoubleField(int field, double d) {
    uint64_t v;
    std::memcpy(&v, &d, sizeof v);
    Fixed64Field(field, v);
  }
  void BytesField(int field, std::string_view b) {
    Tag(field, 2);
    Varint(b.size());
    out_.append(b);
  }
  void MessageField(int field, const Writer& m) { BytesField(field, m.out_); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

template <size_t N>
std::string_view IdBytes(const std::array<uint8_t, N>& id) {
  return std::string_view(reinterpret_cast<const char*>(id.data()), N);
}

// common.v1.AnyValue: string 1, bool 2, int 3, double 4, array 5 (ArrayValue: values 1).
Writer AnyValue(const SpanAttribute& a) {
  Writer v;
  if (const auto* s = std::get_if<std::string>(&a.value)) {
    v.BytesField(1, *s);
  } else if (const auto* b = std::get_if<bool>(&a.value)) {
    v.UintField(2, *b ? 1 : 0);
  } else if (const auto* i = std::get_if<int64_t>(&a.value)) {
    v.UintField(3, static_cast<uint64_t>(*i));
  } else if (const auto* d = std::get_if<double>(&a.value)) {
    v.DoubleField(4, *d);
  } else if (const auto* list = std::get_if<std::vector<std::string>>(&a.value)) {
    Writer array;
    for (const std::string& s : *list) {
      Writer item;
      item.BytesField(1, s);
      array.MessageField(1, item);
    }
    v.MessageField(5, array);
  }
  return v;
}

// common.v1.KeyValue: key 1, value 2.
void Attributes(int field, const std::vector<SpanAttribute>& attributes, Writer* out) {
  for (const SpanAttribute& a : attributes) {
    Writer kv;
    kv.BytesField(1, a.key);
    kv.MessageField(2, AnyValue(a));
    out->MessageField(field, kv);
  }
}

// trace.v1.Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
// start 7, end 8 (fixed64), attributes 9, events 11 (Event: time 1 fixed64, name 2,
// attributes 3), status 15 (Status: message 2, code 3: 1 ok, 2 error).
Writer EncodeSpan(const SpanData& s) {
  Writer w;
  w.BytesField(1, IdBytes(s.trace_id));
  w.BytesField(2, IdBytes(s.span_id));
  if (!s.tracestate.empty()) w.BytesField(3, s.tracestate);
  bool root = true;
  for (uint8_t b : s.parent_span_id) root &= b == 0;
  if (!root) w.BytesField(4, IdBytes(s.parent_span_id));
  w.BytesField(5, s.name);
  w.UintField(6, static_cast<uint64_t>(s.kind));
  w.Fixed64Field(7, s.start_ns);
  w.Fixed64Field(8, s.end_ns);
  Attributes(9, s.attributes, &w);
  for (const SpanEvent& e : s.events) {
    Writer ev;
    ev.Fixed64Field(1, e.time_ns);
    ev.BytesField(2, e.name);
    Attributes(3, e.attributes, &ev);
    w.MessageField(11, ev);
  }
  Writer status;
  if (s.error) {
    status.BytesField(2, s.status_message);
    status.UintField(3, 2);
  }
  w.MessageField(15, status);
  return w;
}

}  // namespace

std::string EncodeOtlpTraces(const std::vector<SpanAttribute>& resource,
                             const std::vector<std::unique_ptr<SpanData>>& spans) {
  Writer scope;  // common.v1.InstrumentationScope: name 1.
  scope.BytesField(1, "pdserve");
  Writer scope_spans;  // trace.v1.ScopeSpans: scope 1, spans 2.
  scope_spans.MessageField(1, scope);
  for (const auto& s : spans) scope_spans.MessageField(2, EncodeSpan(*s));
  Writer res;  // resource.v1.Resource: attributes 1.
  Attributes(1, resource, &res);
  Writer resource_spans;  // trace.v1.ResourceSpans: resource 1, scope_spans 2.
  resource_spans.MessageField(1, res);
  resource_spans.MessageField(2, scope_spans);
  Writer request;  // ExportTraceServiceRequest: resource_spans 1.
  request.MessageField(1, resource_spans);
  return std::move(request.str());
}

}  // namespace pdserve
