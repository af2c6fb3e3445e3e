#include "common/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_replace.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

std::string TypeOf(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? j["type"].get<std::string>()
             : std::string("<no type>");
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

// How many times shorter a normalizer (tokenizer.json's "normalizer") may make a text, or 0 when
// it may delete any amount. Unicode forms: composition takes at most 3 jamo or 3 bytes of base and
// marks into one character (bounded here by 4); lowercasing by 2; a string Replace by the ratio
// of its lengths.
size_t NormalizerShrink(const Json& j) {
  if (j.is_null()) return 1;
  const std::string type = TypeOf(j);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return 4;
  if (type == "Prepend") return 1;
  if (type == "Lowercase") return 2;
  if (type == "Replace") {
    const Json& pattern = j.value("pattern", Json::object());
    const std::string content = j.value("content", std::string());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
        content.empty()) {
      return 0;
    }
    const size_t from = pattern["String"].get<std::string>().size();
    return std::max<size_t>(1, (from + content.size() - 1) / content.size());
  }
  if (type == "Sequence") {
    size_t f = 1;
    const Json steps = j.value("normalizers", Json::array());
    if (!steps.is_array()) return 0;
    for (const Json& sub : steps) {
      const size_t g = NormalizerShrink(sub);
      if (g == 0 || f > SIZE_MAX / g) return 0;
      f *= g;
    }
    return f;
  }
  return 0;  // Strip, and anything else.
}

// Hugging Face's clean_up_tokenization: spaces before punctuation and English contractions.
std::string CleanUpTokenization(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  // One rule after the other, as transformers applies them.
  for (const auto& [from, to] : kRules) text = absl::StrReplaceAll(text, {{from, to}});
  return text;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::optional<BpeModel> bpe;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  absl::flat_hash_map<int32_t, size_t> added_by_id;
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  std::unique_ptr<AddedTokenMatcher> matcher;
  absl::flat_hash_set<int32_t> special_ids;
  // TemplateProcessing "single": fixed ids, with kSequence marking where the text goes.
  std::vector<int32_t> template_ids;
  bool has_template = false;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  bool clean_up_spaces = false;
  int32_t vocab_size = 0;
  size_t max_token_bytes = 1;  // The longest stored token string (vocab and added tokens).
  size_t shrink = 1;           // How many times shorter the normalizer may make a text (0: any).

  static constexpr int32_t kSequence = -1;

  absl::Status EncodeSection(std::string_view text, bool first, std::vector<int32_t>* ids) const;
  std::optional<int32_t> Lookup(std::string_view token) const {
    auto it = added_by_content.find(AsAbsl(token));
    if (it != added_by_content.end()) return it->second;
    return bpe->IdOf(token);
  }
  absl::Status ParsePostProcessor(const Json& pp);
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

absl::Status Tokenizer::Impl::ParsePostProcessor(const Json& pp) {
  if (pp.is_null()) return absl::OkStatus();
  std::vector<const Json*> processors;
  if (TypeOf(pp) == "Sequence") {
    for (const Json& p : pp.value("processors", Json::array())) processors.push_back(&p);
  } else {
    processors.push_back(&pp);
  }
  for (const Json* p : processors) {
    const std::string type = TypeOf(*p);
    if (type == "ByteLevel") continue;  // Offsets only; ids unchanged.
    if (type != "TemplateProcessing") {
      return absl::UnimplementedError(Str(
          source, ": unsupported tokenizer component: post_processor '", type,
          "' (supported: TemplateProcessing, ByteLevel, Sequence)"));
    }
    has_template = true;
    template_ids.clear();
    const Json& specials = p->value("special_tokens", Json::object());
    for (const Json& item : p->value("single", Json::array())) {
      if (item.contains("Sequence")) {
        template_ids.push_back(kSequence);
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        if (!item["SpecialToken"]["id"].is_string()) {
          return absl::InvalidArgumentError(
              Str(source, ": post_processor: a SpecialToken's id must be a string"));
        }
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        if (specials.contains(name) && specials[name].contains("ids")) {
          for (const Json& id : specials[name]["ids"]) template_ids.push_back(id.get<int32_t>());
        } else if (auto id = Lookup(name)) {
          template_ids.push_back(*id);
        } else {
          return absl::InvalidArgumentError(
              Str(source, ": post_processor names unknown special token '", name, "'"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               std::string_view source) {
  // The parsers check the shapes they rely on; nlohmann's typed accessors throw on the ones they
  // miss (a special token's id given as a number, found by tokenizer_json_fuzz). A malformed file
  // is the caller's error, never a crash.
  try {
    return FromJsonUnchecked(tokenizer_json, config_json, source);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(Str(source, ": malformed tokenizer file: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonUnchecked(
    std::string_view tokenizer_json, std::string_view config_json, std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::string(source);
  auto error = [&](std::string_view what) {
    return absl::InvalidArgumentError(Str(source, ": ", what));
  };
  auto with_source = [&](const absl::Status& s) {
    return absl::Status(s.code(), Str(source, ": ", s.message()));
  };
  Json j = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return error("not a JSON object");
  Json config = Json::object();
  if (!config_json.empty()) {
    config = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return error("tokenizer_config.json is not a JSON object");
    }
  }

  // Model.
  if (!j.contains("model") || !j["model"].is_object()) return error("no 'model' object");
  const Json& model = j["model"];
  const std::string model_type = model.contains("type") ? TypeOf(model) : "BPE";
  if (model_type != "BPE") {
    return absl::UnimplementedError(Str(source, ": unsupported tokenizer component: model '",
                                        model_type, "' (supported: BPE)"));
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return error("model has no 'vocab' object");
  }
  absl::flat_hash_map<std::string, int32_t> vocab;
  vocab.reserve(model["vocab"].size());
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) {
      return error(Str("vocab entry '", it.key(), "' has a non-integer id"));
    }
    vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    merges.reserve(model["merges"].size());
    for (const Json& m : model["merges"]) {
      if (m.is_string()) {  // "a b"
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) return error(Str("bad merge '", s, "'"));
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return error(Str("bad merge ", m.dump()));
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
      return absl::UnimplementedError(
          Str(source, ": unsupported tokenizer component: BPE ", key));
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0) {
    return absl::UnimplementedError(Str(source, ": unsupported tokenizer component: BPE dropout"));
  }
  auto bpe = BpeModel::Create(std::move(vocab), merges, options);
  if (!bpe.ok()) return error(std::string(bpe.status().message()));
  impl->bpe.emplace(std::move(*bpe));
  impl->vocab_size = impl->bpe->max_id() + 1;

  // Added tokens.
  for (const Json& t : j.value("added_tokens", Json::array())) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string()) {
      return error(Str("bad added token ", t.dump()));
    }
    AddedToken a{t["id"].get<int32_t>(), t["content"].get<std::string>(), t.value("special", false),
                 t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false)};
    if (a.id < 0 || a.content.empty()) return error(Str("bad added token ", t.dump()));
    impl->vocab_size = std::max(impl->vocab_size, a.id + 1);
    impl->added_by_id[a.id] = impl->added.size();
    impl->added_by_content[a.content] = a.id;
    if (a.special) impl->special_ids.insert(a.id);
    impl->added.push_back(std::move(a));
  }
  impl->matcher = std::make_unique<AddedTokenMatcher>(impl->added);

  for (int32_t id = 0; id <= impl->bpe->max_id(); ++id) {
    if (const std::string* t = impl->bpe->TokenOf(id)) {
      impl->max_token_bytes = std::max(impl->max_token_bytes, t->size());
    }
  }
  for (const AddedToken& a : impl->added) {
    impl->max_token_bytes = std::max(impl->max_token_bytes, a.content.size());
  }
  impl->shrink = NormalizerShrink(j.value("normalizer", Json()));

  // Normalizer, pre-tokenizer, decoder, post-processor.
  auto normalizer = Normalizer::Parse(j.value("normalizer", Json()));
  if (!normalizer.ok()) return with_source(normalizer.status());
  impl->normalizer = std::move(*normalizer);
  auto pre = PreTokenizer::Parse(j.value("pre_tokenizer", Json()));
  if (!pre.ok()) return with_source(pre.status());
  impl->pre_tokenizer = std::move(*pre);
  auto decoder = Decoder::Parse(j.value("decoder", Json()));
  if (!decoder.ok()) return with_source(decoder.status());
  impl->decoder = std::move(*decoder);
  PD_RETURN_IF_ERROR(impl->ParsePostProcessor(j.value("post_processor", Json())));

  // tokenizer_config.json: BOS/EOS, extra special tokens, decode clean-up.
  if (auto bos = ConfigTokenString(config, "bos_token")) impl->bos_id = impl->Lookup(*bos);
  if (auto eos = ConfigTokenString(config, "eos_token")) impl->eos_id = impl->Lookup(*eos);
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (auto s = ConfigTokenString(config, key)) {
      if (auto id = impl->Lookup(*s)) impl->special_ids.insert(*id);
    }
  }
  for (const Json& t : config.value("additional_special_tokens", Json::array())) {
    std::optional<std::string> s;
    if (t.is_string()) s = t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string()) {
      s = t["content"].get<std::string>();
    }
    if (s) {
      if (auto id = impl->Lookup(*s)) impl->special_ids.insert(*id);
    }
  }
  // Llama and Gemma tokenizers rebuild their post-processor from add_bos_token/add_eos_token
  // (transformers' update_post_processor): BOS? + text + EOS?.
  const std::string cls = config.value("tokenizer_class", std::string());
  const bool rebuilds = cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast" ||
                        cls == "CodeLlamaTokenizer" || cls == "CodeLlamaTokenizerFast" ||
                        cls == "GemmaTokenizer" || cls == "GemmaTokenizerFast";
  if (rebuilds && (config.contains("add_bos_token") || config.contains("add_eos_token"))) {
    const bool add_bos = config.value("add_bos_token", true);
    const bool add_eos = config.value("add_eos_token", false);
    if ((add_bos && !impl->bos_id) || (add_eos && !impl->eos_id)) {
      return error("tokenizer_config.json asks for a BOS/EOS token it does not name");
    }
    impl->template_ids.clear();
    if (add_bos) impl->template_ids.push_back(*impl->bos_id);
    impl->template_ids.push_back(Impl::kSequence);
    if (add_eos) impl->template_ids.push_back(*impl->eos_id);
    impl->has_template = true;
  }
  if (config.contains("clean_up_tokenization_spaces") &&
      config["clean_up_tokenization_spaces"].is_boolean()) {
    impl->clean_up_spaces = config["clean_up_tokenization_spaces"].get<bool>();
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::Status Tokenizer::Impl::EncodeSection(std::string_view text, bool first,
                                            std::vector<int32_t>* ids) const {
  if (text.empty()) return absl::OkStatus();
  std::string normalized;
  if (normalizer) {
    normalized = normalizer->Normalize(text);
    text = normalized;
    if (text.empty()) return absl::OkStatus();
  }
  std::vector<std::string> words;
  pre_tokenizer->Split(text, first, &words);
  for (const std::string& w : words) PD_RETURN_IF_ERROR(bpe->EncodeWord(w, ids));
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
  size_t pos = 0;
  AddedTokenMatcher::Match m;
  while (pos < text.size() && impl_->matcher->FindNext(text, pos, &m)) {
    PD_RETURN_IF_ERROR(impl_->EncodeSection(text.substr(pos, m.begin - pos), pos == 0, &ids));
    ids.push_back(impl_->added[m.token].id);
    pos = m.end;
  }
  if (pos < text.size()) PD_RETURN_IF_ERROR(impl_->EncodeSection(text.substr(pos), pos == 0, &ids));
  if (!add_special_tokens || !impl_->has_template) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + impl_->template_ids.size());
  for (int32_t t : impl_->template_ids) {
    if (t == Impl::kSequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.push_back(t);
    }
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              const DecodeOptions& options) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (options.skip_special_tokens && impl_->special_ids.contains(id)) continue;
    auto added = impl_->added_by_id.find(id);
    if (added != impl_->added_by_id.end()) {
      tokens.push_back(impl_->added[added->second].content);
      continue;
    }
    const std::string* token = impl_->bpe->TokenOf(id);
    if (token == nullptr) {
      return absl::InvalidArgumentError(Str("token id ", id, " at position ", i,
                                            " is outside the vocabulary (size ",
                                            impl_->vocab_size, ")"));
    }
    tokens.push_back(*token);
  }
  if (impl_->decoder) impl_->decoder->DecodeChain(&tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  if (options.clean_up_tokenization_spaces.value_or(impl_->clean_up_spaces)) {
    text = CleanUpTokenization(std::move(text));
  }
  return text;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

size_t Tokenizer::MaxTextBytes(int64_t max_tokens) const {
  if (impl_->shrink == 0 || max_tokens < 0) return SIZE_MAX;
  const unsigned __int128 bound = static_cast<unsigned __int128>(max_tokens) *
                                  impl_->max_token_bytes * impl_->shrink;
  return bound >= SIZE_MAX ? SIZE_MAX : static_cast<size_t>(bound);
}
std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }
bool Tokenizer::IsSpecial(int32_t id) const { return impl_->special_ids.contains(id); }

std::optional<std::string> Tokenizer::TokenBytes(int32_t id) const {
  if (impl_->special_ids.contains(id)) return std::nullopt;
  std::string t;
  auto added = impl_->added_by_id.find(id);
  if (added != impl_->added_by_id.end()) {
    if (impl_->added[added->second].special) return std::nullopt;
    t = impl_->added[added->second].content;
  } else {
    const std::string* token = impl_->bpe->TokenOf(id);
    if (token == nullptr) return std::nullopt;
    t = *token;
  }
  bool fused = false;
  if (impl_->decoder) impl_->decoder->MidSequence(&t, &fused);
  return t;
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
