#include "common/base/mapped_file.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/base/file_util.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir ? dir : "/tmp", name);
}

TEST(FileUtilTest, BaseNameIgnoresTrailingSlashes) {
  EXPECT_EQ(BaseName("models/llama"), "llama");
  EXPECT_EQ(BaseName("/srv/models/qwen3/"), "qwen3");
  EXPECT_EQ(BaseName("plain"), "plain");
  EXPECT_EQ(BaseName("/"), "/");
}

TEST(MappedFileTest, MapsContents) {
  const std::string path = TempPath("pdserve_mapped_file_test.bin");
  ASSERT_TRUE(WriteStringToFile(path, "hello mapping").ok());
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->data()), (*file)->size()),
            "hello mapping");
}

// The resident kB of the mapping that starts at `base` (/proc/self/smaps' Rss of its area).
long MappedRssKb(const void* base) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t want = reinterpret_cast<uintptr_t>(base);
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in = lo == want;
      continue;
    }
    long kb = 0;
    if (in && std::sscanf(line.c_str(), "Rss: %ld kB", &kb) == 1) return kb;
  }
  return -1;
}

// Released pages leave the process's resident set and read back the file's bytes; a range
// outside the mapping is ignored.
TEST(MappedFileTest, ReleasedPagesReadBackFromTheFile) {
  const std::string path = TempPath("pdserve_mapped_file_release.bin");
  const long page = ::sysconf(_SC_PAGESIZE);
  std::string bytes(static_cast<size_t>(8 * page), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  ASSERT_TRUE(WriteStringToFile(path, bytes).ok());
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const uint8_t* data = (*file)->data();
  long sum = 0;
  for (size_t i = 0; i < bytes.size(); i += static_cast<size_t>(page)) sum += data[i];  // Touch.
  const long before = MappedRssKb(data);
  ASSERT_EQ(before, 8 * page / 1024);
  // Pages 2..5 whole, from the middle of page 1 to the middle of page 6.
  (*file)->Release(data + page + page / 2, static_cast<size_t>(5 * page));
  (*file)->Release(data + bytes.size() - 10, 100);  // Past the end: ignored.
  EXPECT_EQ(MappedRssKb(data), before - 4 * page / 1024);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data), bytes.size()), bytes);
  EXPECT_GT(sum, -1);
}

TEST(MappedFileTest, MissingFileIsNotFoundNamingThePath) {
  auto file = MappedFile::Open("/nonexistent/dir/model.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/dir/model.safetensors"), std::string::npos);
}

TEST(MappedFileTest, DirectoryIsRefused) {
  auto file = MappedFile::Open("/tmp");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
