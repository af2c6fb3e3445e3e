// TCP plumbing of the transports that talk over sockets (tcp; cuda_ipc's control connection):
// listening with an advertised endpoint, connecting with send/receive timeouts.
#ifndef PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_
#define PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pdserve {

struct ListeningSocket {
  int fd = -1;
  std::string endpoint;  // scheme + advertised host:port
};

// Binds and listens on `address` (host:port, port 0 picks one; the rules of every address
// flag). The endpoint's host is `advertise_host`, else the listen host, or this machine's
// hostname when it listens on every interface.
absl::StatusOr<ListeningSocket> ListenTcp(const std::string& address,
                                          const std::string& advertise_host,
                                          std::string_view scheme);

// "scheme://host:port" -> host (brackets of an IPv6 literal removed).
std::string EndpointHost(std::string_view endpoint);

// Connects to "scheme://host:port" (or host:port). With timeout_ms > 0, a peer that accepts or
// sends nothing for that long fails the write or read (SO_SNDTIMEO / SO_RCVTIMEO).
absl::StatusOr<int> ConnectTcp(std::string_view endpoint, int64_t timeout_ms);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_
