#include "router/discovery.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

using std::chrono::milliseconds;

TEST(DiscoveryTest, StaticEntriesPassAndDnsNamesResolveToEveryAddress) {
  bool all = false;
  const auto got = Discovery::Resolve({"10.0.0.7:8200", "dns:///localhost:8300"}, &all);
  EXPECT_TRUE(all);
  EXPECT_NE(std::find(got.begin(), got.end(), "10.0.0.7:8200"), got.end());
  EXPECT_NE(std::find(got.begin(), got.end(), "127.0.0.1:8300"), got.end());
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  Discovery::Resolve({"dns:///no-such-host.invalid:1"}, &all);
  EXPECT_FALSE(all);
  Discovery::Resolve({"dns:///localhost"}, &all);  // No port.
  EXPECT_FALSE(all);
}

// A scripted resolver stands in for a DNS server whose answers change (pods come and go).
TEST(DiscoveryTest, ReResolvesAndIgnoresAFailedResolution) {
  std::mutex mu;
  std::vector<std::string> answer = {"10.0.0.1:1", "10.0.0.2:1"};
  bool failing = false;
  std::atomic<int> calls{0};
  std::vector<std::vector<std::string>> updates;
  auto resolver = [&](const std::vector<std::string>& entries, bool* ok) {
    EXPECT_EQ(entries, std::vector<std::string>{"dns:///workers:1"});
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    *ok = !failing;
    return failing ? std::vector<std::string>{} : answer;
  };
  auto wait_calls = [&](int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (calls.load() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    ASSERT_GE(calls.load(), n) << "the resolver was not called again within 20 s";
  };
  Discovery d("dns:///workers:1", milliseconds(10),
              [&](const std::vector<std::string>& a) {
                std::lock_guard<std::mutex> lock(mu);
                updates.push_back(a);
              },
              resolver);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(updates.size(), 1u);  // Resolved before the constructor returned.
    failing = true;                 // The resolver goes down: nothing may change.
  }
  const int before = calls.load();
  wait_calls(before + 3);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(updates.size(), 1u);
    failing = false;
    answer = {"10.0.0.2:1", "10.0.0.3:1"};  // One pod left, one joined.
  }
  wait_calls(calls.load() + 2);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[1], (std::vector<std::string>{"10.0.0.2:1", "10.0.0.3:1"}));
}

}  // namespace
}  // namespace pdserve
