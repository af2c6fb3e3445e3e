// `pdserve router`'s online planner flags (planner/online_planner.h): --planner-profile turns it on.
#ifndef PDSERVE_CLI_PLANNER_FLAGS_H_
#define PDSERVE_CLI_PLANNER_FLAGS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "planner/online_planner.h"
#include "router/routing_policy.h"

namespace pdserve::cli {

struct PlannerFlags {
  std::string profile;
  OnlinePlannerOptions options;
  double kv_memory_gib = 4;
  int64_t kv_blocks = 0;

  void Register(FlagSet& flags);
  // nullopt when --planner-profile is not given. block_size and policy: the router's.
  absl::StatusOr<std::optional<OnlinePlannerOptions>> ToOptions(int64_t block_size, RoutingPolicy policy) const;
};

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_PLANNER_FLAGS_H_
