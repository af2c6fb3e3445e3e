// The address flags of a command, checked together before anything is loaded: first the syntax
// of every one (InvalidArgument naming the flag: a usage error), then whether each port to listen
// on is free (Unavailable "address A is already in use (--flag)"). Rules: common/base/host_port.h.
#ifndef PDSERVE_CLI_ADDRESS_FLAGS_H_
#define PDSERVE_CLI_ADDRESS_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::cli {

class AddressFlags {
 public:
  // host:port to listen on (port 0: any). An empty value is skipped when `optional`.
  AddressFlags& Listen(const std::string& value, const char* flag, bool optional = false);
  // host:port of one peer (port 1-65535).
  AddressFlags& Peer(const std::string& value, const char* flag);
  // Comma-separated host:port or dns:///name:port entries.
  AddressFlags& Peers(const std::string& value, const char* flag, bool allow_empty);

  absl::Status Check() const;

 private:
  enum class Kind { kListen, kPeer, kPeers, kPeersOrEmpty };
  struct Entry {
    std::string value;
    const char* flag;
    Kind kind;
  };
  std::vector<Entry> entries_;
};

// The exit code for a failed Check(): 2 for a malformed address, 1 for a port in use.
int AddressExitCode(const absl::Status& status);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_ADDRESS_FLAGS_H_
