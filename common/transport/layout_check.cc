#include "common/transport/layout_check.h"

#include <map>
#include <string>

#include "common/base/strings.h"

namespace pdserve {
namespace {

std::map<std::string, std::string> Fields(std::string_view s) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(';', pos);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view item = s.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq != std::string_view::npos) out[std::string(item.substr(0, eq))] = item.substr(eq + 1);
    pos = end + 1;
  }
  return out;
}

}  // namespace

absl::Status CheckLayouts(std::string_view mine, std::string_view theirs) {
  if (mine == theirs) return absl::OkStatus();
  const auto a = Fields(mine), b = Fields(theirs);
  for (const auto& [key, value] : a) {
    auto it = b.find(key);
    const std::string other = it == b.end() ? "<missing>" : it->second;
    if (other != value) {
      return absl::FailedPreconditionError(Str("KV layout mismatch: ", key, " is ", value,
                                               " here but ", other, " on the peer"));
    }
  }
  for (const auto& [key, value] : b) {
    if (!a.contains(key)) {
      return absl::FailedPreconditionError(
          Str("KV layout mismatch: the peer has ", key, "=", value, ", this worker has none"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve
