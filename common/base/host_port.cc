#include "common/base/host_port.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr std::string_view kDnsScheme = "dns:///";

bool IsHostChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

bool IsIpv6Char(char c) {
  return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.' || c == '%';
}

}  // namespace

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return Str("[", host, "]:", port);
  return Str(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view text, std::string_view flag, PortUse use) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(Str(flag, ": '", text, "' ", why));
  };
  HostPort out;
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("has an unclosed '[' (IPv6: [::1]:8000)");
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("needs a port: host:port, e.g. [::1]:8000");
    port = rest.substr(1);
    if (host.empty() || !std::all_of(host.begin(), host.end(), IsIpv6Char) ||
        host.find(':') == std::string_view::npos) {
      return bad("is not a bracketed IPv6 address");
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("needs a port: host:port, e.g. 127.0.0.1:8000");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return bad("is not host:port (an IPv6 host goes in brackets: [::1]:8000)");
    }
    if (host.empty()) return bad("has no host (0.0.0.0:PORT listens on every interface)");
    if (!std::all_of(host.begin(), host.end(), IsHostChar)) return bad("has a malformed host");
  }
  if (port.empty()) return bad("needs a port after ':'");
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      })) {
    return bad("has a port that is not a number from 0 to 65535");
  }
  out.port = std::stoi(std::string(port));
  const int lowest = use == PortUse::kListen ? 0 : 1;
  if (out.port < lowest || out.port > 65535) {
    return bad(use == PortUse::kListen ? "has a port outside 0-65535"
                                       : "has a port outside 1-65535");
  }
  out.host = std::string(host);
  return out;
}

absl::Status ValidateHost(std::string_view host, std::string_view flag) {
  in6_addr v6;
  const bool ok = host.find(':') != std::string_view::npos
                      ? ::inet_pton(AF_INET6, std::string(host).c_str(), &v6) == 1
                      : !host.empty() && std::all_of(host.begin(), host.end(), IsHostChar);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      Str(flag, ": '", host, "' must be a host name or an IP address, without a port"));
}

absl::Status ValidatePeerList(std::string_view text, std::string_view flag, bool allow_empty) {
  int count = 0;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    const std::string_view entry(piece.data(), piece.size());
    if (entry.empty()) {
      if (text.empty()) break;
      return absl::InvalidArgumentError(Str(flag, ": '", text, "' has an empty entry"));
    }
    ++count;
    std::string_view address = entry;
    if (address.rfind(kDnsScheme, 0) == 0) address.remove_prefix(kDnsScheme.size());
    if (auto parsed = ParseHostPort(address, flag, PortUse::kPeer); !parsed.ok()) {
      return parsed.status();
    }
  }
  if (count == 0 && !allow_empty) {
    return absl::InvalidArgumentError(Str(flag, ": at least one host:port is required"));
  }
  return absl::OkStatus();
}

absl::Status CheckListenAddressFree(const HostPort& listen, std::string_view flag) {
  if (listen.port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(listen.port);
  if (int rc = ::getaddrinfo(listen.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(Str("cannot listen on ", listen.ToString(), " (", flag,
                                      "): ", gai_strerror(rc)));
  }
  absl::Status status;
  int bound = 0;
  for (addrinfo* a = res; a != nullptr && status.ok(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR as the servers set it (a port in TIME_WAIT is free); no SO_REUSEPORT.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ++bound;
    } else if (errno == EADDRINUSE) {
      status = absl::UnavailableError(Str("address ", listen.ToString(), " is already in use (",
                                          flag, ")"));
    } else if (errno != EADDRNOTAVAIL && errno != EAFNOSUPPORT) {
      status = absl::UnavailableError(Str("cannot listen on ", listen.ToString(), " (", flag,
                                          "): ", std::strerror(errno)));
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (status.ok() && bound == 0) {
    return absl::UnavailableError(Str("cannot listen on ", listen.ToString(), " (", flag,
                                      "): no such address on this host"));
  }
  return status;
}

}  // namespace pdserve
