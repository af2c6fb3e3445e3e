// SentencePiece vocabularies in GGUF (tokenizer.ggml.model "llama": Llama 2, Mistral, TinyLlama)
// and the Hugging Face tokenizer.json the same model ships, in both directions.
//
// A GGUF file holds SentencePiece's pieces, scores and piece types, not BPE merges. Hugging Face's
// converter (transformers' SentencePieceExtractor, the version that wrote Llama 2's tokenizer.json)
// derives the merges from them: for each piece in id order, every split into two pieces of the
// vocabulary, those ordered by the two pieces' ids; then all of them stably sorted by the whole
// piece's score, highest first. MergesFromScores does exactly that, so the tokenizer built from a
// GGUF file encodes as the model's tokenizer.json does; ScoresFromMerges goes back (a piece's
// score is minus the rank of the first merge that makes it), which MergesFromScores turns into
// the same merge list for any list that extractor wrote (tested on Llama 2's). gguf_tokenizer.cc
// builds the tokenizer.json around them.
#ifndef PDSERVE_COMMON_MODEL_GGUF_SENTENCEPIECE_H_
#define PDSERVE_COMMON_MODEL_GGUF_SENTENCEPIECE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pdserve {

using Merge = std::pair<std::string, std::string>;

// SentencePiece's piece types as llama.cpp writes them (tokenizer.ggml.token_type).
enum class PieceType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

std::vector<Merge> MergesFromScores(const std::vector<std::string>& pieces,
                                    const std::vector<float>& scores);

// One score per piece: -(rank of the first merge that yields it); a piece no merge yields gets 0
// when it is a control, unknown or byte piece (as SentencePiece scores them), else one below every
// merged piece, in id order.
std::vector<float> ScoresFromMerges(const std::vector<std::string>& pieces,
                                    const std::vector<PieceType>& types,
                                    const std::vector<Merge>& merges);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_GGUF_SENTENCEPIECE_H_
