// A GGUF file's tokenizer (tokenizer.ggml.*: llama.cpp's byte-level BPE, model "gpt2", and
// SentencePiece, model "llama") as the tokenizer.json and tokenizer_config.json Hugging Face would
// ship for it, so one tokenizer implementation (common/tokenizer) encodes both byte for byte; and
// the reverse, for `pdserve gguf convert`. Other vocabulary kinds are refused by name: pass the
// model's tokenizer directory instead (--tokenizer DIR).
#ifndef PDSERVE_COMMON_MODEL_GGUF_TOKENIZER_H_
#define PDSERVE_COMMON_MODEL_GGUF_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/gguf_writer.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

struct TokenizerFiles {
  std::string tokenizer_json;
  std::string config_json;  // bos/eos tokens, chat_template.
};

// NotFound when the file holds no vocabulary (tokenizer.ggml.model "no_vocab" or absent: a file
// for speed tests, served as token ids alone); InvalidArgument naming the key otherwise.
absl::StatusOr<TokenizerFiles> TokenizerFilesFromGguf(const GgufFile& file);

// A model path's tokenizer: a directory (or tokenizer.json), or a GGUF file's metadata.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& path);

// The chat template a GGUF file carries (tokenizer.chat_template), NotFound when none.
absl::StatusOr<std::string> GgufChatTemplate(const GgufFile& file);

// Writes a Hugging Face tokenizer (tokenizer.json and tokenizer_config.json of `dir`) as
// tokenizer.ggml.* metadata: byte-level BPE with the pre-tokenizer by llama.cpp's name
// ("llama-bpe", "qwen2", "gpt-2"), or SentencePiece-style BPE in Llama 2's layout as model "llama"
// (pieces, scores from the merges, piece types); any other is refused. `bos_eos`: also the BOS and EOS ids of
// tokenizer_config.json (a converter that writes config.json's ids says false).
absl::Status WriteGgufTokenizer(const std::string& dir, bool bos_eos, GgufWriter* writer);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_GGUF_TOKENIZER_H_
