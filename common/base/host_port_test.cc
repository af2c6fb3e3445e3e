#include "common/base/host_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(HostPortTest, ParsesHostsAndPorts) {
  auto a = ParseHostPort("127.0.0.1:8000", "--listen", PortUse::kListen);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8000);
  auto b = ParseHostPort("[::1]:0", "--listen", PortUse::kListen);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_EQ(b->ToString(), "[::1]:0");
  auto c = ParseHostPort("pdserve-decode.default.svc:8200", "--decode", PortUse::kPeer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ToString(), "pdserve-decode.default.svc:8200");
  EXPECT_TRUE(ParseHostPort("0.0.0.0:65535", "--listen", PortUse::kListen).ok());
}

TEST(HostPortTest, RefusesWhatIsNotHostPortNamingTheFlag) {
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:-1",
                          "127.0.0.1:80x", "127.0.0.1: 80", ":8000", "::1:8000", "[::1]",
                          "[::1", "[zz]:80", "a b:80", "127.0.0.1:80:90", "host:0x50", "",
                          "127.0.0.1:000008000"}) {
    auto r = ParseHostPort(bad, "--listen", PortUse::kListen);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--listen"), std::string::npos) << r.status();
  }
  // A peer's port cannot be 0.
  EXPECT_FALSE(ParseHostPort("127.0.0.1:0", "--server", PortUse::kPeer).ok());
}

TEST(HostPortTest, HostsAlone) {
  for (const char* ok : {"10.0.0.7", "pdserve-decode-0.ns.svc", "::1", "fe80::1", "host_1"}) {
    EXPECT_TRUE(ValidateHost(ok, "--transport-advertise").ok()) << ok;
  }
  for (const char* bad : {"", "10.0.0.7:8300", "$(POD_IP)", "tcp://host", "a b", "[::1]", "[::1]:80", "1:2:3:z"}) {
    const absl::Status s = ValidateHost(bad, "--transport-advertise");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--transport-advertise"), absl::string_view::npos) << s;
  }
}

TEST(HostPortTest, PeerLists) {
  EXPECT_TRUE(ValidatePeerList("a:1,b:2,dns:///svc.ns:8200", "--decode", false).ok());
  EXPECT_TRUE(ValidatePeerList("", "--prefill", true).ok());
  for (const char* bad : {"", "a:1,,b:2", "a:1,b", "dns:///svc", "a:99999", "dns:///:80"}) {
    auto s = ValidatePeerList(bad, "--decode", false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--decode"), std::string::npos) << s;
  }
}

TEST(HostPortTest, ATakenPortIsRefusedByName) {
  // Hold a port the way a second server would meet it: bound and listening.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  absl::Status s = CheckListenAddressFree({"127.0.0.1", port}, "--listen");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "address 127.0.0.1:" + std::to_string(port) + " is already in use (--listen)");
  ::close(fd);
  EXPECT_TRUE(CheckListenAddressFree({"127.0.0.1", port}, "--listen").ok());
  EXPECT_TRUE(CheckListenAddressFree({"127.0.0.1", 0}, "--listen").ok());
  // An address this host does not have.
  EXPECT_EQ(CheckListenAddressFree({"192.0.2.1", 8000}, "--listen").code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve
