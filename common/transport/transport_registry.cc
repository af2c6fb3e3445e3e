// The backend registry: names to factories. Adding a backend (ucx, nccl) is one line here and a
// library of its own.
#include "common/base/strings.h"
#include "common/transport/kv_transport.h"
#include "common/transport/local_transport.h"
#include "common/transport/tcp_transport.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(std::string_view backend,
                                                               const KvTransportOptions& options) {
  if (backend == "local") return CreateLocalKvTransport(options);
  if (backend == "tcp") return CreateTcpKvTransport(options);
  return absl::InvalidArgumentError(
      Str("unknown KV transport '", backend, "' (available: local, tcp)"));
}

}  // namespace pdserve
