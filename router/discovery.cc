#include "router/discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/str_split.h"
#include "common/base/log.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr std::string_view kDns = "dns:///";

}  // namespace

Discovery::Discovery(const std::string& spec, std::chrono::milliseconds interval, Update update,
                     Resolver resolver)
    : interval_(interval), update_(std::move(update)), resolver_(std::move(resolver)) {
  for (absl::string_view e : absl::StrSplit(spec, ',', absl::SkipEmpty())) entries_.emplace_back(e);
  bool all_resolved = true;
  last_ = resolver_(entries_, &all_resolved);
  update_(last_);
  const bool dynamic = std::any_of(entries_.begin(), entries_.end(), [](const std::string& e) {
    return e.rfind(kDns, 0) == 0;
  });
  if (dynamic) thread_ = std::thread([this] { Loop(); });
}

Discovery::~Discovery() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> Discovery::Resolve(const std::vector<std::string>& entries,
                                            bool* all_resolved) {
  *all_resolved = true;
  std::vector<std::string> out;
  for (const std::string& e : entries) {
    if (e.rfind(kDns, 0) != 0) {
      out.push_back(e);
      continue;
    }
    const std::string target = e.substr(kDns.size());
    const size_t colon = target.rfind(':');
    if (colon == std::string::npos) {
      PD_LOG(Error) << "discovery: '" << e << "' needs a port (dns:///name:port)";
      *all_resolved = false;
      continue;
    }
    const std::string host = target.substr(0, colon), port = target.substr(colon + 1);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      PD_LOG(Warning) << "discovery: cannot resolve " << host << ": " << gai_strerror(rc);
      *all_resolved = false;
      continue;
    }
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      char ip[INET6_ADDRSTRLEN] = {0};
      if (a->ai_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof(ip));
        out.push_back(Str(ip, ":", port));
      } else if (a->ai_family == AF_INET6) {
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, ip, sizeof(ip));
        out.push_back(Str("[", ip, "]:", port));
      }
    }
    ::freeaddrinfo(res);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void Discovery::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval_, [&] { return stop_; })) {
    lock.unlock();
    bool all_resolved = true;
    std::vector<std::string> now = resolver_(entries_, &all_resolved);
    if (all_resolved && now != last_) {
      last_ = now;
      update_(now);
    }
    lock.lock();
  }
}

}  // namespace pdserve
