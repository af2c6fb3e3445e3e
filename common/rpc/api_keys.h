// API keys on the public API: `authorization: Bearer <key>` metadata, compared in constant time
// against every configured key. Keys come from a file (one per line; blank lines and lines
// starting with # are ignored) and/or an environment variable (comma-separated). Keys are never
// logged.
#ifndef PDSERVE_COMMON_RPC_API_KEYS_H_
#define PDSERVE_COMMON_RPC_API_KEYS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class ServerContextBase;
}

namespace pdserve {

class ApiKeys {
 public:
  ApiKeys() = default;  // No keys: every caller is let in.
  // `file` may be empty; `env_value` is the variable's value (may be empty). InvalidArgument
  // naming the flag when the file cannot be read or holds no key.
  static absl::StatusOr<ApiKeys> Load(const std::string& file, std::string_view env_value);

  bool enabled() const { return !keys_.empty(); }
  // OK, or Unauthenticated (missing, malformed or unknown key; the message never echoes it).
  absl::Status Check(const grpc::ServerContextBase& context) const;
  // The same for an Authorization header's value (null: no header), from gRPC metadata or HTTP.
  // The scheme is case-insensitive, as HTTP's are ("Bearer", "bearer").
  absl::Status CheckAuthorization(const std::string_view* value) const;
  // The comparison itself (time independent of where the strings differ).
  bool Matches(std::string_view presented) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_API_KEYS_H_
