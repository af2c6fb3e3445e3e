// Histogram buckets for the quantities pdserve measures (seconds), as vLLM's where it has them so
// that dashboards and autoscalers port over.
#ifndef PDSERVE_COMMON_METRICS_BUCKETS_H_
#define PDSERVE_COMMON_METRICS_BUCKETS_H_

#include <vector>

namespace pdserve::metrics {

// Time to first token: 1 ms to ~43 minutes.
inline const std::vector<double>& TtftBuckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                        0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0,
                                        80.0,  160.0, 640.0, 2560.0};
  return b;
}

// Between two tokens of one request: 0.1 ms to 80 s.
inline const std::vector<double>& TokenLatencyBuckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.075,  0.1,   0.15,   0.2,   0.3,
                                        0.4,    0.5,     0.75,   1.0,   2.5,    5.0,   7.5,
                                        10.0,   20.0,    40.0,   80.0};
  return b;
}

// Whole requests and their phases: 10 ms to ~2 hours.
inline const std::vector<double>& RequestLatencyBuckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,   1.0,   1.5,
                                        2.0,  2.5,   5.0,  10.0, 15.0, 20.0,  30.0,  40.0,
                                        50.0, 60.0,  120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

// One KV transfer: 0.1 ms (a few pages on loopback) to 60 s (a long prompt on TCP).
inline const std::vector<double>& TransferBuckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5,
                                        5.0,    10.0,    30.0,   60.0};
  return b;
}

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_BUCKETS_H_
