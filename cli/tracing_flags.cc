#include "cli/tracing_flags.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/strings.h"

namespace pdserve::cli {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

void TracingFlags::Register(FlagSet& flags) {
  flags.String("otlp-traces-endpoint", &endpoint,
               "export OpenTelemetry traces as OTLP/HTTP protobuf to this URL (e.g. "
               "http://collector:4318/v1/traces; default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; "
               "empty: tracing off)");
  flags.Double("trace-sample-ratio", &sample_ratio,
               "share of new traces recorded, 0-1 (a request's traceparent decides for itself; "
               "default $OTEL_TRACES_SAMPLER_ARG, else 1)");
}

absl::StatusOr<TracingOptions> TracingFlags::Options(const std::string& role) const {
  TracingOptions o;
  o.endpoint = endpoint;
  if (o.endpoint.empty()) o.endpoint = Env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  if (o.endpoint.empty() && !Env("OTEL_EXPORTER_OTLP_ENDPOINT").empty()) {
    std::string base = Env("OTEL_EXPORTER_OTLP_ENDPOINT");
    while (!base.empty() && base.back() == '/') base.pop_back();
    o.endpoint = base + "/v1/traces";
  }
  if (sample_ratio >= 0) {
    o.sample_ratio = sample_ratio;
  } else if (const std::string sampler = Env("OTEL_TRACES_SAMPLER");
             sampler == "traceidratio" || sampler == "parentbased_traceidratio") {
    double r = 1;
    if (!absl::SimpleAtod(Env("OTEL_TRACES_SAMPLER_ARG"), &r)) {
      return absl::InvalidArgumentError(
          Str("OTEL_TRACES_SAMPLER_ARG: '", Env("OTEL_TRACES_SAMPLER_ARG"), "' is not a ratio"));
    }
    o.sample_ratio = r;
  } else if (sampler == "always_off" || sampler == "parentbased_always_off") {
    o.sample_ratio = 0;
  } else if (sample_ratio != -1) {
    return absl::InvalidArgumentError("--trace-sample-ratio: must be in [0, 1]");
  }
  const std::string service = Env("OTEL_SERVICE_NAME");
  o.resource.push_back({"service.name", service.empty() ? std::string("pdserve") : service});
  if (!role.empty()) o.resource.push_back({"pdserve.role", role});
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) {
    o.resource.push_back({"service.instance.id", Str(host, ":", getpid())});
  }
  for (absl::string_view kv : absl::StrSplit(Env("OTEL_RESOURCE_ATTRIBUTES"), ',', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) continue;
    const std::string key(absl::StripAsciiWhitespace(kv.substr(0, eq)));
    if (key == "service.name" && !service.empty()) continue;  // OTEL_SERVICE_NAME wins.
    bool replaced = false;
    for (SpanAttribute& a : o.resource) {
      if (a.key == key) {
        a.value = std::string(absl::StripAsciiWhitespace(kv.substr(eq + 1)));
        replaced = true;
      }
    }
    if (!replaced) o.resource.push_back({key, std::string(absl::StripAsciiWhitespace(kv.substr(eq + 1)))});
  }
  if (absl::Status s = ValidateTracingOptions(o); !s.ok()) return s;
  return o;
}

absl::StatusOr<StartedTracer> StartTracer(const TracingFlags& flags, const std::string& role,
                                          const std::string& model_name,
                                          metrics::Registry* registry) {
  StartedTracer t;
  auto options = flags.Options(role);
  if (!options.ok()) return options.status();
  auto tracer = Tracer::Start(*options);
  if (!tracer.ok()) return tracer.status();
  t.tracer = std::move(*tracer);
  if (t.tracer != nullptr && registry != nullptr) {
    auto& exported = registry->AddCounter("pdserve_trace_spans_exported_total",
                                          "Spans the OTLP collector took",
                                          {"model_name", "role"}).With({model_name, role});
    auto& dropped = registry->AddCounter(
        "pdserve_trace_spans_dropped_total",
        "Spans dropped: the export queue was full or the collector did not take them",
        {"model_name", "role"}).With({model_name, role});
    Tracer* raw = t.tracer.get();
    metrics::Counter* e = &exported;
    metrics::Counter* d = &dropped;
    t.counters = metrics::CollectorHandle(registry, [raw, e, d] {
      e->SetTotal(static_cast<double>(raw->exported()));
      d->SetTotal(static_cast<double>(raw->dropped()));
    });
  }
  return t;
}

}  // namespace pdserve::cli
