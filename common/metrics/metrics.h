// pdserve's metrics: counters, gauges and histograms with labels, kept in a Registry that renders
// the Prometheus text exposition format 0.0.4. prometheus-cpp is not packaged
// for Debian 12; this is the small subset we need.
//
// Cheap on hot paths: an instrument is a few atomics; look its labelled child up once (Family::With
// takes a lock) and keep the reference. Values that components already count (block usage, queue
// lengths, transfer totals) are not double-bookkept: a collector registered with the Registry
// copies them into gauges and counters just before each scrape.
//
// Thread-safe throughout.
#ifndef PDSERVE_COMMON_METRICS_METRICS_H_
#define PDSERVE_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace pdserve::metrics {

class Counter {
 public:
  void Inc(double v = 1.0);  // v >= 0.
  // Mirrors a total a component keeps itself; never moves the counter backwards.
  void SetTotal(double total);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Inc(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Dec(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: ascending upper bounds; the +Inf bucket is implicit.
  explicit Histogram(const std::vector<double>& bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // Per bound, then +Inf (== count).
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative.
  std::atomic<double> sum_{0};
};

enum class Type { kCounter, kGauge, kHistogram };

// One metric name and its labelled children.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, Type type, std::vector<std::string> label_names,
             std::string vllm_name)
      : name_(std::move(name)), help_(std::move(help)), type_(type),
        label_names_(std::move(label_names)), vllm_name_(std::move(vllm_name)) {}
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::string& vllm_name() const { return vllm_name_; }
  Type type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends this family's samples (HELP and TYPE lines first) under `name`.
  virtual void Render(const std::string& name, std::string* out) const = 0;

 private:
  const std::string name_, help_;
  const Type type_;
  const std::vector<std::string> label_names_;
  const std::string vllm_name_;
};

template <typename T>
class Family : public FamilyBase {
 public:
  Family(std::string name, std::string help, Type type, std::vector<std::string> label_names,
         std::string vllm_name, std::vector<double> bounds = {})
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names),
                   std::move(vllm_name)),
        bounds_(std::move(bounds)) {}

  // The child for these label values (one per label name, in order). The reference stays valid
  // for the registry's lifetime.
  T& With(const std::vector<std::string>& values);
  // Drops a child (a worker that left): its series ends. References to it must be gone.
  void Remove(const std::vector<std::string>& values);
  void Render(const std::string& name, std::string* out) const override;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

struct RenderOptions {
  bool vllm_compat = false;  // Also expose families that have a vLLM name under that name.
};

class Registry {
 public:
  // Get-or-create by name; a second registration must agree on type and labels (else it aborts:
  // a programming error). `vllm_name` is the vLLM metric this one corresponds to, if any.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              const std::vector<std::string>& labels,
                              const std::string& vllm_name = "");
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          const std::vector<std::string>& labels,
                          const std::string& vllm_name = "");
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& labels,
                                  const std::vector<double>& bounds,
                                  const std::string& vllm_name = "");

  // Runs before each Render (to copy component state into gauges and counters). Returns an id for
  // RemoveCollector; a component removes its collector before it goes away.
  int AddCollector(std::function<void()> collect);
  void RemoveCollector(int id);

  std::string Render(const RenderOptions& options = {}) const;
  std::vector<std::string> Names() const;

 private:
  FamilyBase* Find(const std::string& name, Type type, const std::vector<std::string>& labels);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_;
  mutable std::mutex collectors_mu_;
  std::map<int, std::function<void()>> collectors_;
  int next_collector_ = 1;
};

// Removes a collector when it goes out of scope.
class CollectorHandle {
 public:
  CollectorHandle() = default;
  CollectorHandle(Registry* registry, std::function<void()> collect);
  CollectorHandle(CollectorHandle&& other) noexcept { *this = std::move(other); }
  CollectorHandle& operator=(CollectorHandle&& other) noexcept;
  ~CollectorHandle() { Reset(); }
  void Reset();

 private:
  Registry* registry_ = nullptr;
  int id_ = 0;
};

// Formats a sample value as Prometheus does (+Inf, -Inf, NaN, shortest round-trip otherwise).
std::string FormatValue(double v);
// Escapes a label value (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& v);

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_METRICS_H_
