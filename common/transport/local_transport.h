// The `local` backend: both workers in one process (`pdserve serve`, tests). Submit copies pages
// straight into the peer's pool with memcpy; endpoints are "local://N" in a process-wide registry.
#ifndef PDSERVE_COMMON_TRANSPORT_LOCAL_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_LOCAL_TRANSPORT_H_

#include <memory>

#include "common/transport/kv_transport.h"

namespace pdserve {

std::unique_ptr<KvTransport> CreateLocalKvTransport(const KvTransportOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_LOCAL_TRANSPORT_H_
