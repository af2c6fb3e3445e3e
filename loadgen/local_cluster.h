// A pdserve cluster on this machine for `pdserve bench --compare-policies`: prefill and decode
// workers and a router, each a child process of the given pdserve binary (the bench passes
// /proc/self/exe), on loopback with ports picked by the OS. Each child's stdout and stderr go to
// files in a temporary directory; a child is up once it printed its "ready:" line.
#ifndef PDSERVE_LOADGEN_LOCAL_CLUSTER_H_
#define PDSERVE_LOADGEN_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

// One child process. The destructor stops it (SIGTERM, then SIGKILL after 30 s).
class ChildProcess {
 public:
  // Starts `binary args...` and waits up to `timeout_seconds` for its ready line.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::string& binary,
                                                             const std::vector<std::string>& args,
                                                             const std::string& log_dir,
                                                             double timeout_seconds);
  ~ChildProcess();
  // What the ready line announced: key=value pairs ("grpc", "transport").
  const std::map<std::string, std::string>& addresses() const { return addresses_; }
  const std::string& grpc() const { return addresses_.at("grpc"); }
  // SIGTERM and wait; the exit code (128 + signal when killed).
  int Stop();
  // The command line and the end of its stderr, for error messages.
  std::string Describe() const;

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  std::string name_;
  std::string command_;
  std::string err_path_;
  std::map<std::string, std::string> addresses_;
};

struct LocalClusterOptions {
  std::string binary;  // pdserve
  std::string model;
  int64_t prefill = 2;
  int64_t decode = 3;
  std::vector<std::string> worker_args;  // Engine flags for every worker.
  std::vector<std::string> decode_args;
  std::vector<std::string> router_args;  // e.g. --policy round_robin
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();
  const std::string& router() const { return router_->grpc(); }
  // Stops the router, then the workers; an error naming each one that did not exit 0.
  absl::Status Stop();

 private:
  LocalCluster() = default;
  std::string log_dir_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::unique_ptr<ChildProcess> router_;
};

}  // namespace pdserve

#endif  // PDSERVE_LOADGEN_LOCAL_CLUSTER_H_
