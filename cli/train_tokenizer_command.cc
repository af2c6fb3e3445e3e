// pdserve train-tokenizer DIR: a byte-level BPE tokenizer trained on a text file, written as
// tokenizer.json + tokenizer_config.json (the demo model's tokenizer; scripts/train_demo_model.py).
#include <cstdio>

#include "absl/strings/str_split.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/tokenizer/bpe_trainer.h"

namespace pdserve::cli {

int TrainTokenizerCommand(int argc, char** argv) {
  std::string corpus_path, special_tokens, chat_template_path, eos_token;
  int64_t vocab = 4096;
  FlagSet flags("train-tokenizer DIR",
                "Trains a byte-level BPE tokenizer on a text file; writes tokenizer.json and "
                "tokenizer_config.json into DIR.");
  flags.String("corpus", &corpus_path, "UTF-8 text file to learn the merges from (required)");
  flags.Int("vocab", &vocab, "vocabulary size: 256 bytes + merges + special tokens");
  flags.String("special-tokens", &special_tokens,
               "comma-separated special tokens after <|begin_of_text|> and <|end_of_text|>");
  flags.String("chat-template", &chat_template_path,
               "file holding a Jinja chat template for tokenizer_config.json");
  flags.String("eos-token", &eos_token, "tokenizer_config.json's eos_token (default <|end_of_text|>)");
  flags.AllowPositional(1);
  int code;
  if (!ParseFlagsOrExit(flags, "train-tokenizer", argc, argv, &code)) return code;
  if (flags.positional().size() != 1 || corpus_path.empty()) {
    return ReportError("train-tokenizer",
                       absl::InvalidArgumentError(
                           "expected --corpus FILE and one directory: pdserve train-tokenizer "
                           "--corpus FILE DIR"),
                       kExitUsage);
  }
  auto corpus = ReadFileToString(corpus_path);
  if (!corpus.ok()) return ReportError("train-tokenizer", corpus.status());
  BpeTrainerOptions options;
  options.vocab_size = vocab;
  options.corpus = *corpus;
  options.eos_token = eos_token;
  if (!special_tokens.empty()) {
    options.extra_special_tokens = absl::StrSplit(special_tokens, ',', absl::SkipEmpty());
  }
  if (!chat_template_path.empty()) {
    auto chat_template = ReadFileToString(chat_template_path);
    if (!chat_template.ok()) return ReportError("train-tokenizer", chat_template.status());
    options.chat_template = *chat_template;
  }
  auto files = TrainByteLevelTokenizer(options);
  if (!files.ok()) return ReportError("train-tokenizer", files.status(), kExitUsage);
  const std::string& dir = flags.positional()[0];
  absl::Status s = MakeDirectories(dir);
  if (s.ok()) s = WriteStringToFile(JoinPath(dir, "tokenizer.json"), files->tokenizer_json);
  if (s.ok()) {
    s = WriteStringToFile(JoinPath(dir, "tokenizer_config.json"), files->tokenizer_config_json);
  }
  if (!s.ok()) return ReportError("train-tokenizer", s);
  std::printf("wrote a %lld-token tokenizer (bos %d, eos %d) to %s\n",
              static_cast<long long>(vocab), files->bos_token_id, files->eos_token_id,
              dir.c_str());
  return kExitOk;
}

}  // namespace pdserve::cli
