#include "common/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "common/base/strings.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
  bool lstrip;
  bool rstrip;
  bool single_word;
};

// One step of the pre-tokenizer pipeline.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  Kind kind;
  std::unique_ptr<SplitRegex> regex;  // kSplit, or kByteLevel with use_regex.
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
};

// Template item: a fixed special token's ids, or the encoded sequence.
struct TemplateItem {
  bool is_sequence;
  std::vector<int32_t> ids;
};

absl::Status Unsupported(std::string_view source, std::string_view what) {
  return absl::UnimplementedError(Str(source, ": unsupported tokenizer component: ", what,
                                               " (supported: BPE model, ByteLevel and Split "
                                               "pre-tokenizers, ByteLevel decoder)"));
}

std::string TypeOf(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? j["type"].get<std::string>()
             : std::string("<no type>");
}

// Splits piece [begin, end) of `text` by the matches of `regex`, with HF's delimiter behaviours.
void SplitPiece(std::string_view text, const PreTokenizerStep& step,
                std::vector<std::string>* out) {
  std::vector<std::pair<std::string_view, bool>> parts;  // (span, is_match)
  size_t last = 0;
  for (const auto& [b, e] : step.regex->FindAll(text)) {
    if (b > last) parts.emplace_back(text.substr(last, b - last), false);
    parts.emplace_back(text.substr(b, e - b), true);
    last = e;
  }
  if (last < text.size()) parts.emplace_back(text.substr(last), false);
  if (step.invert) {
    for (auto& p : parts) p.second = !p.second;
  }
  using B = PreTokenizerStep::Behavior;
  std::vector<std::string> pieces;
  bool pending_next = false;  // MergedWithNext: the last piece waits for the next one.
  for (const auto& [span, is_match] : parts) {
    switch (step.behavior) {
      case B::kIsolated:
        pieces.emplace_back(span);
        break;
      case B::kRemoved:
        if (!is_match) pieces.emplace_back(span);
        break;
      case B::kMergedWithPrevious:
        if (is_match && !pieces.empty()) {
          pieces.back().append(span);
        } else {
          pieces.emplace_back(span);
        }
        break;
      case B::kMergedWithNext:
        if (pending_next) {
          pieces.back().append(span);
        } else {
          pieces.emplace_back(span);
        }
        pending_next = is_match;
        break;
      case B::kContiguous:
        if (is_match && pending_next) {
          pieces.back().append(span);
        } else {
          pieces.emplace_back(span);
        }
        pending_next = is_match;
        break;
    }
  }
  for (auto& p : pieces) {
    if (!p.empty()) out->push_back(std::move(p));
  }
}

absl::StatusOr<PreTokenizerStep::Behavior> ParseBehavior(const Json& j, std::string_view source) {
  const std::string b = j.is_string() ? j.get<std::string>() : "";
  using B = PreTokenizerStep::Behavior;
  if (b == "Isolated") return B::kIsolated;
  if (b == "Removed") return B::kRemoved;
  if (b == "MergedWithPrevious") return B::kMergedWithPrevious;
  if (b == "MergedWithNext") return B::kMergedWithNext;
  if (b == "Contiguous") return B::kContiguous;
  return Unsupported(source, Str("Split behavior '", b, "'"));
}

absl::Status ParsePreTokenizer(const Json& j, std::string_view source,
                               std::vector<PreTokenizerStep>* steps) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return absl::InvalidArgumentError(Str(source, ": Sequence without pretokenizers"));
    }
    for (const Json& sub : j["pretokenizers"]) {
      PD_RETURN_IF_ERROR(ParsePreTokenizer(sub, source, steps));
    }
    return absl::OkStatus();
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      PD_ASSIGN_OR_RETURN(step.regex, SplitRegex::Create(kGpt2SplitPattern));
    }
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    if (!j.contains("pattern") || !j["pattern"].is_object()) {
      return absl::InvalidArgumentError(Str(source, ": Split without a pattern"));
    }
    const Json& pat = j["pattern"];
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      PD_ASSIGN_OR_RETURN(step.regex, SplitRegex::Create(pat["Regex"].get<std::string>()));
    } else if (pat.contains("String") && pat["String"].is_string()) {
      PD_ASSIGN_OR_RETURN(step.regex,
                          SplitRegex::Create(RE2::QuoteMeta(pat["String"].get<std::string>())));
    } else {
      return absl::InvalidArgumentError(Str(source, ": Split pattern has no Regex"));
    }
    PD_ASSIGN_OR_RETURN(step.behavior, ParseBehavior(j["behavior"], source));
    step.invert = j.value("invert", false);
  } else {
    return Unsupported(source, Str("pre_tokenizer '", type, "'"));
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

// The token string of a config entry like "bos_token": "<s>" or {"content": "<s>", ...}.
std::optional<std::string> ConfigTokenString(const Json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::optional<BpeModel> bpe;
  std::vector<AddedToken> added;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  std::unique_ptr<RE2> added_matcher;  // Alternation of all added tokens, longest first.
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool byte_level_decoder = false;
  std::vector<TemplateItem> single_template;  // Empty: no post-processing.
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  int32_t vocab_size = 0;

  absl::Status EncodeSegment(std::string_view text, std::vector<int32_t>* ids) const;
  std::optional<int32_t> Lookup(std::string_view token) const {
    auto it = added_by_content.find(AsAbsl(token));
    if (it != added_by_content.end()) return it->second;
    return bpe->IdOf(token);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::string json_path = path;
  std::string dir;
  if (IsDirectory(path)) {
    dir = path;
    json_path = JoinPath(path, "tokenizer.json");
  } else {
    const size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  PD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(json_path));
  std::string config_text;
  const std::string config_path = JoinPath(dir, "tokenizer_config.json");
  if (FileExists(config_path)) {
    PD_ASSIGN_OR_RETURN(config_text, ReadFileToString(config_path));
  }
  return FromJson(text, config_text, json_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  Json j = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(Str(source, ": not a JSON object"));
  }
  Json config = Json::object();
  if (!config_json.empty()) {
    config = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          Str(source, ": tokenizer_config.json is not a JSON object"));
    }
  }

  // Model.
  if (!j.contains("model") || !j["model"].is_object()) {
    return absl::InvalidArgumentError(Str(source, ": no 'model' object"));
  }
  const Json& model = j["model"];
  const std::string model_type = model.contains("type") ? TypeOf(model) : "BPE";
  if (model_type != "BPE") return Unsupported(source, Str("model '", model_type, "'"));
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(Str(source, ": model has no 'vocab' object"));
  }
  absl::flat_hash_map<std::string, int32_t> vocab;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) {
      return absl::InvalidArgumentError(
          Str(source, ": vocab entry '", it.key(), "' has a non-integer id"));
    }
    vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    for (const Json& m : model["merges"]) {
      if (m.is_string()) {  // "a b"
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) {
          return absl::InvalidArgumentError(Str(source, ": bad merge '", s, "'"));
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return absl::InvalidArgumentError(Str(source, ": bad merge ", m.dump()));
      }
    }
  }
  BpeModel::Options options;
  options.ignore_merges = model.value("ignore_merges", false);
  options.byte_fallback = model.value("byte_fallback", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    options.unk_token = model["unk_token"].get<std::string>();
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return Unsupported(source, Str("BPE ", key));
    }
  }
  auto bpe = BpeModel::Create(std::move(vocab), merges, options);
  if (!bpe.ok()) {
    return absl::InvalidArgumentError(Str(source, ": ", bpe.status().message()));
  }
  impl->bpe.emplace(std::move(*bpe));
  impl->vocab_size = impl->bpe->max_id() + 1;

  // Added tokens.
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const Json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        return absl::InvalidArgumentError(Str(source, ": bad added token ", t.dump()));
      }
      AddedToken a{t["id"].get<int32_t>(), t["content"].get<std::string>(),
                   t.value("special", false), t.value("lstrip", false), t.value("rstrip", false),
                   t.value("single_word", false)};
      if (a.id < 0 || a.content.empty()) {
        return absl::InvalidArgumentError(Str(source, ": bad added token ", t.dump()));
      }
      impl->vocab_size = std::max(impl->vocab_size, a.id + 1);
      impl->added_by_id[a.id] = impl->added.size();
      impl->added_by_content[a.content] = a.id;
      impl->added.push_back(std::move(a));
    }
  }
  if (!impl->added.empty()) {
    std::vector<const AddedToken*> sorted;
    for (const AddedToken& a : impl->added) sorted.push_back(&a);
    std::stable_sort(sorted.begin(), sorted.end(), [](const AddedToken* x, const AddedToken* y) {
      return x->content.size() > y->content.size();
    });
    std::vector<std::string> alternatives;
    for (const AddedToken* a : sorted) alternatives.push_back(RE2::QuoteMeta(a->content));
    RE2::Options re_options;
    re_options.set_log_errors(false);
    re_options.set_max_mem(256 << 20);
    impl->added_matcher = std::make_unique<RE2>(
        Str("(", absl::StrJoin(alternatives, "|"), ")"), re_options);
    if (!impl->added_matcher->ok()) {
      return absl::InternalError(Str(source, ": cannot build the added-token matcher: ",
                                              impl->added_matcher->error()));
    }
  }

  // Normalizer, pre-tokenizer, decoder.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    return Unsupported(source, Str("normalizer '", TypeOf(j["normalizer"]), "'"));
  }
  PD_RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", Json()), source,
                                       &impl->pre_tokenizer));
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    const std::string type = TypeOf(j["decoder"]);
    if (type != "ByteLevel") return Unsupported(source, Str("decoder '", type, "'"));
    impl->byte_level_decoder = true;
  }
  bool has_byte_level_pre = false;
  for (const auto& s : impl->pre_tokenizer) {
    has_byte_level_pre |= s.kind == PreTokenizerStep::Kind::kByteLevel;
  }
  if (!has_byte_level_pre) {
    return Unsupported(source, "a BPE model without a ByteLevel pre-tokenizer (SentencePiece-"
                               "style BPE comes with the tokenizer issue)");
  }

  // Post-processor: TemplateProcessing's "single" template.
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    std::vector<const Json*> processors;
    const Json& pp = j["post_processor"];
    if (TypeOf(pp) == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
      for (const Json& p : pp["processors"]) processors.push_back(&p);
    } else {
      processors.push_back(&pp);
    }
    for (const Json* p : processors) {
      const std::string type = TypeOf(*p);
      if (type == "ByteLevel") continue;  // Offsets only; ids unchanged.
      if (type != "TemplateProcessing") {
        return Unsupported(source, Str("post_processor '", type, "'"));
      }
      const Json& specials = p->value("special_tokens", Json::object());
      for (const Json& item : p->value("single", Json::array())) {
        if (item.contains("Sequence")) {
          impl->single_template.push_back({true, {}});
        } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
          const std::string name = item["SpecialToken"]["id"].get<std::string>();
          TemplateItem t{false, {}};
          if (specials.contains(name) && specials[name].contains("ids")) {
            for (const Json& id : specials[name]["ids"]) t.ids.push_back(id.get<int32_t>());
          } else if (auto id = impl->Lookup(name)) {
            t.ids.push_back(*id);
          } else {
            return absl::InvalidArgumentError(
                Str(source, ": post_processor names unknown special token '", name, "'"));
          }
          impl->single_template.push_back(std::move(t));
        }
      }
    }
  }

  if (auto bos = ConfigTokenString(config, "bos_token")) impl->bos_id = impl->Lookup(*bos);
  if (auto eos = ConfigTokenString(config, "eos_token")) impl->eos_id = impl->Lookup(*eos);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::Status Tokenizer::Impl::EncodeSegment(std::string_view text,
                                            std::vector<int32_t>* ids) const {
  std::vector<std::string> pieces{std::string(text)};
  for (const PreTokenizerStep& step : pre_tokenizer) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (step.kind == PreTokenizerStep::Kind::kSplit) {
        SplitPiece(piece, step, &next);
        continue;
      }
      // ByteLevel: optional prefix space and GPT-2 split, then the byte-to-character map.
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
      std::vector<std::string> split;
      if (step.regex) {
        SplitPiece(piece, step, &split);
      } else {
        split.push_back(std::move(piece));
      }
      for (const std::string& s : split) next.push_back(BytesToByteLevel(s));
    }
    pieces = std::move(next);
  }
  for (const std::string& word : pieces) PD_RETURN_IF_ERROR(bpe->EncodeWord(word, ids));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens) const {
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return absl::InvalidArgumentError(
        Str("text is not valid UTF-8 (first bad byte at offset ", bad, ")"));
  }
  std::vector<int32_t> ids;
  // Split out added tokens first; the text between them goes through the model.
  size_t pos = 0;
  if (impl_->added_matcher) {
    re2::StringPiece input(text.data(), text.size());
    re2::StringPiece match;
    while (pos < text.size() &&
           impl_->added_matcher->Match(input, pos, text.size(), RE2::UNANCHORED, &match, 1)) {
      size_t begin = match.data() - text.data();
      size_t end = begin + match.size();
      const AddedToken& tok = impl_->added[impl_->added_by_id.at(
          impl_->added_by_content.at(std::string(match.data(), match.size())))];
      size_t seg_end = begin;
      if (tok.lstrip) {
        while (seg_end > pos && IsUnicodeWhitespace(static_cast<uint8_t>(text[seg_end - 1]))) {
          --seg_end;
        }
      }
      if (tok.rstrip) {
        while (end < text.size() && IsUnicodeWhitespace(static_cast<uint8_t>(text[end]))) ++end;
      }
      PD_RETURN_IF_ERROR(impl_->EncodeSegment(text.substr(pos, seg_end - pos), &ids));
      ids.push_back(tok.id);
      pos = end;
    }
  }
  if (pos < text.size()) PD_RETURN_IF_ERROR(impl_->EncodeSegment(text.substr(pos), &ids));
  if (!add_special_tokens || impl_->single_template.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + 4);
  for (const TemplateItem& item : impl_->single_template) {
    if (item.is_sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    auto added = impl_->added_by_id.find(id);
    if (added != impl_->added_by_id.end()) {
      const AddedToken& tok = impl_->added[added->second];
      if (skip_special_tokens && tok.special) continue;
      joined += tok.content;
      continue;
    }
    const std::string* token = impl_->bpe->TokenOf(id);
    if (token == nullptr) {
      return absl::InvalidArgumentError(Str("token id ", id, " at position ", i,
                                                     " is outside the vocabulary (size ",
                                                     impl_->vocab_size, ")"));
    }
    joined += *token;
  }
  if (impl_->byte_level_decoder) return Utf8Lossy(ByteLevelToBytes(joined));
  return joined;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  const std::string* t = impl_->bpe->TokenOf(id);
  if (t == nullptr) return std::nullopt;
  return *t;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  return impl_->Lookup(token);
}

}  // namespace pdserve
