// Worker discovery: a comma-separated list whose entries are host:port (taken as they are) or
// dns:///name:port (every address the name resolves to, re-resolved periodically: a Kubernetes
// headless service). Calls `update` with the full address list whenever it changes.
#ifndef PDSERVE_ROUTER_DISCOVERY_H_
#define PDSERVE_ROUTER_DISCOVERY_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pdserve {

class Discovery {
 public:
  using Update = std::function<void(const std::vector<std::string>& addresses)>;
  // Maps the entries to addresses; *all_resolved is false when a name failed to resolve.
  using Resolver =
      std::function<std::vector<std::string>(const std::vector<std::string>&, bool* all_resolved)>;
  // Resolves once before returning, then every `interval` on a thread (only when a dns:/// entry
  // is present). A re-resolution in which a name fails (a DNS outage) changes nothing: workers
  // leave when their name stops listing them, not when the resolver is down.
  Discovery(const std::string& spec, std::chrono::milliseconds interval, Update update,
            Resolver resolver = &Discovery::Resolve);
  ~Discovery();

  // host:port for each address of every entry (sorted, unique). Unresolvable names give none.
  static std::vector<std::string> Resolve(const std::vector<std::string>& entries,
                                          bool* all_resolved);

 private:
  void Loop();
  std::vector<std::string> entries_;
  std::chrono::milliseconds interval_;
  Update update_;
  Resolver resolver_;
  std::vector<std::string> last_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_DISCOVERY_H_
