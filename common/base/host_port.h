// Addresses given on the command line: one parser, one set of rules, for every `*-listen` flag
// and every list of peers (--prefill, --decode, --server), so that a typo is a usage error naming
// the flag before anything is loaded, never a silently different port.
#ifndef PDSERVE_COMMON_BASE_HOST_PORT_H_
#define PDSERVE_COMMON_BASE_HOST_PORT_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pdserve {

struct HostPort {
  std::string host;  // Without brackets ("::1", "127.0.0.1", "pdserve-decode").
  int port = 0;
  // host:port, IPv6 hosts in brackets.
  std::string ToString() const;
};

enum class PortUse {
  kListen,  // 0 allowed: the kernel picks a free port.
  kPeer,    // 1..65535.
};

// "host:port" or "[ipv6]:port". The host is a name or IPv4 address ([A-Za-z0-9._-]) or a
// bracketed IPv6 address; the port is decimal. InvalidArgument naming `flag` otherwise (no port,
// port out of range or not a number, empty or malformed host). Pure, thread-safe.
absl::StatusOr<HostPort> ParseHostPort(std::string_view text, std::string_view flag, PortUse use);

// A host alone, as an address flag names one without a port (--transport-advertise): a name or
// IPv4 address ([A-Za-z0-9._-]) or an IPv6 address without brackets. InvalidArgument naming
// `flag` otherwise (empty, a port, a scheme, spaces).
absl::Status ValidateHost(std::string_view host, std::string_view flag);

// A comma-separated list of peers, each host:port or dns:///name:port (a name resolved to many
// addresses). An empty list is allowed only when `allow_empty`. InvalidArgument naming `flag`.
absl::Status ValidatePeerList(std::string_view text, std::string_view flag, bool allow_empty);

// Binds each address `listen` resolves to (without SO_REUSEPORT, closed again at once) so that a
// port another process holds is refused before a server starts: Unavailable "address A is already
// in use (flag)". Port 0 is always free. Other bind failures (an address not on this host) are
// Unavailable naming the flag and the reason.
absl::Status CheckListenAddressFree(const HostPort& listen, std::string_view flag);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_HOST_PORT_H_
