#include "common/base/mapped_file.h"

#include <cstdlib>

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
