// Comparing two workers' KV layouts ("key=value;key=value", see KvTransportOptions::layout).
#ifndef PDSERVE_COMMON_TRANSPORT_LAYOUT_CHECK_H_
#define PDSERVE_COMMON_TRANSPORT_LAYOUT_CHECK_H_

#include <string_view>

#include "absl/status/status.h"

namespace pdserve {

// OK when equal; FailedPrecondition naming the first differing key and both values otherwise.
absl::Status CheckLayouts(std::string_view mine, std::string_view theirs);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_LAYOUT_CHECK_H_
