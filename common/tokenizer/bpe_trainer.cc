#include "common/tokenizer/bpe_trainer.h"

#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/base/strings.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

constexpr std::string_view kCorpus = R"(The quick brown fox jumps over the lazy dog.
Large language models are served in two phases: prefill reads the whole prompt at once and is
bound by arithmetic, while decode produces one token at a time and is bound by memory bandwidth.
Splitting the phases onto separate workers lets each tier be sized for its own bottleneck.
The key-value cache stores, for every layer and every past token, the keys and values of attention.
It is paged into blocks of sixteen tokens so that sequences can share a common prefix, such as a
system prompt, and so that memory is never fragmented. When the pool runs short, the scheduler
preempts the newest sequence and recomputes it later instead of dropping it.
def forward(self, hidden_states, positions):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    return self.mlp(hidden_states) + residual
for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; }
Numbers like 1, 12, 123, 2024, 3.14159 and 65536 appear in text; so do dates such as 2026-11-30.
She said: "I'll be there at 10 o'clock, won't you?" He didn't answer; they're always late.
Questions? Answers! Lists: apples, oranges, pears; and more. Email me at someone@example.com.
In the beginning the server was empty, and then the first request arrived with a long prompt.
Throughput, latency, and goodput are measured for every configuration of the deployment.
)";

using Pair = std::pair<std::string, std::string>;

}  // namespace

absl::StatusOr<TrainedTokenizerFiles> TrainByteLevelTokenizer(int64_t vocab_size,
                                                              int64_t max_merges) {
  if (vocab_size < 258) {
    return absl::InvalidArgumentError(
        Str("vocab size ", vocab_size, " is too small for a byte-level tokenizer "
                                                "(needs 256 byte tokens and 2 special tokens)"));
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<SplitRegex> split, SplitRegex::Create(kLlama3SplitPattern));

  // Word frequencies, each word as a list of byte-level symbols.
  std::map<std::string, int64_t> word_counts;
  for (const auto& [b, e] : split->FindAll(kCorpus)) {
    ++word_counts[BytesToByteLevel(kCorpus.substr(b, e - b))];
  }
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [w, count] : word_counts) {
    std::vector<std::string> symbols;
    size_t pos = 0;
    while (pos < w.size()) {
      const size_t start = pos;
      NextCodePoint(w, &pos);
      symbols.push_back(w.substr(start, pos - start));
    }
    words.emplace_back(std::move(symbols), count);
  }

  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(b)), &s);
    vocab[s] = b;
  }
  int32_t next_id = 256;
  const int64_t merge_budget = std::min<int64_t>(max_merges, vocab_size - 258);
  nlohmann::json merges = nlohmann::json::array();
  while (static_cast<int64_t>(merges.size()) < merge_budget) {
    // std::map keeps ties deterministic: the lexicographically smallest pair wins.
    std::map<Pair, int64_t> pair_counts;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pair_counts[{symbols[i], symbols[i + 1]}] += count;
    }
    const Pair* best = nullptr;
    int64_t best_count = 0;
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const Pair chosen = *best;
    const std::string merged = chosen.first + chosen.second;
    if (vocab.contains(merged)) break;  // Cannot happen with a consistent merge order.
    vocab[merged] = next_id++;
    merges.push_back(nlohmann::json::array({chosen.first, chosen.second}));
    for (auto& [symbols, count] : words) {
      std::vector<std::string> out;
      out.reserve(symbols.size());
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == chosen.first &&
            symbols[i + 1] == chosen.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(symbols[i]);
        }
      }
      symbols = std::move(out);
    }
  }

  TrainedTokenizerFiles files;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  auto add_special = [&](const std::string& content) {
    added.push_back({{"id", next_id}, {"content", content}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", true}});
    return next_id++;
  };
  files.bos_token_id = add_special("<|begin_of_text|>");
  files.eos_token_id = add_special("<|end_of_text|>");
  for (int64_t r = 0; next_id < vocab_size; ++r) {
    add_special(Str("<|reserved_special_token_", r, "|>"));
  }

  nlohmann::ordered_json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", std::string(kLlama3SplitPattern)}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"},
         {"add_prefix_space", false},
         {"trim_offsets", true},
         {"use_regex", false}}}}};
  tok["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{"<|begin_of_text|>",
         {{"id", "<|begin_of_text|>"}, {"ids", {files.bos_token_id}},
          {"tokens", {"<|begin_of_text|>"}}}}}}};
  tok["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  tok["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                  {"unk_token", nullptr},    {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                  {"byte_fallback", false},  {"ignore_merges", true},
                  {"vocab", vocab},          {"merges", merges}};
  files.tokenizer_json = tok.dump(2);

  nlohmann::ordered_json config;
  config["bos_token"] = "<|begin_of_text|>";
  config["eos_token"] = "<|end_of_text|>";
  config["model_max_length"] = 131072;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["clean_up_tokenization_spaces"] = true;
  files.tokenizer_config_json = config.dump(2);
  return files;
}

}  // namespace pdserve
