#include "common/model/safetensors.h"

#include "common/model/safetensors_writer.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::string Image() {
  SafetensorsWriter w;
  w.Add("a", DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  w.Add("b", DType::kBF16, {4}, {1, -2, 0.5, 8});
  return w.Serialize();
}

absl::StatusOr<std::vector<SafetensorsTensor>> Parse(const std::string& bytes) {
  return ParseSafetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f.st");
}

std::string WithHeader(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, RoundTrip) {
  const std::string image = Image();
  auto tensors = Parse(image);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 2u);
  const auto& a = (*tensors)[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*a.dtype, DType::kF32);
  float v;
  std::memcpy(&v, a.data + 5 * 4, 4);
  EXPECT_EQ(v, 6.0f);
  const auto& b = (*tensors)[1];
  uint16_t h;
  std::memcpy(&h, b.data + 2, 2);
  EXPECT_EQ(Bf16ToF32(h), -2.0f);
}

void ExpectError(const std::string& bytes, const std::string& needle) {
  auto r = Parse(bytes);
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << needle;
  EXPECT_NE(r.status().message().find("f.st"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
}

TEST(SafetensorsTest, TruncatedFilesAreReported) {
  const std::string image = Image();
  ExpectError(image.substr(0, 5), "too small");
  ExpectError(image.substr(0, 20), "runs past the end");
  // Cut inside the data section: the last tensor's offsets run past the end.
  ExpectError(image.substr(0, image.size() - 3), "tensor 'b'");
}

TEST(SafetensorsTest, CorruptHeadersAreReported) {
  ExpectError(WithHeader("{not json", 0), "not a JSON object");
  ExpectError(WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8),
              "tensor 'w'");
  ExpectError(WithHeader(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8),
              "tensor 'w'");
  ExpectError(WithHeader(R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8),
              "unknown dtype");
  ExpectError(WithHeader(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
              "shape");
  ExpectError(WithHeader(R"({"w": {"dtype": "F32", "shape": [2]}})", 8), "data_offsets");
  std::string huge(8, '\xff');
  ExpectError(huge + "xxxx", "implausible");
}

TEST(SafetensorsTest, UnsupportedDtypeIsParsedButMarked) {
  auto r = Parse(WithHeader(R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)[0].dtype.has_value());
  EXPECT_EQ((*r)[0].dtype_name, "I64");
}

}  // namespace
}  // namespace pdserve
