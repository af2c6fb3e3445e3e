// The KV cache tiers' load path alone (issue 59): how fast HostTier, DiskTier and RedisTier read
// blocks back, in the runs the engine asks for (KvTier::LoadRun), against what the machine's own
// tools get from the same memory, file system and server (memcpy of the same bytes here;
// bench/kv_tier_io.py runs fio and redis-benchmark beside it and prints the ratios). Also: a run
// of N blocks from Redis in one pipelined call against N calls one after another (the round trips
// a run saves). The host tier's blocks are copied out as the engine copies them into its pool.
//
//   kv_tier_io_bench --dir DIR [--redis URL [--tls-ca F --tls-cert F --tls-key F]]
//                    [--block-bytes B] [--blocks N] [--run R]
//
// URL: redis://HOST:PORT, or rediss://HOST:PORT over TLS (the tier's bridge, redis_tls.h).
//
// Prints one JSON object: MB/s of each measurement (MB = 1e6 bytes). The disk's cold figure needs
// root (it drops the page cache through /proc/sys/vm/drop_caches); without it, "cold" is null.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/kvcache/disk_tier.h"
#include "common/kvcache/host_tier.h"
#include "common/kvcache/redis_tier.h"

// Inline: XXH3 compiled with the build's vector flags (AVX2), not the library's SSE2 build.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<uint8_t> Block(uint64_t seed, size_t bytes) {
  std::vector<uint8_t> b(bytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(b.data() + i, &x, 8);
  }
  return b;
}

KvTierKey Key(uint64_t i) { return {{0x5eed, 0xbe7c}, {i * 0x9E3779B97F4A7C15ull + 1, i}}; }

bool DropPageCache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  return static_cast<bool>(f.flush());
}

// MB/s loading every key in runs of `run` (as the engine asks: a request's next blocks); -1 when
// a block did not load.
double LoadAll(KvTier& tier, const std::vector<KvTierKey>& keys, size_t block_bytes, size_t run,
               uint8_t* copy_to = nullptr) {
  const auto start = Clock::now();
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < keys.size(); i += run) {
    const size_t n = std::min(run, keys.size() - i);
    const int64_t got = tier.LoadRun(absl::MakeConstSpan(keys).subspan(i, n), block_bytes,
                                     [&](size_t, absl::Span<const uint8_t> b) {
                                       if (copy_to != nullptr) std::memcpy(copy_to, b.data(), b.size());
                                       sink = sink + b[0];
                                     });
    if (got != static_cast<int64_t>(n)) return -1;
  }
  return static_cast<double>(keys.size() * block_bytes) / Since(start) / 1e6;
}

std::string Json(double v) { return v < 0 ? "null" : std::to_string(v); }

int Main(int argc, char** argv) {
  std::string dir, redis;
  RedisTlsOptions tls;
  size_t block_bytes = 512 * 1024, blocks = 512, run = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir") {
      dir = value;
    } else if (flag == "--redis") {
      redis = value;
    } else if (flag == "--tls-ca") {
      tls.ca_file = value;
    } else if (flag == "--tls-cert") {
      tls.cert_file = value;
    } else if (flag == "--tls-key") {
      tls.key_file = value;
    } else if (flag == "--block-bytes") {
      block_bytes = std::strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--blocks") {
      blocks = std::strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--run") {
      run = std::strtoull(value.c_str(), nullptr, 10);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (dir.empty() || block_bytes == 0 || blocks == 0 || run == 0) {
    std::fprintf(stderr, "usage: kv_tier_io_bench --dir DIR [--redis URL [--tls-ca F --tls-cert F --tls-key F]] "
                         "[--block-bytes B] [--blocks N] [--run R]\n");
    return 2;
  }
  std::vector<KvTierKey> keys;
  for (size_t i = 0; i < blocks; ++i) keys.push_back(Key(i));
  std::printf("{\"block_bytes\": %zu, \"blocks\": %zu, \"run\": %zu", block_bytes, blocks, run);

  // Host memory: the tier's loads (checked, copied out) against memcpy of the same bytes.
  {
    HostTierOptions ho;
    ho.budget_bytes = static_cast<int64_t>((block_bytes + 4096) * blocks);
    auto host = HostTier::Create(ho);
    if (!host.ok()) return 1;
    std::vector<std::vector<uint8_t>> source;
    for (size_t i = 0; i < blocks; ++i) {
      source.push_back(Block(i, block_bytes));
      if (!(*host)->Store(keys[i], source.back()).ok()) return 1;
    }
    std::vector<uint8_t> pool(block_bytes);
    double best_tier = 0, best_copy = 0, best_hash = 0;
    volatile uint64_t digest = 0;
    for (int round = 0; round < 3; ++round) {  // Interleaved, the best of three each.
      best_tier = std::max(best_tier, LoadAll(**host, keys, block_bytes, run, pool.data()));
      auto start = Clock::now();
      for (const auto& b : source) std::memcpy(pool.data(), b.data(), block_bytes);
      best_copy = std::max(best_copy, static_cast<double>(blocks * block_bytes) / Since(start) / 1e6);
      start = Clock::now();  // The check alone: XXH3-64 of every block, as a load computes it.
      for (const auto& b : source) digest = digest ^ XXH3_64bits(b.data(), block_bytes);
      best_hash = std::max(best_hash, static_cast<double>(blocks * block_bytes) / Since(start) / 1e6);
    }
    std::printf(", \"host_mbps\": %s, \"memcpy_mbps\": %s, \"xxh3_mbps\": %s", Json(best_tier).c_str(),
                Json(best_copy).c_str(), Json(best_hash).c_str());
  }

  auto disk = DiskTier::Open({dir, static_cast<int64_t>(blocks * (block_bytes + DiskTier::kHeaderBytes) * 2)});
  if (!disk.ok()) {
    std::fprintf(stderr, "%s\n", std::string(disk.status().message()).c_str());
    return 1;
  }
  for (size_t i = 0; i < blocks; ++i) {
    if (!(*disk)->Store(keys[i], Block(i, block_bytes)).ok()) return 1;
  }
  const bool dropped = DropPageCache();
  const double cold = LoadAll(**disk, keys, block_bytes, run);
  const double warm = LoadAll(**disk, keys, block_bytes, run);
  std::printf(", \"disk_cold_mbps\": %s, \"disk_warm_mbps\": %s", dropped ? Json(cold).c_str() : "null",
              Json(warm).c_str());

  if (!redis.empty()) {
    RedisTierOptions o;
    if (absl::Status s = ParseRedisUrl(redis, &o); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
    o.tls_options = tls;
    o.timeout_ms = 10000;
    auto tier = RedisTier::Open(o);
    if (!tier.ok()) {
      std::fprintf(stderr, "%s\n", std::string(tier.status().message()).c_str());
      return 1;
    }
    for (size_t i = 0; i < blocks; ++i) {
      if (!(*tier)->Store(keys[i], Block(i, block_bytes)).ok()) return 1;
    }
    LoadAll(**tier, keys, block_bytes, run);  // Warm the connection and the server's memory.
    const double pipelined = LoadAll(**tier, keys, block_bytes, run);
    const double serial = LoadAll(**tier, keys, block_bytes, 1);
    std::printf(", \"redis_run_mbps\": %s, \"redis_one_at_a_time_mbps\": %s", Json(pipelined).c_str(),
                Json(serial).c_str());
  }
  std::printf("}\n");
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) { return pdserve::Main(argc, argv); }
