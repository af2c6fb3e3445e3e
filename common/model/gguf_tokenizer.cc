#include "common/model/gguf_tokenizer.h"

#include <optional>
#include <string_view>
#include <vector>

#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/model/gguf_model.h"
#include "common/model/gguf_sentencepiece.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

// std::map objects: a vocabulary of 150k keys (ordered_json finds a key by a linear search).
using Json = nlohmann::json;

// A GGUF piece's type (tokenizer.ggml.token_type; PieceType's values), normal when absent.
PieceType TypeAt(const std::vector<GgufValue>* types, size_t id) {
  return static_cast<PieceType>(types != nullptr ? (*types)[id].i : 1);
}

int32_t TypeId(PieceType t) { return static_cast<int32_t>(t); }

// The pre-tokenizers llama.cpp names in tokenizer.ggml.pre, as tokenizer.json writes them.
constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

Json SplitThenByteLevel(std::string_view regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           Json::array({{{"type", "Split"},
                         {"pattern", {{"Regex", std::string(regex)}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", false},
                         {"use_regex", false}}})}};
}

// tokenizer.ggml.pre -> (pre_tokenizer, normalizer, BPE ignore_merges).
absl::Status PreTokenizer(const std::string& pre, std::string_view source, Json* pre_tokenizer,
                          Json* normalizer, bool* ignore_merges) {
  *normalizer = nullptr;
  *ignore_merges = false;
  if (pre == "llama-bpe" || pre == "llama3") {
    *pre_tokenizer = SplitThenByteLevel(kLlama3Regex);
    *ignore_merges = true;
  } else if (pre == "qwen2") {
    *pre_tokenizer = SplitThenByteLevel(kQwen2Regex);
    *normalizer = {{"type", "NFC"}};
  } else if (pre == "gpt-2" || pre == "default") {
    *pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                      {"use_regex", true}};
  } else {
    return absl::InvalidArgumentError(
        Str(source, ": tokenizer.ggml.pre '", pre,
            "' is not supported (llama-bpe, qwen2, gpt-2): pass the model's tokenizer "
            "directory (--tokenizer DIR)"));
  }
  return absl::OkStatus();
}

const std::vector<GgufValue>* Array(const GgufFile& g, std::string_view key,
                                    GgufValueType element) {
  const GgufValue* v = g.Find(key);
  if (v == nullptr || v->type != GgufValueType::kArray || v->element_type != element) return nullptr;
  return &v->array;
}

// The token a tokenizer.ggml.*_token_id key names, or `fallback`'s token when the key is absent
// (llama.cpp's defaults for SentencePiece vocabularies); nullopt when neither names one.
std::optional<std::string> TokenOf(const GgufFile& g, const std::vector<GgufValue>& tokens,
                                   const char* key, std::optional<uint64_t> fallback) {
  auto id = g.GetUint(key);
  const std::optional<uint64_t> pick =
      id.ok() ? std::optional<uint64_t>(*id) : (g.Find(key) == nullptr ? fallback : std::nullopt);
  if (!pick || *pick >= tokens.size()) return std::nullopt;
  return tokens[*pick].s;
}

// BOS (and EOS) around the text when special tokens are added, as llama.cpp does; null when
// neither is added. `default_bos`: whether a file without tokenizer.ggml.add_bos_token adds it.
Json PostProcessor(const GgufFile& g, const std::optional<std::string>& bos,
                   const std::optional<std::string>& eos, bool default_bos) {
  const bool add_bos = g.GetBool("tokenizer.ggml.add_bos_token").value_or(default_bos) && bos;
  const bool add_eos = g.GetBool("tokenizer.ggml.add_eos_token").value_or(false) && eos;
  if (!add_bos && !add_eos) return nullptr;
  Json single = Json::array();
  Json specials = Json::object();
  auto special = [&](const std::string& token, const char* key, uint64_t fallback) {
    single.push_back({{"SpecialToken", {{"id", token}, {"type_id", 0}}}});
    specials[token] = {
        {"id", token}, {"ids", {g.GetUint(key).value_or(fallback)}}, {"tokens", {token}}};
  };
  if (add_bos) special(*bos, "tokenizer.ggml.bos_token_id", 1);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) special(*eos, "tokenizer.ggml.eos_token_id", 2);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
}

// `clean_spaces`: whether decoding cleans up spaces before punctuation (transformers'
// clean_up_tokenization_spaces), which GGUF does not record: llama.cpp's choice for the vocabulary
// (on for byte-level BPE but Qwen2's, off for SentencePiece), which is what those models'
// tokenizer_config.json files say.
Json TokenizerConfig(const GgufFile& g, const std::optional<std::string>& bos,
                     const std::optional<std::string>& eos, const std::optional<std::string>& unk,
                     bool clean_spaces) {
  Json config = {{"clean_up_tokenization_spaces", clean_spaces}};
  if (bos) config["bos_token"] = *bos;
  if (eos) config["eos_token"] = *eos;
  if (unk) config["unk_token"] = *unk;
  if (auto tmpl = GgufChatTemplate(g); tmpl.ok()) config["chat_template"] = *tmpl;
  return config;
}

Json AddedToken(size_t id, const std::string& content, bool special, bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

// An optional per-token array of `element`: null when absent, InvalidArgument naming the key when
// it is not one element per token.
absl::StatusOr<const std::vector<GgufValue>*> PerToken(const GgufFile& g, std::string_view key,
                                                       size_t count, bool numeric) {
  const GgufValue* v = g.Find(key);
  // An empty array reads as none (the per-token default).
  if (v == nullptr || (v->type == GgufValueType::kArray && v->array.empty())) return nullptr;
  if (v->type != GgufValueType::kArray || v->array.size() != count ||
      (count > 0 && (numeric ? !v->array[0].is_number() : !v->array[0].is_integer()))) {
    return absl::InvalidArgumentError(Str(g.source(), ": ", key, " must hold one ",
                                          numeric ? "number" : "integer", " per token"));
  }
  return &v->array;
}

// Every string that goes into the tokenizer's JSON must be UTF-8 (JSON cannot hold other bytes).
absl::Status CheckUtf8(const GgufFile& g, std::string_view key,
                       const std::vector<GgufValue>* strings) {
  if (strings == nullptr) return absl::OkStatus();
  for (size_t i = 0; i < strings->size(); ++i) {
    if (!IsValidUtf8((*strings)[i].s)) {
      return absl::InvalidArgumentError(Str(g.source(), ": ", key, "[", i, "] is not UTF-8"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckChatTemplateUtf8(const GgufFile& g) {
  auto tmpl = GgufChatTemplate(g);
  if (tmpl.ok() && !IsValidUtf8(*tmpl)) {
    return absl::InvalidArgumentError(Str(g.source(), ": tokenizer.chat_template is not UTF-8"));
  }
  return absl::OkStatus();
}

float NumberOf(const GgufValue& v) {
  if (!v.is_integer()) return static_cast<float>(v.f);
  return v.is_negative ? static_cast<float>(v.i) : static_cast<float>(v.u);
}

// tokenizer.ggml.model "llama": SentencePiece pieces, scores and types, as the tokenizer.json
// transformers' LlamaConverter writes for them (Llama 2's layout: BPE with byte fallback, merges
// from the scores, "▁" for spaces by normalizer).
absl::StatusOr<TokenizerFiles> SentencePieceFiles(const GgufFile& g) {
  const auto* tokens = Array(g, "tokenizer.ggml.tokens", GgufValueType::kString);
  if (tokens == nullptr) {
    return absl::InvalidArgumentError(
        Str(g.source(), ": tokenizer.ggml.tokens must be a string array"));
  }
  PD_RETURN_IF_ERROR(CheckUtf8(g, "tokenizer.ggml.tokens", tokens));
  PD_RETURN_IF_ERROR(CheckChatTemplateUtf8(g));
  PD_ASSIGN_OR_RETURN(const auto* scores,
                      PerToken(g, "tokenizer.ggml.scores", tokens->size(), /*numeric=*/true));
  PD_ASSIGN_OR_RETURN(const auto* types,
                      PerToken(g, "tokenizer.ggml.token_type", tokens->size(), /*numeric=*/false));
  if (g.GetBool("tokenizer.ggml.remove_extra_whitespaces").value_or(false)) {
    return absl::InvalidArgumentError(
        Str(g.source(),
            ": tokenizer.ggml.remove_extra_whitespaces is not supported (no "
            "tokenizer.json expresses it): pass the model's tokenizer directory "
            "(--tokenizer DIR)"));
  }
  const bool space_prefix = g.GetBool("tokenizer.ggml.add_space_prefix").value_or(true);
  std::vector<std::string> pieces;
  std::vector<float> piece_scores;
  pieces.reserve(tokens->size());
  piece_scores.reserve(tokens->size());
  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t id = 0; id < tokens->size(); ++id) {
    const std::string& t = (*tokens)[id].s;
    pieces.push_back(t);
    piece_scores.push_back(scores != nullptr ? NumberOf((*scores)[id]) : 0.0f);
    vocab[t] = id;  // A repeated piece keeps its last id, as transformers' dict does.
    const PieceType type = TypeAt(types, id);
    if (type == PieceType::kControl || type == PieceType::kUnknown) {
      added.push_back(AddedToken(id, t, /*special=*/true, /*normalized=*/false));
    } else if (type == PieceType::kUserDefined) {
      added.push_back(AddedToken(id, t, /*special=*/false, /*normalized=*/false));
    }
  }
  Json merges = Json::array();
  for (auto& [l, r] : MergesFromScores(pieces, piece_scores)) merges.push_back({l, r});

  const auto bos = TokenOf(g, *tokens, "tokenizer.ggml.bos_token_id", 1);
  const auto eos = TokenOf(g, *tokens, "tokenizer.ggml.eos_token_id", 2);
  const auto unk = TokenOf(g, *tokens, "tokenizer.ggml.unknown_token_id", 0);
  const Json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  const Json normalizer =
      space_prefix ? Json{{"type", "Sequence"},
                          {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace}}}
                   : replace;
  Json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (space_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  Json tokenizer = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", normalizer},
                    {"pre_tokenizer", nullptr},
                    {"post_processor", PostProcessor(g, bos, eos, /*default_bos=*/true)},
                    {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", unk ? Json(*unk) : Json(nullptr)},
                      {"fuse_unk", true},
                      {"byte_fallback", true},
                      {"vocab", vocab},
                      {"merges", merges}}}};
  return TokenizerFiles{tokenizer.dump(),
                        TokenizerConfig(g, bos, eos, unk, /*clean_spaces=*/false).dump()};
}

}  // namespace

absl::StatusOr<TokenizerFiles> TokenizerFilesFromGguf(const GgufFile& g) {
  const GgufValue* model = g.Find("tokenizer.ggml.model");
  if (model == nullptr || (model->type == GgufValueType::kString && model->s == "no_vocab")) {
    return absl::NotFoundError(Str(g.source(), ": the file holds no vocabulary (pass --tokenizer "
                                               "DIR, or send token ids)"));
  }
  PD_ASSIGN_OR_RETURN(const std::string kind, g.GetString("tokenizer.ggml.model"));
  if (kind == "llama") return SentencePieceFiles(g);
  if (kind != "gpt2") {
    return absl::InvalidArgumentError(
        Str(g.source(), ": tokenizer.ggml.model '", kind,
            "' is not read from GGUF ('gpt2', byte-level BPE, and 'llama', SentencePiece, are): "
            "pass the model's tokenizer directory (--tokenizer DIR)"));
  }
  const auto* tokens = Array(g, "tokenizer.ggml.tokens", GgufValueType::kString);
  const auto* merges = Array(g, "tokenizer.ggml.merges", GgufValueType::kString);
  if (tokens == nullptr || merges == nullptr) {
    return absl::InvalidArgumentError(Str(g.source(), ": tokenizer.ggml.tokens and "
                                                      "tokenizer.ggml.merges must be string arrays"));
  }
  PD_RETURN_IF_ERROR(CheckUtf8(g, "tokenizer.ggml.tokens", tokens));
  PD_RETURN_IF_ERROR(CheckUtf8(g, "tokenizer.ggml.merges", merges));
  PD_RETURN_IF_ERROR(CheckChatTemplateUtf8(g));
  PD_ASSIGN_OR_RETURN(const auto* types,
                      PerToken(g, "tokenizer.ggml.token_type", tokens->size(), /*numeric=*/false));
  std::string pre = "default";
  if (g.Find("tokenizer.ggml.pre") != nullptr) {
    PD_ASSIGN_OR_RETURN(pre, g.GetString("tokenizer.ggml.pre"));
  }
  Json pre_tokenizer, normalizer;
  bool ignore_merges = false;
  PD_RETURN_IF_ERROR(PreTokenizer(pre, g.source(), &pre_tokenizer, &normalizer, &ignore_merges));

  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t id = 0; id < tokens->size(); ++id) {
    const std::string& t = (*tokens)[id].s;
    const PieceType type = TypeAt(types, id);
    if (type == PieceType::kControl || type == PieceType::kUserDefined) {
      added.push_back(AddedToken(id, t, /*special=*/type == PieceType::kControl,
                                 /*normalized=*/type == PieceType::kUserDefined));
    } else if (!vocab.contains(t)) {
      vocab[t] = id;
    }
  }
  Json merge_list = Json::array();
  for (const GgufValue& m : *merges) merge_list.push_back(m.s);
  const auto bos = TokenOf(g, *tokens, "tokenizer.ggml.bos_token_id", std::nullopt);
  const auto eos = TokenOf(g, *tokens, "tokenizer.ggml.eos_token_id", std::nullopt);
  const Json post = PostProcessor(g, bos, eos, /*default_bos=*/false);
  Json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                   {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                 {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", ignore_merges},
                 {"vocab", vocab}, {"merges", merge_list}}}};
  return TokenizerFiles{
      tokenizer.dump(),
      TokenizerConfig(g, bos, eos, std::nullopt, /*clean_spaces=*/pre != "qwen2").dump()};
}

absl::StatusOr<std::string> GgufChatTemplate(const GgufFile& g) {
  if (g.Find("tokenizer.chat_template") == nullptr) {
    return absl::NotFoundError(Str(g.source(), ": no tokenizer.chat_template"));
  }
  return g.GetString("tokenizer.chat_template");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& path) {
  if (!IsGgufPath(path)) return Tokenizer::Load(path);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> g, GgufFile::Open(path));
  PD_ASSIGN_OR_RETURN(TokenizerFiles files, TokenizerFilesFromGguf(*g));
  return Tokenizer::FromJson(files.tokenizer_json, files.config_json,
                             Str(path, " (tokenizer.ggml.*)"));
}

namespace {

// A tokenizer.json's tokens by id (the vocabulary, then the added tokens: control when special,
// user-defined otherwise; ids nobody names are user-defined "[PADn]"), its merges, and the ids
// tokenizer_config.json names.
struct TokenTable {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<Merge> merges;
  std::optional<int64_t> IdOf(const std::string& token) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == token) return static_cast<int64_t>(i);
    }
    return std::nullopt;
  }
  std::optional<int64_t> ConfigId(const Json& config, const char* key) const {
    if (!config.contains(key)) return std::nullopt;
    const Json& v = config[key];
    const std::string s = v.is_string()   ? v.get<std::string>()
                          : v.is_object() ? v.value("content", "")
                                          : "";
    return IdOf(s);
  }
};

TokenTable ReadTokenTable(const Json& j) {
  TokenTable t;
  auto put = [&](int64_t id, const std::string& token, int32_t type) {
    if (id < 0 || id > (1 << 22)) return;
    for (size_t i = t.tokens.size(); i <= static_cast<size_t>(id); ++i) {
      t.tokens.push_back(Str("[PAD", i, "]"));
      t.types.push_back(TypeId(PieceType::kUserDefined));
    }
    t.tokens[static_cast<size_t>(id)] = token;
    t.types[static_cast<size_t>(id)] = type;
  };
  const Json& model = j.value("model", Json::object());
  const Json vocab = model.value("vocab", Json::object());  // items() must not outlive it.
  for (const auto& [token, id] : vocab.items()) {
    if (id.is_number_integer()) put(id.get<int64_t>(), token, TypeId(PieceType::kNormal));
  }
  for (const Json& a : j.value("added_tokens", Json::array())) {
    put(a.value("id", int64_t{-1}), a.value("content", ""),
        TypeId(a.value("special", false) ? PieceType::kControl : PieceType::kUserDefined));
  }
  for (const Json& m : model.value("merges", Json::array())) {
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space != std::string::npos)
        t.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      t.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return t;
}

// Whether encoding adds BOS: the post-processor's template, or the Llama flag.
bool AddsBos(const Json& j, const Json& config) {
  const Json& pp = j.value("post_processor", Json());
  if (pp.is_object() && pp.value("type", "") == "TemplateProcessing") {
    const Json& single = pp.value("single", Json::array());
    return !single.empty() && single[0].contains("SpecialToken");
  }
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    return config["add_bos_token"].get<bool>();
  }
  return false;
}

void WriteCommon(const Json& j, const Json& config, const TokenTable& t, bool bos_eos,
                 GgufWriter* w) {
  if (bos_eos) {
    if (auto bos = t.ConfigId(config, "bos_token"))
      w->SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*bos));
    if (auto eos = t.ConfigId(config, "eos_token"))
      w->SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*eos));
  }
  w->SetBool("tokenizer.ggml.add_bos_token", AddsBos(j, config));
  w->SetBool("tokenizer.ggml.add_eos_token", false);
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    w->SetString("tokenizer.chat_template", config["chat_template"].get<std::string>());
  }
}

absl::Status WriteByteLevel(const Json& j, const Json& config, bool bos_eos,
                            const std::string& path, GgufWriter* w) {
  // Which of llama.cpp's pre-tokenizers this is.
  std::string pre;
  const Json& pt = j.value("pre_tokenizer", Json());
  if (pt.is_object() && pt.value("type", "") == "ByteLevel" && pt.value("use_regex", false)) {
    pre = "gpt-2";
  } else if (pt.is_object() && pt.value("type", "") == "Sequence") {
    const Json& list = pt.value("pretokenizers", Json::array());
    if (list.size() == 2 && list[0].value("type", "") == "Split" &&
        list[0].contains("pattern") && list[0]["pattern"].contains("Regex")) {
      const std::string regex = list[0]["pattern"]["Regex"].get<std::string>();
      if (regex == kLlama3Regex) pre = "llama-bpe";
      if (regex == kQwen2Regex) pre = "qwen2";
    }
  }
  if (pre.empty()) {
    return absl::InvalidArgumentError(Str(path, ": its pre-tokenizer has no llama.cpp name "
                                                "(llama-bpe, qwen2, gpt-2)"));
  }
  const TokenTable t = ReadTokenTable(j);
  std::vector<std::string> merges;
  merges.reserve(t.merges.size());
  for (const auto& [l, r] : t.merges) merges.push_back(Str(l, " ", r));
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", pre);
  w->SetStringArray("tokenizer.ggml.tokens", t.tokens);
  w->SetInt32Array("tokenizer.ggml.token_type", t.types);
  w->SetStringArray("tokenizer.ggml.merges", merges);
  WriteCommon(j, config, t, bos_eos, w);
  return absl::OkStatus();
}

bool IsBytePiece(const std::string& t) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && hex(t[3]) && hex(t[4]) && t[5] == '>';
}

// Llama 2's layout (what SentencePieceFiles writes): normalizer Prepend("▁") + Replace(" ", "▁")
// or the Replace alone, no pre-tokenizer, BPE with byte fallback. Scores from the merges.
absl::Status WriteSentencePiece(const Json& j, const Json& config, bool bos_eos,
                                const std::string& path, GgufWriter* w) {
  auto is_replace = [](const Json& n) {
    return n.is_object() && n.value("type", "") == "Replace" && n.contains("pattern") &&
           n["pattern"].value("String", "") == " " && n.value("content", "") == "\u2581";
  };
  const Json& norm = j.value("normalizer", Json());
  bool space_prefix = false;
  bool known = is_replace(norm);
  if (norm.is_object() && norm.value("type", "") == "Sequence") {
    const Json& list = norm.value("normalizers", Json::array());
    known = list.size() == 2 && list[0].value("type", "") == "Prepend" &&
            list[0].value("prepend", "") == "\u2581" && is_replace(list[1]);
    space_prefix = known;
  }
  if (!known || !j.value("pre_tokenizer", Json()).is_null()) {
    return absl::InvalidArgumentError(
        Str(path,
            ": a SentencePiece-style tokenizer is written to GGUF in Llama 2's layout only "
            "(normalizer Prepend \"\u2581\" + Replace \" \", no pre_tokenizer)"));
  }
  TokenTable t = ReadTokenTable(j);
  const std::string unk = j["model"].value("unk_token", "");
  std::vector<PieceType> types(t.tokens.size());
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    types[i] = static_cast<PieceType>(t.types[i]);
    if (!unk.empty() && t.tokens[i] == unk) {
      types[i] = PieceType::kUnknown;
    } else if (types[i] == PieceType::kNormal && IsBytePiece(t.tokens[i])) {
      types[i] = PieceType::kByte;
    }
    t.types[i] = TypeId(types[i]);
  }
  w->SetString("tokenizer.ggml.model", "llama");
  w->SetString("tokenizer.ggml.pre", "default");
  w->SetStringArray("tokenizer.ggml.tokens", t.tokens);
  w->SetFloat32Array("tokenizer.ggml.scores", ScoresFromMerges(t.tokens, types, t.merges));
  w->SetInt32Array("tokenizer.ggml.token_type", t.types);
  w->SetBool("tokenizer.ggml.add_space_prefix", space_prefix);
  if (auto id = t.IdOf(unk); !unk.empty() && id) {
    w->SetUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*id));
  }
  WriteCommon(j, config, t, bos_eos, w);
  return absl::OkStatus();
}

absl::Status WriteGgufTokenizerUnchecked(const std::string& dir, bool bos_eos, GgufWriter* w) {
  const std::string path = JoinPath(dir, "tokenizer.json");
  PD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(Str(path, ": not JSON"));
  Json config = Json::object();
  if (auto c = ReadFileToString(JoinPath(dir, "tokenizer_config.json")); c.ok()) {
    config = Json::parse(*c, nullptr, false);
    if (config.is_discarded() || !config.is_object()) config = Json::object();
  }
  const Json& model = j.value("model", Json::object());
  if (!model.is_object() || model.value("type", "") != "BPE") {
    return absl::InvalidArgumentError(Str(path,
                                          ": only BPE tokenizers (byte-level, or "
                                          "SentencePiece-style with byte fallback) are "
                                          "written to GGUF"));
  }
  if (model.value("byte_fallback", false)) return WriteSentencePiece(j, config, bos_eos, path, w);
  return WriteByteLevel(j, config, bos_eos, path, w);
}

}  // namespace

absl::Status WriteGgufTokenizer(const std::string& dir, bool bos_eos, GgufWriter* w) {
  // The writers read the JSON through nlohmann's typed accessors, which throw on a value of
  // another type (an unk_token of null, a type that is a number): the file's error, not a crash,
  // as Tokenizer::FromJson does.
  try {
    return WriteGgufTokenizerUnchecked(dir, bos_eos, w);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        Str(JoinPath(dir, "tokenizer.json"), ": malformed tokenizer file: ", e.what()));
  }
}

}  // namespace pdserve
