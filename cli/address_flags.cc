#include "cli/address_flags.h"

#include "cli/cli_util.h"
#include "common/base/host_port.h"

namespace pdserve::cli {

AddressFlags& AddressFlags::Listen(const std::string& value, const char* flag, bool optional) {
  if (!(optional && value.empty())) entries_.push_back({value, flag, Kind::kListen});
  return *this;
}

AddressFlags& AddressFlags::Peer(const std::string& value, const char* flag) {
  entries_.push_back({value, flag, Kind::kPeer});
  return *this;
}

AddressFlags& AddressFlags::Peers(const std::string& value, const char* flag, bool allow_empty) {
  entries_.push_back({value, flag, allow_empty ? Kind::kPeersOrEmpty : Kind::kPeers});
  return *this;
}

absl::Status AddressFlags::Check() const {
  std::vector<std::pair<HostPort, const char*>> listen;
  for (const Entry& e : entries_) {
    switch (e.kind) {
      case Kind::kListen: {
        auto parsed = ParseHostPort(e.value, e.flag, PortUse::kListen);
        if (!parsed.ok()) return parsed.status();
        listen.emplace_back(*parsed, e.flag);
        break;
      }
      case Kind::kPeer:
        if (auto parsed = ParseHostPort(e.value, e.flag, PortUse::kPeer); !parsed.ok()) {
          return parsed.status();
        }
        break;
      case Kind::kPeers:
      case Kind::kPeersOrEmpty:
        if (absl::Status s = ValidatePeerList(e.value, e.flag, e.kind == Kind::kPeersOrEmpty);
            !s.ok()) {
          return s;
        }
        break;
    }
  }
  for (const auto& [address, flag] : listen) {
    if (absl::Status s = CheckListenAddressFree(address, flag); !s.ok()) return s;
  }
  return absl::OkStatus();
}

int AddressExitCode(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitError;
}

}  // namespace pdserve::cli
