#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/tokenizer/byte_level.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<Behavior> ParseBehavior(const Json& j) {
  const std::string b = j.is_string() ? j.get<std::string>() : "";
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return absl::UnimplementedError(
      Str("unsupported tokenizer component: Split behavior '", b, "'"));
}

// Hugging Face's split-with-delimiter behaviours over the matches of `regex` in `text`.
void SplitByMatches(std::string_view text, const SplitRegex& regex, Behavior behavior, bool invert,
                    std::vector<std::string>* out) {
  std::vector<std::pair<std::string_view, bool>> parts;  // (span, is delimiter)
  size_t last = 0;
  for (const auto& [b, e] : regex.FindAll(text)) {
    if (b > last) parts.emplace_back(text.substr(last, b - last), invert);
    parts.emplace_back(text.substr(b, e - b), !invert);
    last = e;
  }
  if (last < text.size()) parts.emplace_back(text.substr(last), invert);
  // Each behaviour as Hugging Face tokenizers folds (offsets, is_match) pairs.
  std::vector<std::string> pieces;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& [span, delim] : parts) pieces.emplace_back(span);
      break;
    case Behavior::kRemoved:
      for (const auto& [span, delim] : parts) {
        if (!delim) pieces.emplace_back(span);
      }
      break;
    case Behavior::kMergedWithPrevious:  // A delimiter joins the piece before it (not a delimiter).
      for (const auto& [span, delim] : parts) {
        if (delim && !previous_match && !pieces.empty()) {
          pieces.back().append(span);
        } else {
          pieces.emplace_back(span);
        }
        previous_match = delim;
      }
      break;
    case Behavior::kMergedWithNext:  // A delimiter joins the piece after it (not a delimiter).
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !previous_match && !pieces.empty()) {
          pieces.back().insert(0, it->first);
        } else {
          pieces.emplace_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case Behavior::kContiguous:  // Runs of delimiters become one piece.
      for (const auto& [span, delim] : parts) {
        if (delim == previous_match && !pieces.empty()) {
          pieces.back().append(span);
        } else {
          pieces.emplace_back(span);
        }
        previous_match = delim;
      }
      break;
  }
  for (auto& p : pieces) {
    if (!p.empty()) out->push_back(std::move(p));
  }
}

}  // namespace

struct PreTokenizer::Step {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind;
  std::unique_ptr<SplitRegex> regex;  // kSplit, or kByteLevel with use_regex, or Metaspace split.
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;        // kMetaspace
  std::string prepend_scheme;     // kMetaspace: always | first | never

  void Apply(std::string& piece, bool first_section, std::vector<std::string>* out) const {
    switch (kind) {
      case Kind::kSplit:
        SplitByMatches(piece, *regex, behavior, invert, out);
        return;
      case Kind::kByteLevel: {
        if (add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
        if (!regex) {
          out->push_back(BytesToByteLevel(piece));
          return;
        }
        std::vector<std::string> words;
        SplitByMatches(piece, *regex, Behavior::kIsolated, false, &words);
        for (const std::string& w : words) out->push_back(BytesToByteLevel(w));
        return;
      }
      case Kind::kMetaspace: {
        std::string s;
        s.reserve(piece.size() + replacement.size());
        for (char c : piece) {
          if (c == ' ') {
            s += replacement;
          } else {
            s.push_back(c);
          }
        }
        const bool prepend = prepend_scheme == "always" || (prepend_scheme == "first" && first_section);
        if (prepend && s.compare(0, replacement.size(), replacement) != 0) s = replacement + s;
        if (!regex) {
          out->push_back(std::move(s));
          return;
        }
        SplitByMatches(s, *regex, Behavior::kMergedWithNext, false, out);
        return;
      }
    }
  }
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Parse(const Json& j) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  PD_RETURN_IF_ERROR(ParseInto(j, p.get()));
  return p;
}

absl::Status PreTokenizer::ParseInto(const Json& j, PreTokenizer* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.is_object() ? j.value("type", std::string()) : std::string();
  auto step = std::make_unique<Step>();
  if (type == "Sequence") {
    for (const Json& sub : j.value("pretokenizers", Json::array())) {
      PD_RETURN_IF_ERROR(ParseInto(sub, out));
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step->kind = Step::Kind::kByteLevel;
    step->add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      PD_ASSIGN_OR_RETURN(step->regex, SplitRegex::Create(kGpt2SplitPattern));
    }
    out->byte_level_ = true;
  } else if (type == "Split") {
    step->kind = Step::Kind::kSplit;
    const Json& pat = j.value("pattern", Json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      PD_ASSIGN_OR_RETURN(step->regex, SplitRegex::Create(pat["Regex"].get<std::string>()));
    } else if (pat.contains("String") && pat["String"].is_string()) {
      PD_ASSIGN_OR_RETURN(step->regex, SplitRegex::Create(RE2::QuoteMeta(pat["String"].get<std::string>())));
    } else {
      return absl::InvalidArgumentError("Split pre-tokenizer without a pattern");
    }
    PD_ASSIGN_OR_RETURN(step->behavior, ParseBehavior(j.value("behavior", Json())));
    step->invert = j.value("invert", false);
  } else if (type == "Metaspace") {
    step->kind = Step::Kind::kMetaspace;
    step->replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      step->prepend_scheme = j["prepend_scheme"].get<std::string>();
    } else {
      step->prepend_scheme = j.value("add_prefix_space", true) ? "always" : "never";
    }
    if (step->prepend_scheme != "always" && step->prepend_scheme != "first" &&
        step->prepend_scheme != "never") {
      return absl::UnimplementedError(
          Str("unsupported Metaspace prepend_scheme '", step->prepend_scheme, "'"));
    }
    if (j.value("split", true)) {
      PD_ASSIGN_OR_RETURN(step->regex, SplitRegex::Create(RE2::QuoteMeta(step->replacement)));
    }
  } else {
    return absl::UnimplementedError(Str("unsupported tokenizer component: pre_tokenizer '", type,
                                        "' (supported: ByteLevel, Split, Metaspace, Sequence)"));
  }
  out->steps_.push_back(std::move(step));
  return absl::OkStatus();
}

void PreTokenizer::Split(std::string_view text, bool first_section,
                         std::vector<std::string>* words) const {
  if (steps_.empty()) {
    words->emplace_back(text);
    return;
  }
  std::vector<std::string> pieces{std::string(text)};
  std::vector<std::string> next;
  for (const auto& step : steps_) {
    next.clear();
    for (std::string& piece : pieces) step->Apply(piece, first_section, &next);
    pieces.swap(next);
  }
  for (std::string& p : pieces) words->push_back(std::move(p));
}

}  // namespace pdserve
