#include "common/model/gguf.h"

#include <cstring>
#include <string>

#include "common/model/gguf_writer.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::string Sample() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 2);
  w.SetFloat32("llama.rope.freq_base", 500000.0f);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetInt32("signed", -7);
  w.SetUint64("big", uint64_t{1} << 40);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", ""});
  w.SetInt32Array("tokenizer.ggml.token_type", {1, 3, 6});
  w.SetFloat32Array("scores", {0.5f, -1.0f});
  w.AddTensor("f32", GgmlType::kF32, {4, 2}, std::string(32, '\x01'));
  w.AddTensor("q8", GgmlType::kQ8_0, {64, 3}, std::string(3 * 2 * 34, '\x02'));
  return w.Serialize();
}

absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const std::string& s) {
  return GgufFile::Parse(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "test.gguf");
}

TEST(Gguf, WriterAndReaderAgree) {
  const std::string bytes = Sample();
  auto g = ParseBytes(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->version(), 3u);
  EXPECT_EQ(*(*g)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*g)->GetUint("llama.block_count"), 2u);
  EXPECT_EQ(*(*g)->GetFloat("llama.rope.freq_base"), 500000.0);
  EXPECT_EQ(*(*g)->GetBool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(*(*g)->GetUint("big"), uint64_t{1} << 40);
  EXPECT_FALSE((*g)->GetUint("signed").ok());  // Negative.
  EXPECT_EQ((*g)->Find("signed")->i, -7);
  const GgufValue* tokens = (*g)->Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->array.size(), 3u);
  EXPECT_EQ(tokens->array[1].s, "b");
  EXPECT_EQ((*g)->Find("tokenizer.ggml.token_type")->array[2].i, 6);
  EXPECT_EQ((*g)->Find("scores")->array[1].f, -1.0);
  EXPECT_EQ((*g)->keys().front(), "general.architecture");
  EXPECT_EQ((*g)->GetString("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*g)->GetString("llama.block_count").status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ((*g)->tensors().size(), 2u);
  const GgufTensor* q8 = (*g)->FindTensor("q8");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->type, GgmlType::kQ8_0);
  EXPECT_EQ(q8->dims, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(q8->bytes, 3u * 2 * 34);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q8->data) % 32, reinterpret_cast<uintptr_t>(bytes.data()) % 32);
  EXPECT_EQ(q8->data[0], 2);
  EXPECT_EQ((*g)->FindTensor("f32")->data[5], 1);
}

// Every prefix of a valid file is refused with a message, never read past its end.
TEST(Gguf, EveryTruncationIsAnError) {
  const std::string bytes = Sample();
  for (size_t n = 0; n < bytes.size(); ++n) {
    // The last tensor's padding may be cut without losing its bytes.
    std::string cut = bytes.substr(0, n);
    auto g = ParseBytes(cut);
    if (g.ok()) {
      for (const GgufTensor& t : (*g)->tensors()) {
        EXPECT_LE(t.data + t.bytes, reinterpret_cast<const uint8_t*>(cut.data()) + cut.size()) << n;
      }
      continue;
    }
    EXPECT_FALSE(g.status().message().empty());
    EXPECT_NE(std::string(g.status().message()).find("test.gguf"), std::string::npos);
  }
}

void Expect(const std::string& bytes, const std::string& needle) {
  auto g = ParseBytes(bytes);
  ASSERT_FALSE(g.ok()) << needle;
  EXPECT_NE(std::string(g.status().message()).find(needle), std::string::npos) << g.status();
}

TEST(Gguf, BadFilesNameTheProblem) {
  std::string bytes = Sample();
  std::string bad = bytes;
  bad[0] = 'X';
  Expect(bad, "wrong magic");
  bad = bytes;
  bad[4] = 9;
  Expect(bad, "version 9");
  bad = bytes;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(&bad[8], &huge, 8);
  Expect(bad, "tensors; at most");
  bad = bytes;
  std::memcpy(&bad[16], &huge, 8);
  Expect(bad, "metadata keys; at most");

  // A tensor of a type pdserve does not read, or offsets and shapes that do not fit.
  auto with_tensor = [](GgmlType type, std::vector<int64_t> dims, size_t data_bytes) {
    GgufWriter w;
    w.AddTensor("t", type, std::move(dims), std::string(data_bytes, '\0'));
    return w.Serialize();
  };
  std::string unknown = with_tensor(GgmlType::kF32, {8}, 32);
  // The type id sits after name (8 + 1), ndims (4) and one dim (8), at 24 + 21.
  const uint32_t q2k = 10;
  std::memcpy(&unknown[24 + 8 + 1 + 4 + 8], &q2k, 4);
  Expect(unknown, "type 10 is not supported");
  Expect(with_tensor(GgmlType::kQ4_K, {128, 2}, 0), "not whole Q4_K blocks of 256");
  std::string past = with_tensor(GgmlType::kF32, {8}, 32);
  const uint64_t far = 1 << 20;
  std::memcpy(&past[24 + 8 + 1 + 4 + 8 + 4], &far, 8);
  Expect(past, "run past the end of the file");
  std::string misaligned = past;
  const uint64_t odd = 3;
  std::memcpy(&misaligned[24 + 8 + 1 + 4 + 8 + 4], &odd, 8);
  Expect(misaligned, "not a multiple of the alignment");
  std::string absurd = with_tensor(GgmlType::kF32, {8}, 32);
  const uint64_t big_dim = uint64_t{1} << 50;
  std::memcpy(&absurd[24 + 8 + 1 + 4], &big_dim, 8);
  Expect(absurd, "dimension 0 is");
  // Two dimensions each in bounds whose product is not (2^33 x 2^33 wrapped a 64-bit check).
  GgufWriter two;
  two.AddTensor("t", GgmlType::kF32, {8, 8}, std::string(256, '\0'));
  std::string product = two.Serialize();
  const uint64_t d33 = uint64_t{1} << 33;
  std::memcpy(&product[24 + 8 + 1 + 4], &d33, 8);
  std::memcpy(&product[24 + 8 + 1 + 4 + 8], &d33, 8);
  Expect(product, "dimension 1 is");

  // An array that claims more elements than the file could hold.
  GgufWriter w;
  w.SetInt32Array("a", {1, 2, 3});
  std::string arr = w.Serialize();
  // key (8 + 1) + type (4) + element type (4): then the count.
  std::memcpy(&arr[24 + 8 + 1 + 4 + 4], &huge, 8);
  Expect(arr, "cannot fit");
}

}  // namespace
}  // namespace pdserve
