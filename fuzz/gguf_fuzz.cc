// libFuzzer target: the GGUF reader. Every malformed input must be an InvalidArgument error
// naming the file (never a crash or an allocation the input's size does not justify), every
// tensor it accepts must lie inside the image, and dequantizing it must be defined behaviour. Its
// vocabulary (tokenizer.ggml.*, byte-level or SentencePiece) must read as a tokenizer or as an
// error (NotFound: none; InvalidArgument naming the key), and a tokenizer read must encode.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/model/gguf.h"
#include "common/model/gguf_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/quant_blocks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = pdserve::GgufFile::Parse(data, size, "fuzz.gguf");
  if (!g.ok()) {
    if (g.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  std::vector<float> out;
  for (const pdserve::GgufTensor& t : (*g)->tensors()) {
    if (t.data < data || t.data + t.bytes > data + size) __builtin_trap();
    if (t.elements() <= (1 << 16)) {
      out.resize(static_cast<size_t>(t.elements()));
      pdserve::kernels::DequantizeRow(t.type, t.data, out.data(), t.elements());
    }
  }
  auto files = pdserve::TokenizerFilesFromGguf(**g);
  if (!files.ok()) {
    const absl::StatusCode code = files.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kNotFound) {
      __builtin_trap();
    }
    return 0;
  }
  auto tokenizer = pdserve::Tokenizer::FromJson(files->tokenizer_json, files->config_json, "fuzz");
  if (!tokenizer.ok()) {
    if (tokenizer.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  (void)(*tokenizer)->Encode("hi, \xE4\xB8\xAD <s>", /*add_special_tokens=*/true);
  return 0;
}
