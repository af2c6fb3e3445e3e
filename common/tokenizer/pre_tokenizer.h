// The "pre_tokenizer" of tokenizer.json: splits normalized text into words for the model.
// Supported: ByteLevel (with or without GPT-2's split), Split (regex or string, every delimiter
// behaviour, invert), Metaspace, Sequence. Immutable after Parse; thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define PDSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/split_regex.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve {

class PreTokenizer {
 public:
  // A JSON null gives an empty pipeline (the text is one word).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Parse(const nlohmann::json& j);
  ~PreTokenizer();

  // Appends the words of `text` to *words. `first_section`: the text starts the input (Metaspace's
  // prepend_scheme "first" only prefixes that one).
  void Split(std::string_view text, bool first_section, std::vector<std::string>* words) const;
  bool byte_level() const { return byte_level_; }

 private:
  struct Step;
  PreTokenizer();
  static absl::Status ParseInto(const nlohmann::json& j, PreTokenizer* out);
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
