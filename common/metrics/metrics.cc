#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "common/base/check.h"

namespace pdserve::metrics {

void Counter::Inc(double v) {
  if (v > 0) value_.fetch_add(v, std::memory_order_relaxed);
}

void Counter::SetTotal(double total) {
  double cur = value_.load(std::memory_order_relaxed);
  while (total > cur && !value_.compare_exchange_weak(cur, total, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  PD_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  // Bucket i counts bounds[i-1] < v <= bounds[i] ("le" is inclusive).
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                       bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  char buf[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

const char* TypeName(Type t) {
  switch (t) {
    case Type::kCounter: return "counter";
    case Type::kGauge: return "gauge";
    case Type::kHistogram: return "histogram";
  }
  return "untyped";
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} (with an extra label, e.g. le, when given); empty when there are no labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     const char* extra_name = nullptr, const std::string& extra_value = "") {
  if (names.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i] + "=\"" + EscapeLabelValue(values[i]) + "\"";
  }
  if (extra_name != nullptr) {
    if (!names.empty()) out += ',';
    out += std::string(extra_name) + "=\"" + extra_value + "\"";
  }
  return out + "}";
}

void Header(const FamilyBase& f, const std::string& name, std::string* out) {
  *out += "# HELP " + name + " " + EscapeHelp(f.help()) + "\n";
  *out += "# TYPE " + name + " " + TypeName(f.type()) + "\n";
}

}  // namespace

template <typename T>
T& Family<T>::With(const std::vector<std::string>& values) {
  PD_CHECK_MSG(values.size() == label_names().size(), name().c_str());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(values);
  if (it != children_.end()) return *it->second;
  std::unique_ptr<T> child;
  if constexpr (std::is_same_v<T, Histogram>) {
    child = std::make_unique<Histogram>(bounds_);
  } else {
    child = std::make_unique<T>();
  }
  return *children_.emplace(values, std::move(child)).first->second;
}

template <typename T>
void Family<T>::Remove(const std::vector<std::string>& values) {
  std::lock_guard<std::mutex> lock(mu_);
  children_.erase(values);
}

template <typename T>
void Family<T>::Render(const std::string& name, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  // HELP and TYPE even before the first series (a reason that has not happened yet): a scraper
  // knows the family, and a check for it reads 0 instead of not finding it (as Prometheus'
  // own client libraries render a labelled family without children).
  Header(*this, name, out);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = child->snapshot();
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        *out += name + "_bucket" + LabelSet(label_names(), values, "le", FormatValue(s.bounds[i])) +
                " " + std::to_string(s.cumulative[i]) + "\n";
      }
      *out += name + "_bucket" + LabelSet(label_names(), values, "le", "+Inf") + " " +
              std::to_string(s.count) + "\n";
      *out += name + "_sum" + LabelSet(label_names(), values) + " " + FormatValue(s.sum) + "\n";
      *out += name + "_count" + LabelSet(label_names(), values) + " " + std::to_string(s.count) + "\n";
    } else {
      *out += name + LabelSet(label_names(), values) + " " + FormatValue(child->value()) + "\n";
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

FamilyBase* Registry::Find(const std::string& name, Type type, const std::vector<std::string>& labels) {
  auto it = families_.find(name);
  if (it == families_.end()) return nullptr;
  PD_CHECK_MSG(it->second->type() == type && it->second->label_names() == labels, name.c_str());
  return it->second.get();
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      const std::vector<std::string>& labels,
                                      const std::string& vllm_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FamilyBase* f = Find(name, Type::kCounter, labels)) return *static_cast<Family<Counter>*>(f);
  auto f = std::make_unique<Family<Counter>>(name, help, Type::kCounter, labels, vllm_name);
  return *static_cast<Family<Counter>*>((families_[name] = std::move(f)).get());
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& labels,
                                  const std::string& vllm_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FamilyBase* f = Find(name, Type::kGauge, labels)) return *static_cast<Family<Gauge>*>(f);
  auto f = std::make_unique<Family<Gauge>>(name, help, Type::kGauge, labels, vllm_name);
  return *static_cast<Family<Gauge>*>((families_[name] = std::move(f)).get());
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          const std::vector<std::string>& labels,
                                          const std::vector<double>& bounds,
                                          const std::string& vllm_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FamilyBase* f = Find(name, Type::kHistogram, labels)) {
    return *static_cast<Family<Histogram>*>(f);
  }
  auto f = std::make_unique<Family<Histogram>>(name, help, Type::kHistogram, labels, vllm_name,
                                               bounds);
  return *static_cast<Family<Histogram>*>((families_[name] = std::move(f)).get());
}

int Registry::AddCollector(std::function<void()> collect) {
  std::lock_guard<std::mutex> lock(collectors_mu_);
  const int id = next_collector_++;
  collectors_[id] = std::move(collect);
  return id;
}

void Registry::RemoveCollector(int id) {
  std::lock_guard<std::mutex> lock(collectors_mu_);
  collectors_.erase(id);
}

std::string Registry::Render(const RenderOptions& options) const {
  {
    // Holding the lock while collecting: RemoveCollector waits for a scrape in progress, so a
    // collector never runs on a component that is going away.
    std::lock_guard<std::mutex> lock(collectors_mu_);
    for (const auto& [id, collect] : collectors_) collect();
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, family] : families_) family->Render(name, &out);
  if (options.vllm_compat) {
    std::map<std::string, const FamilyBase*> compat;
    for (const auto& [name, family] : families_) {
      if (!family->vllm_name().empty()) compat[family->vllm_name()] = family.get();
    }
    for (const auto& [name, family] : compat) family->Render(name, &out);
  }
  return out;
}

std::vector<std::string> Registry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, family] : families_) out.push_back(name);
  return out;
}

CollectorHandle::CollectorHandle(Registry* registry, std::function<void()> collect)
    : registry_(registry) {
  if (registry_ != nullptr) id_ = registry_->AddCollector(std::move(collect));
}

CollectorHandle& CollectorHandle::operator=(CollectorHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    id_ = other.id_;
    other.registry_ = nullptr;
    other.id_ = 0;
  }
  return *this;
}

void CollectorHandle::Reset() {
  if (registry_ != nullptr) registry_->RemoveCollector(id_);
  registry_ = nullptr;
  id_ = 0;
}

}  // namespace pdserve::metrics
