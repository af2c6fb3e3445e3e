#include "common/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <tuple>
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

}  // namespace

absl::StatusOr<TrainedTokenizerFiles> TrainByteLevelTokenizer(int64_t vocab_size,
                                                              int64_t max_merges) {
  BpeTrainerOptions options;
  options.vocab_size = vocab_size;
  options.max_merges = max_merges;
  return TrainByteLevelTokenizer(options);
}

absl::StatusOr<TrainedTokenizerFiles> TrainByteLevelTokenizer(const BpeTrainerOptions& options) {
  const int64_t num_special = 2 + static_cast<int64_t>(options.extra_special_tokens.size());
  const int64_t vocab_size = options.vocab_size;
  if (vocab_size < 256 + num_special) {
    return absl::InvalidArgumentError(
        Str("vocab size ", vocab_size, " is too small for a byte-level tokenizer (needs 256 byte "
            "tokens and ", num_special, " special tokens)"));
  }
  const std::string_view corpus = options.corpus.empty() ? kCorpus : options.corpus;
  PD_ASSIGN_OR_RETURN(std::unique_ptr<SplitRegex> split, SplitRegex::Create(kLlama3SplitPattern));

  // Symbols are ids into `symbols` (their byte-level strings); a word is a list of ids with its
  // count in the corpus.
  std::vector<std::string> symbols;
  absl::flat_hash_map<std::string, int32_t> symbol_ids;
  auto intern = [&](const std::string& s) {
    auto [it, inserted] = symbol_ids.try_emplace(s, static_cast<int32_t>(symbols.size()));
    if (inserted) symbols.push_back(s);
    return it->second;
  };
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(b)), &s);
    vocab[s] = intern(s);
  }
  absl::flat_hash_map<std::string, int64_t> word_counts;
  for (const auto& [b, e] : split->FindAll(corpus)) {
    ++word_counts[BytesToByteLevel(corpus.substr(b, e - b))];
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  words.reserve(word_counts.size());
  for (const auto& [w, count] : word_counts) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos < w.size()) {
      const size_t start = pos;
      NextCodePoint(w, &pos);
      ids.push_back(symbol_ids.at(w.substr(start, pos - start)));
    }
    words.emplace_back(std::move(ids), count);
  }

  auto key = [](int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  };
  int32_t next_id = 256;
  int64_t merge_budget = vocab_size - num_special - 256;
  if (options.max_merges >= 0) merge_budget = std::min(merge_budget, options.max_merges);
  nlohmann::json merges = nlohmann::json::array();
  absl::flat_hash_map<uint64_t, int64_t> pair_counts;
  while (static_cast<int64_t>(merges.size()) < merge_budget && next_id < vocab_size - num_special) {
    pair_counts.clear();
    for (const auto& [ids, count] : words) {
      for (size_t i = 0; i + 1 < ids.size(); ++i) pair_counts[key(ids[i], ids[i + 1])] += count;
    }
    // The most frequent pair; ties go to the lexicographically smallest (first, second).
    int32_t best_a = -1, best_b = -1;
    int64_t best_count = 0;
    for (const auto& [k, count] : pair_counts) {
      const int32_t a = static_cast<int32_t>(k >> 32), b = static_cast<int32_t>(k & 0xffffffffu);
      if (count > best_count ||
          (count == best_count && std::tie(symbols[a], symbols[b]) <
                                      std::tie(symbols[best_a], symbols[best_b]))) {
        best_a = a;
        best_b = b;
        best_count = count;
      }
    }
    if (best_a < 0) break;
    // Two different pairs can spell the same token ("t"+"he", "th"+"e"): as Hugging Face's
    // trainer does, the second merge is recorded and reuses the token's id.
    const std::string merged = symbols[best_a] + symbols[best_b];
    const bool is_new = !symbol_ids.contains(merged);
    const int32_t merged_id = intern(merged);
    if (is_new) {
      vocab[merged] = next_id++;
    }
    merges.push_back(nlohmann::json::array({symbols[best_a], symbols[best_b]}));
    for (auto& [ids, count] : words) {
      size_t out = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == best_a && ids[i + 1] == best_b) {
          ids[out++] = merged_id;
          ++i;
        } else {
          ids[out++] = ids[i];
        }
      }
      ids.resize(out);
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
  for (const std::string& token : options.extra_special_tokens) add_special(token);
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
  config["eos_token"] = options.eos_token.empty() ? "<|end_of_text|>" : options.eos_token;
  config["model_max_length"] = 131072;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["clean_up_tokenization_spaces"] = true;
  if (!options.chat_template.empty()) config["chat_template"] = options.chat_template;
  files.tokenizer_config_json = config.dump(2);
  return files;
}

}  // namespace pdserve
