// A distribution of durations in constant memory, for the simulator's summary: exact count and
// mean, percentiles by load_client's nearest-rank rule read from buckets at most 0.2% wide (each
// power of two split in 512 by the double's leading mantissa bits; the value reported is the
// bucket's middle, clamped to the smallest and largest value seen), so a simulation of millions
// of tokens keeps no per-token record.
#ifndef PDSERVE_PLANNER_LATENCY_HISTOGRAM_H_
#define PDSERVE_PLANNER_LATENCY_HISTOGRAM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pdserve {

class LatencyHistogram {
 public:
  // Values below kMin seconds share the first bucket, above kMax the last.
  static constexpr double kMin = 0x1p-24, kMax = 0x1p20;  // ~60 ns and ~12 days.

  void Add(double seconds) {
    // A decode step gives every running request the same gap: runs of one bucket are counted in
    // a register and added when the bucket changes (one increment in memory per run, where each
    // value's increment waited on the one before).
    if (buckets_.empty()) buckets_.assign(static_cast<size_t>(Bucket(kMax)) + 1, 0);
    const int64_t b = Bucket(seconds);
    if (b != run_bucket_) {
      Flush();
      run_bucket_ = b;
    }
    ++run_count_;
    ++count_;
    sum_ += seconds;
    min_ = count_ == 1 ? seconds : std::min(min_, seconds);
    max_ = count_ == 1 ? seconds : std::max(max_, seconds);
  }
  int64_t count() const { return count_; }
  double mean() const { return count_ > 0 ? sum_ / static_cast<double>(count_) : 0; }
  // Nearest rank: the ceil(p / 100 * count)-th smallest value (0 when empty).
  double Percentile(double p) const {
    if (count_ == 0) return 0;
    const double rank = std::clamp(std::ceil(p / 100.0 * static_cast<double>(count_)), 1.0,
                                   static_cast<double>(count_));
    int64_t seen = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      seen += buckets_[b] + (static_cast<int64_t>(b) == run_bucket_ ? run_count_ : 0);
      if (static_cast<double>(seen) >= rank) {
        // Bucket b covers [2^e (1 + f / 512), 2^e (1 + (f + 1) / 512)) of the scaled value.
        const int64_t e = static_cast<int64_t>(b) / kSplit, f = static_cast<int64_t>(b) % kSplit;
        const double mid = std::ldexp(1.0 + (static_cast<double>(f) + 0.5) / kSplit, static_cast<int>(e)) * kMin;
        return std::clamp(mid, min_, max_);
      }
    }
    return max_;
  }

 private:
  static constexpr int64_t kSplit = 512;
  void Flush() {
    if (run_count_ == 0) return;
    buckets_[static_cast<size_t>(run_bucket_)] += run_count_;
    run_count_ = 0;
  }
  static int64_t Bucket(double seconds) {
    const double x = std::clamp(seconds, kMin, kMax) / kMin;  // [1, 2^44]
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const int64_t e = static_cast<int64_t>(bits >> 52) - 1023;
    const int64_t f = static_cast<int64_t>((bits >> (52 - 9)) & (kSplit - 1));
    return e * kSplit + f;
  }

  std::vector<int64_t> buckets_;  // Allocated by the first Add.
  int64_t run_bucket_ = -1, run_count_ = 0;  // The current run, not yet in buckets_.
  int64_t count_ = 0;
  double sum_ = 0, min_ = 0, max_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_LATENCY_HISTOGRAM_H_
