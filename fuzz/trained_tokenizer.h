// The byte-level BPE tokenizer (Llama 3 layout) the fuzzers encode with, trained once per process
// by pdserve make-model's trainer.
#ifndef PDSERVE_FUZZ_TRAINED_TOKENIZER_H_
#define PDSERVE_FUZZ_TRAINED_TOKENIZER_H_

#include <memory>

#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

inline const Tokenizer& FuzzTokenizer() {
  static const std::unique_ptr<Tokenizer> t = [] {
    auto files = TrainByteLevelTokenizer(1024, 512);
    if (!files.ok()) __builtin_trap();
    auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "trained");
    if (!tok.ok()) __builtin_trap();
    return std::move(*tok);
  }();
  return *t;
}

}  // namespace pdserve

#endif  // PDSERVE_FUZZ_TRAINED_TOKENIZER_H_
