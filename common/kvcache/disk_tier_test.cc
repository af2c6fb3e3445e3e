#include "common/kvcache/disk_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("pdserve_disk_tier_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

KvTierKey Key(uint64_t block, uint64_t model = 7) { return {{model, model + 1}, {block, block * 3 + 1}}; }

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

std::vector<fs::path> Files(const std::string& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().string().size() >= suffix.size() &&
        e.path().string().compare(e.path().string().size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(e.path());
    }
  }
  return out;
}

TEST(DiskTier, StoresLoadsAndSurvivesARestart) {
  const std::string dir = TempDir("restart");
  const auto a = Bytes(4096, 1), b = Bytes(4096, 2);
  {
    auto tier = DiskTier::Open({dir, 1 << 20});
    ASSERT_TRUE(tier.ok()) << tier.status();
    EXPECT_FALSE((*tier)->Contains(Key(1)));
    ASSERT_TRUE((*tier)->Store(Key(1), a).ok());
    ASSERT_TRUE((*tier)->Store(Key(2), b).ok());
    EXPECT_TRUE((*tier)->Contains(Key(1)));
    EXPECT_FALSE((*tier)->Contains(Key(1, 8)));  // Another model's key.
    std::vector<uint8_t> out(4096);
    ASSERT_TRUE((*tier)->Load(Key(2), absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, b);
    EXPECT_EQ((*tier)->Load(Key(3), absl::MakeSpan(out)).code(), absl::StatusCode::kNotFound);
    const KvTierStats s = (*tier)->Stats();
    EXPECT_EQ(s.misses, 1);
    EXPECT_EQ(s.blocks, 2);
    EXPECT_EQ(s.stores, 2);
    EXPECT_EQ(s.loads, 1);
    EXPECT_EQ(s.bytes, 2 * static_cast<int64_t>(4096 + DiskTier::kHeaderBytes));
  }
  // A writer killed mid-write leaves a temporary file: never a block, removed at the next start.
  { std::ofstream(dir + "/" + std::string(64, 'a') + ".kvb.123.0.tmp") << "torn"; }
  auto again = DiskTier::Open({dir, 1 << 20});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->Contains(Key(1)));
  EXPECT_TRUE((*again)->Contains(Key(2)));
  std::vector<uint8_t> out(4096);
  ASSERT_TRUE((*again)->Load(Key(1), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, a);
  EXPECT_TRUE(Files(dir, ".tmp").empty());
  fs::remove_all(dir);
}

// A file that is not what its name says is a miss, counted and removed, never used: flipped
// bytes, a truncated file, another key's file under this name, a block of another size.
TEST(DiskTier, ABlockThatFailsItsChecksIsRemovedNotServed) {
  const std::string dir = TempDir("corrupt");
  auto tier = DiskTier::Open({dir, 1 << 20});
  ASSERT_TRUE(tier.ok());
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE((*tier)->Store(Key(k), Bytes(1000, static_cast<uint8_t>(k))).ok());
  std::vector<fs::path> files = Files(dir, ".kvb");
  ASSERT_EQ(files.size(), 4u);
  auto path_of = [&](uint64_t k) {
    // The name is the key's hex: model.hi, model.lo, block.hi, block.lo.
    char name[80];
    const KvTierKey key = Key(k);
    std::snprintf(name, sizeof name, "%016llx%016llx%016llx%016llx.kvb",
                  static_cast<unsigned long long>(key.model.hi), static_cast<unsigned long long>(key.model.lo),
                  static_cast<unsigned long long>(key.block.hi), static_cast<unsigned long long>(key.block.lo));
    return dir + "/" + name;
  };
  {  // A flipped byte in the payload.
    std::fstream f(path_of(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(DiskTier::kHeaderBytes + 10);
    f.put('\xff');
  }
  fs::resize_file(path_of(2), DiskTier::kHeaderBytes + 500);  // Truncated.
  fs::copy_file(path_of(4), path_of(3), fs::copy_options::overwrite_existing);  // Another key's.
  std::vector<uint8_t> out(1000);
  for (uint64_t k : {1, 2, 3}) {
    EXPECT_EQ((*tier)->Load(Key(k), absl::MakeSpan(out)).code(), absl::StatusCode::kDataLoss) << k;
    EXPECT_FALSE((*tier)->Contains(Key(k))) << k;
    EXPECT_FALSE(fs::exists(path_of(k))) << k;
  }
  std::vector<uint8_t> wrong_size(999);
  EXPECT_EQ((*tier)->Load(Key(4), absl::MakeSpan(wrong_size)).code(), absl::StatusCode::kDataLoss);
  const KvTierStats s = (*tier)->Stats();
  EXPECT_EQ(s.corrupt, 4);
  EXPECT_EQ(s.blocks, 0);
  fs::remove_all(dir);
}

TEST(DiskTier, TheByteBudgetEvictsTheLeastRecentlyUsed) {
  const std::string dir = TempDir("budget");
  const int64_t file = 1000 + DiskTier::kHeaderBytes;
  auto tier = DiskTier::Open({dir, 3 * file});
  ASSERT_TRUE(tier.ok());
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE((*tier)->Store(Key(k), Bytes(1000, 0)).ok());
  std::vector<uint8_t> out(1000);
  ASSERT_TRUE((*tier)->Load(Key(1), absl::MakeSpan(out)).ok());  // 1 is now the newest.
  ASSERT_TRUE((*tier)->Store(Key(4), Bytes(1000, 0)).ok());      // 2 goes.
  EXPECT_TRUE((*tier)->Contains(Key(1)));
  EXPECT_FALSE((*tier)->Contains(Key(2)));
  EXPECT_TRUE((*tier)->Contains(Key(3)));
  EXPECT_TRUE((*tier)->Contains(Key(4)));
  EXPECT_EQ(Files(dir, ".kvb").size(), 3u);
  EXPECT_EQ((*tier)->Stats().evictions, 1);
  // Reopened with a smaller budget: the oldest go at once.
  tier->reset();
  auto smaller = DiskTier::Open({dir, 2 * file});
  ASSERT_TRUE(smaller.ok());
  EXPECT_EQ((*smaller)->Stats().blocks, 2);
  EXPECT_EQ(Files(dir, ".kvb").size(), 2u);
  fs::remove_all(dir);
}

TEST(DiskTier, BadDirectoriesAreRefusedNamingTheFlag) {
  const std::string file = TempDir("notadir");
  { std::ofstream(file) << "x"; }
  auto not_dir = DiskTier::Open({file, 1 << 20});
  ASSERT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.status().message().find("--kv-offload-disk: "), std::string::npos) << not_dir.status();
  EXPECT_FALSE(DiskTier::Open({"", 1 << 20}).ok());
  // A directory that cannot be made (under a file): named, even for root.
  EXPECT_NE(DiskTier::Open({file + "/tier", 1 << 20}).status().message().find("--kv-offload-disk: cannot make"),
            std::string::npos);
  EXPECT_NE(DiskTier::Open({TempDir("nobudget"), 0}).status().message().find("--kv-offload-disk-gib"),
            std::string::npos);
  if (::geteuid() != 0) {  // root writes anywhere: the permission check is for everyone else.
    const std::string ro = TempDir("readonly");
    fs::create_directory(ro);
    ::chmod(ro.c_str(), 0555);
    EXPECT_NE(DiskTier::Open({ro, 1 << 20}).status().message().find("not writable"), std::string::npos);
    fs::remove_all(ro);
  }
  fs::remove(file);
}

}  // namespace
}  // namespace pdserve
