// The device-pool transport between two transports of this process, with both data paths: the
// IPC one over a shared-memory PoolDevice (TEST INFRASTRUCTURE standing in for GPU memory and CUDA
// IPC) and the NCCL one over a fake communicator (TEST INFRASTRUCTURE standing in for NCCL, which
// needs two GPUs). Pages land in the announced ranges only, checksums of the device hashes, and
// every refusal and failure is a status, never a hang.
#include "common/transport/device_transport.h"

#include "common/transport/fake_communicator.h"
#include "common/transport/ipc_data_path.h"
#include "common/transport/nccl_data_path.h"
#include "common/transport/local_transport.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_replace.h"
#include "common/base/rng.h"
#include "common/base/strings.h"
#include "common/transport/receive_tracker.h"
#include "common/transport/shared_memory_pool_device.h"
#include "common/transport/staging_transport.h"
#include "common/transport/tcp_transport.h"
#include "common/transport/tls_stream.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

constexpr size_t kPoolBytes = 1 << 20;

// The data path of the test being run (the parameter of DeviceTransportTest).
std::string& PathKind() {
  static std::string kind = "cuda_ipc";
  return kind;
}

// A pool of kPoolBytes (shared memory standing in for GPU memory): zeros, or with `seed` bytes
// that are never zero.
std::unique_ptr<SharedPool> PoolOf(uint64_t seed) {
  auto pool = AllocateSharedPool(kPoolBytes);
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (seed != 0) {
    SplitMix64 rng(seed);
    for (size_t i = 0; i < kPoolBytes; ++i) (*pool)->data[i] = static_cast<uint8_t>(rng.Next() | 1);
  }
  return std::move(*pool);
}

struct Side {
  std::unique_ptr<SharedPool> pool;
  std::unique_ptr<KvTransport> transport;
};

Side MakeSide(const std::string& layout = "block_size=16;kv_dtype=bf16", const std::string& device = "0",
              uint64_t seed = 0, const KvTransportTls& tls = {}) {
  Side s;
  s.pool = PoolOf(seed);
  KvTransportOptions o;
  o.listen_address = "127.0.0.1:0";
  o.layout = layout;
  o.send_timeout_ms = 5000;
  o.tls = tls;
  std::unique_ptr<DeviceDataPath> path =
      PathKind() == "nccl"
          ? CreateNcclDataPath(CreateSharedMemoryPoolDevice(device), CreateFakeCommunicatorFactory(), 2000)
          : CreateIpcDataPath(CreateSharedMemoryPoolDevice(device));
  auto t = CreateDeviceKvTransport(o, std::move(path), PathKind());
  EXPECT_TRUE(t.ok()) << t.status();
  s.transport = std::move(*t);
  EXPECT_TRUE(s.transport->RegisterPool(s.pool->data, kPoolBytes).ok());
  return s;
}

absl::StatusOr<TransferStats> FinishAndWait(KvTransport& t, const std::string& peer, uint64_t tag) {
  std::promise<absl::StatusOr<TransferStats>> p;
  auto f = p.get_future();
  t.Finish(peer, tag, [&](absl::StatusOr<TransferStats> s) { p.set_value(std::move(s)); });
  EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "Finish hung";
  return f.get();
}

TransferPoll WaitDone(KvTransport& t, uint64_t tag) {
  for (int i = 0; i < 2000; ++i) {
    TransferPoll p = t.Poll(tag);
    if (p.state != TransferState::kPending) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return t.Poll(tag);
}

class DeviceTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { PathKind() = GetParam(); }
};

TEST_P(DeviceTransportTest, PagesLandInTheAnnouncedRangesAndAreVerified) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 7);
  Side receiver = MakeSide();
  EXPECT_EQ(receiver.transport->endpoint().rfind(GetParam() + "://127.0.0.1:", 0), 0u);
  // Pages of several sizes (one not a multiple of 8) to scattered destinations.
  const std::vector<PageCopy> pages = {{0, 65536, 4096}, {8192, 4096, 4096}, {100000, 300000, 1003},
                                       {500000, 200000, 65536}};
  ASSERT_TRUE(receiver.transport->Expect(1, {{4096, 69632}, {200000, 400000}}).ok());
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 1, {pages.data(), 2}).ok());
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 1, {pages.data() + 2, 2}).ok());
  auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 1);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages, 4);
  EXPECT_EQ(stats->bytes, 4096 + 4096 + 1003 + 65536);
  const TransferPoll poll = receiver.transport->Poll(1);  // Done before the ACK was sent.
  ASSERT_EQ(poll.state, TransferState::kDone) << poll.status;
  EXPECT_EQ(poll.stats.checksum, stats->checksum);
  for (const PageCopy& p : pages) {
    EXPECT_EQ(std::memcmp(receiver.pool->data + p.dst_offset, sender.pool->data + p.src_offset, p.bytes), 0);
  }
  EXPECT_EQ(receiver.pool->data[4095], 0) << "nothing outside the pages";
}

TEST_P(DeviceTransportTest, APageOutsideTheRangesFailsBothSidesAndIsNotWritten) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 8);
  Side receiver = MakeSide();
  ASSERT_TRUE(receiver.transport->Expect(2, {{0, 8192}}).ok());
  const std::vector<PageCopy> pages = {{0, 0, 4096}, {4096, 500000, 4096}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 2, pages).ok());
  auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 2);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("refused transfer 2"), std::string::npos) << stats.status();
  const TransferPoll poll = receiver.transport->Poll(2);
  EXPECT_EQ(poll.state, TransferState::kFailed);
  for (size_t i = 500000; i < 504096; ++i) ASSERT_EQ(receiver.pool->data[i], 0);
}

TEST_P(DeviceTransportTest, ACorruptedCopyIsCaughtByTheDeviceChecksums) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 9);
  Side receiver = MakeSide();
  ASSERT_TRUE(receiver.transport->Expect(3, {{0, kPoolBytes}}).ok());
  SetCorruptKvPageForTesting(2);
  const std::vector<PageCopy> pages = {{0, 0, 4096}, {4096, 4096, 4096}, {8192, 8192, 4096}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 3, pages).ok());
  auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 3);
  SetCorruptKvPageForTesting(0);
  ASSERT_FALSE(stats.ok());
  const TransferPoll poll = receiver.transport->Poll(3);
  EXPECT_EQ(poll.state, TransferState::kFailed);
  EXPECT_NE(std::string(poll.status.message()).find("checksum mismatch"), std::string::npos) << poll.status;
}

TEST_P(DeviceTransportTest, AnotherLayoutOrDeviceIsRefusedNamingBoth) {
  Side receiver = MakeSide("block_size=16;kv_dtype=bf16", "0");
  Side other_layout = MakeSide("block_size=16;kv_dtype=int8", "0");
  const std::vector<PageCopy> pages = {{0, 0, 64}};
  absl::Status s = other_layout.transport->Submit(receiver.transport->endpoint(), 4, pages);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("kv_dtype"), std::string::npos) << s;
  Side other_device = MakeSide("block_size=16;kv_dtype=bf16", "1");
  s = other_device.transport->Submit(receiver.transport->endpoint(), 4, pages);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("host-shm:0 here but host-shm:1 on the peer"), std::string::npos) << s;
}

TEST_P(DeviceTransportTest, AbortFailsTheReceiversTransfer) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 10);
  Side receiver = MakeSide();
  ASSERT_TRUE(receiver.transport->Expect(5, {{0, kPoolBytes}}).ok());
  const std::vector<PageCopy> pages = {{0, 0, 4096}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 5, pages).ok());
  sender.transport->Abort(receiver.transport->endpoint(), 5);
  const TransferPoll poll = WaitDone(*receiver.transport, 5);
  EXPECT_EQ(poll.state, TransferState::kFailed);
  EXPECT_EQ(poll.status.code(), absl::StatusCode::kAborted) << poll.status;
}

TEST_P(DeviceTransportTest, ALostReceiverIsAnErrorNotAHang) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 11);
  std::string endpoint;
  {
    Side receiver = MakeSide();
    endpoint = receiver.transport->endpoint();
    ASSERT_TRUE(receiver.transport->Expect(6, {{0, kPoolBytes}}).ok());
    const std::vector<PageCopy> pages = {{0, 0, 4096}};
    ASSERT_TRUE(sender.transport->Submit(endpoint, 6, pages).ok());
  }
  auto stats = FinishAndWait(*sender.transport, endpoint, 6);
  EXPECT_FALSE(stats.ok());
  const std::vector<PageCopy> outside = {{kPoolBytes - 10, 0, 64}};
  EXPECT_EQ(sender.transport->Submit(endpoint, 7, outside).code(), absl::StatusCode::kOutOfRange);
}

TEST_P(DeviceTransportTest, AnUnknownTagIsRefusedAtItsEnd) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 12);
  Side receiver = MakeSide();
  const std::vector<PageCopy> pages = {{0, 0, 4096}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 99, pages).ok());
  auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 99);
  ASSERT_FALSE(stats.ok());
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(receiver.pool->data[i], 0);
}

// A refused page keeps the data path in step: the next transfer on the same connection works
// (the NCCL receiver skips the refused page's bytes).
TEST_P(DeviceTransportTest, AfterARefusedTransferTheNextOneOnTheConnectionWorks) {
  Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 14);
  Side receiver = MakeSide();
  ASSERT_TRUE(receiver.transport->Expect(30, {{0, 4096}}).ok());
  const std::vector<PageCopy> bad = {{0, 0, 4096}, {4096, 65536, 4096}, {8192, 4096 * 3, 1000}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 30, bad).ok());
  EXPECT_FALSE(FinishAndWait(*sender.transport, receiver.transport->endpoint(), 30).ok());
  ASSERT_TRUE(receiver.transport->Expect(31, {{131072, 262144}}).ok());
  const std::vector<PageCopy> good = {{16384, 131072, 4096}, {20480, 200000, 777}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 31, good).ok());
  auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 31);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(receiver.transport->Poll(31).state, TransferState::kDone);
  EXPECT_EQ(std::memcmp(receiver.pool->data + 131072, sender.pool->data + 16384, 4096), 0);
  EXPECT_EQ(std::memcmp(receiver.pool->data + 200000, sender.pool->data + 20480, 777), 0);
  for (size_t i = 65536; i < 65536 + 4096; ++i) ASSERT_EQ(receiver.pool->data[i], 0);
}

// A sender that goes away mid-transfer fails the receiver's transfer; nothing waits forever.
TEST_P(DeviceTransportTest, ALostSenderFailsTheTransferNotAHang) {
  Side receiver = MakeSide();
  ASSERT_TRUE(receiver.transport->Expect(32, {{0, kPoolBytes}}).ok());
  {
    Side sender = MakeSide("block_size=16;kv_dtype=bf16", "0", 15);
    const std::vector<PageCopy> pages = {{0, 0, 4096}};
    ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 32, pages).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const TransferPoll poll = WaitDone(*receiver.transport, 32);
  EXPECT_EQ(poll.state, TransferState::kFailed);
}

// Certificates made by the openssl command (as tests/e2e/test_security.py makes them): the
// tiers' CA and a leaf it signed ("node"), and an intruder's leaf signed by another CA. Empty when
// the command is missing.
const std::string& CertDir() {
  struct Dir {
    std::string path;
    ~Dir() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir{[]() -> std::string {
    const char* root = std::getenv("TEST_TMPDIR");
    std::string tmpl = Str(root != nullptr ? root : "/tmp", "/pdserve_certs_XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) return "";
    const std::string d = tmpl;
    const std::string script = Str(
        "set -e; cd ", d, "; o() { openssl \"$@\" >/dev/null 2>&1; };",
        "for ca in ca rogue; do o req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1",
        " -nodes -keyout $ca.key -out $ca.pem -days 2 -subj /CN=$ca; done;",
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > leaf.ext;",
        "for leaf in node:ca intruder:rogue; do n=${leaf%:*}; ca=${leaf#*:};",
        " o req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $n.key",
        " -out $n.csr -subj /CN=$n;",
        " o x509 -req -in $n.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial -out $n.pem -days 2",
        " -extfile leaf.ext; done");
    return std::system(Str("sh -c '", absl::StrReplaceAll(script, {{"'", "'\\''"}}), "'").c_str()) == 0
               ? d
               : "";
  }()};
  return dir.path;
}

// With --tls-ca the control connection is mutual TLS: pages move between two workers holding the
// tiers' certificates; a sender in the clear, or one whose certificate another CA signed, gets
// no connection and writes nothing.
TEST_P(DeviceTransportTest, TheControlConnectionIsMutualTls) {
  const std::string& dir = CertDir();
  if (dir.empty()) GTEST_SKIP() << "needs openssl: no openssl command to make certificates";
  const KvTransportTls node{dir + "/node.pem", dir + "/node.key", dir + "/ca.pem"};
  const KvTransportTls intruder{dir + "/intruder.pem", dir + "/intruder.key", dir + "/ca.pem"};
  const std::string layout = "block_size=16;kv_dtype=bf16";
  Side receiver = MakeSide(layout, "0", 0, node);
  Side sender = MakeSide(layout, "0", 20, node);
  ASSERT_TRUE(receiver.transport->Expect(40, {{0, 65536}}).ok());
  const std::vector<PageCopy> pages = {{4096, 0, 4096}, {40960, 8192, 4096}};
  ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 40, pages).ok());
  auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 40);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages, 2);
  EXPECT_EQ(WaitDone(*receiver.transport, 40).state, TransferState::kDone);
  EXPECT_EQ(std::memcmp(receiver.pool->data, sender.pool->data + 4096, 4096), 0);
  EXPECT_EQ(std::memcmp(receiver.pool->data + 8192, sender.pool->data + 40960, 4096), 0);

  ASSERT_TRUE(receiver.transport->Expect(41, {{65536, 131072}}).ok());
  const std::vector<PageCopy> attack = {{0, 65536, 4096}};
  for (const KvTransportTls& tls : {KvTransportTls{}, intruder}) {
    Side other = MakeSide(layout, "0", 21, tls);
    const absl::Status s = other.transport->Submit(receiver.transport->endpoint(), 41, attack);
    EXPECT_FALSE(s.ok()) << "a sender with cert '" << tls.cert << "' was let in";
    if (s.ok()) (void)FinishAndWait(*other.transport, receiver.transport->endpoint(), 41);
  }
  EXPECT_EQ(receiver.transport->Poll(41).state, TransferState::kPending);
  for (size_t i = 65536; i < 65536 + 4096; ++i) ASSERT_EQ(receiver.pool->data[i], 0);
  receiver.transport->Release(41);
}

// A peer that hangs up is a failed Write, never SIGPIPE (whose default action would end the
// worker): in the clear and over TLS, where OpenSSL writes with write(2).
TEST(StreamTest, WritingToAGonePeerFailsWithoutSigpipe) {
  std::vector<uint8_t> big(1 << 20, 7);
  {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    ::close(fds[1]);
    Stream plain(fds[0], nullptr);
    iovec iov{big.data(), big.size()};
    EXPECT_FALSE(plain.Write(&iov, 1));
    ::close(fds[0]);
  }
  const std::string& dir = CertDir();
  if (dir.empty()) GTEST_SKIP() << "needs openssl: no openssl command to make certificates";
  auto tls = KvTls::Create(dir + "/node.pem", dir + "/node.key", dir + "/ca.pem");
  ASSERT_TRUE(tls.ok()) << tls.status();
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::thread server([&] {
    auto accepted = (*tls)->Accept(fds[1]);
    EXPECT_TRUE(accepted.ok()) << accepted.status();
    accepted->reset();  // Hang up without reading.
    ::close(fds[1]);
  });
  auto client = (*tls)->Connect(fds[0], "127.0.0.1");
  server.join();
  ASSERT_TRUE(client.ok()) << client.status();
  bool ok = true;
  for (int i = 0; i < 8 && ok; ++i) {
    iovec iov{big.data(), big.size()};
    ok = (*client)->Write(&iov, 1);
  }
  EXPECT_FALSE(ok);
  client->reset();
  ::close(fds[0]);
}

INSTANTIATE_TEST_SUITE_P(DataPaths, DeviceTransportTest, ::testing::Values("cuda_ipc", "nccl"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// tcp for GPU pools (--device cuda --transport tcp): pages staged through host mirrors. Two
// shared-memory "devices" (TEST INFRASTRUCTURE for GPU memory) over a real tcp connection, and
// either side paired with a plain host-memory (CPU) worker.
struct StagedSide {
  std::unique_ptr<SharedPool> pool;
  std::unique_ptr<KvTransport> transport;
};

StagedSide MakeStaged(bool gpu, uint64_t seed) {
  StagedSide s;
  s.pool = PoolOf(seed);
  KvTransportOptions o;
  o.layout = "block_size=16;kv_dtype=bf16;device=cpu";  // KvPagesDevice("tcp", ...) either way.
  o.send_timeout_ms = 5000;
  auto tcp = CreateTcpKvTransport(o);
  EXPECT_TRUE(tcp.ok()) << tcp.status();
  s.transport = gpu ? CreateStagingKvTransport(std::move(*tcp), CreateSharedMemoryPoolDevice())
                    : std::move(*tcp);
  EXPECT_TRUE(s.transport->RegisterPool(s.pool->data, kPoolBytes).ok());
  return s;
}

TEST(StagingTransportTest, GpuAndCpuPoolsPairOverTcpThroughHostMemory) {
  for (const auto& [sender_gpu, receiver_gpu] : {std::pair{true, true}, std::pair{false, true},
                                                 std::pair{true, false}}) {
    SCOPED_TRACE(Str(sender_gpu ? "gpu" : "cpu", " -> ", receiver_gpu ? "gpu" : "cpu"));
    StagedSide sender = MakeStaged(sender_gpu, 31), receiver = MakeStaged(receiver_gpu, 0);
    ASSERT_TRUE(receiver.transport->Expect(50, {{8192, 8192 + 4096}, {65536, 65536 + 8192}}).ok());
    const std::vector<PageCopy> pages = {{0, 8192, 4096}, {12288, 65536, 4096}, {40000, 69632, 4096}};
    ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 50, pages).ok());
    auto stats = FinishAndWait(*sender.transport, receiver.transport->endpoint(), 50);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->pages, 3);
    ASSERT_EQ(WaitDone(*receiver.transport, 50).state, TransferState::kDone);
    // In the receiver's pool itself (the device, when staged), not only in a mirror.
    for (const PageCopy& p : pages) {
      EXPECT_EQ(std::memcmp(receiver.pool->data + p.dst_offset, sender.pool->data + p.src_offset, p.bytes), 0)
          << "page at " << p.dst_offset;
    }
    EXPECT_EQ(receiver.pool->data[4096], 0) << "outside the announced ranges";
    // A second Expect of a live tag is refused and leaves the first one's staging alone.
    EXPECT_EQ(receiver.transport->Expect(50, {{0, 64}}).code(), absl::StatusCode::kAlreadyExists);
    receiver.transport->Release(50);

    // Refused: a page outside the ranges fails the transfer and nothing reaches the pool.
    ASSERT_TRUE(receiver.transport->Expect(51, {{131072, 131072 + 4096}}).ok());
    const std::vector<PageCopy> bad = {{0, 131072, 4096}, {4096, 200000, 4096}};
    ASSERT_TRUE(sender.transport->Submit(receiver.transport->endpoint(), 51, bad).ok());
    (void)FinishAndWait(*sender.transport, receiver.transport->endpoint(), 51);  // tcp: sent.
    EXPECT_EQ(WaitDone(*receiver.transport, 51).state, TransferState::kFailed);
    if (receiver_gpu) {  // Staged: the device pool is written only for a transfer that completed.
      for (size_t i = 131072; i < 131072 + 4096; ++i) ASSERT_EQ(receiver.pool->data[i], 0) << i;
    }
    for (size_t i = 200000; i < 200000 + 4096; ++i) ASSERT_EQ(receiver.pool->data[i], 0) << i;
    receiver.transport->Release(51);
  }
}

// Two transfers sending the same source page to two receivers: the first ending (its mirror
// pages handed back) must not take the page from under the second, whose send is held back
// (fault injection) until after the first has ended.
TEST(StagingTransportTest, ASharedSourcePageOutlivesTheFirstTransferThatSentIt) {
  StagedSide sender = MakeStaged(true, 32), r1 = MakeStaged(true, 0), r2 = MakeStaged(true, 0);
  ASSERT_TRUE(r1.transport->Expect(60, {{0, 4096}}).ok());
  ASSERT_TRUE(r2.transport->Expect(61, {{4096, 8192}}).ok());
  const std::vector<PageCopy> pa = {{16384, 0, 4096}}, pb = {{16384, 4096, 4096}};
  ASSERT_TRUE(sender.transport->Submit(r1.transport->endpoint(), 60, pa).ok());
  for (int i = 0; i < 500 && r1.transport->Poll(60).stats.pages < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(r1.transport->Poll(60).stats.pages, 1);
  SetStallKvPageForTesting(1, 400);  // The next page sent (the second transfer's) waits 400 ms.
  ASSERT_TRUE(sender.transport->Submit(r2.transport->endpoint(), 61, pb).ok());
  ASSERT_TRUE(FinishAndWait(*sender.transport, r1.transport->endpoint(), 60).ok());
  ASSERT_TRUE(FinishAndWait(*sender.transport, r2.transport->endpoint(), 61).ok());
  SetStallKvPageForTesting(0, 0);
  ASSERT_EQ(WaitDone(*r1.transport, 60).state, TransferState::kDone);
  ASSERT_EQ(WaitDone(*r2.transport, 61).state, TransferState::kDone);
  EXPECT_EQ(std::memcmp(r1.pool->data, sender.pool->data + 16384, 4096), 0);
  EXPECT_EQ(std::memcmp(r2.pool->data + 4096, sender.pool->data + 16384, 4096), 0)
      << "the second transfer sent a page the first one's end had handed back";
}

// `local` over a device (serve --device cuda): the copy and both checksums on the device.
TEST(LocalDeviceTransportTest, CopiesThroughTheDeviceAndCatchesCorruption) {
  auto src = *AllocateSharedPool(kPoolBytes);
  auto dst = *AllocateSharedPool(kPoolBytes);
  SplitMix64 rng(13);
  for (size_t i = 0; i < kPoolBytes; ++i) src->data[i] = static_cast<uint8_t>(rng.Next() | 1);
  KvTransportOptions o;
  o.layout = "kv_dtype=bf16;device=cuda";
  o.device = "cuda";
  auto sender = CreateLocalKvTransport(o, CreateSharedMemoryPoolDevice());
  auto receiver = CreateLocalKvTransport(o, CreateSharedMemoryPoolDevice());
  ASSERT_TRUE(sender->RegisterPool(src->data, kPoolBytes).ok());
  ASSERT_TRUE(receiver->RegisterPool(dst->data, kPoolBytes).ok());
  for (int corrupt : {0, 2}) {
    const uint64_t tag = 20 + corrupt;
    SetCorruptKvPageForTesting(corrupt);
    ASSERT_TRUE(receiver->Expect(tag, {{0, kPoolBytes}}).ok());
    const std::vector<PageCopy> pages = {{0, 4096 * tag, 4096}, {8192, 4096 * tag + 8192, 1003}};
    ASSERT_TRUE(sender->Submit(receiver->endpoint(), tag, pages).ok());
    auto stats = FinishAndWait(*sender, receiver->endpoint(), tag);
    ASSERT_TRUE(stats.ok()) << stats.status();
    const TransferPoll poll = receiver->Poll(tag);
    if (corrupt == 0) {
      ASSERT_EQ(poll.state, TransferState::kDone) << poll.status;
      EXPECT_EQ(std::memcmp(dst->data + 4096 * tag, src->data, 4096), 0);
      EXPECT_EQ(std::memcmp(dst->data + 4096 * tag + 8192, src->data + 8192, 1003), 0);
    } else {
      EXPECT_EQ(poll.state, TransferState::kFailed);
      EXPECT_NE(std::string(poll.status.message()).find("checksum mismatch"), std::string::npos);
    }
  }
  SetCorruptKvPageForTesting(0);
}

}  // namespace
}  // namespace pdserve
