#include "common/model/gguf_tokenizer.h"

#include <string_view>

#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/model/gguf_model.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

// std::map objects: a vocabulary of 150k keys (ordered_json finds a key by a linear search).
using Json = nlohmann::json;

// llama.cpp's token types.
constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4;

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

}  // namespace

absl::StatusOr<TokenizerFiles> TokenizerFilesFromGguf(const GgufFile& g) {
  const GgufValue* model = g.Find("tokenizer.ggml.model");
  if (model == nullptr || (model->type == GgufValueType::kString && model->s == "no_vocab")) {
    return absl::NotFoundError(Str(g.source(), ": the file holds no vocabulary (pass --tokenizer "
                                               "DIR, or send token ids)"));
  }
  PD_ASSIGN_OR_RETURN(const std::string kind, g.GetString("tokenizer.ggml.model"));
  if (kind != "gpt2") {
    return absl::InvalidArgumentError(
        Str(g.source(), ": tokenizer.ggml.model '", kind,
            "' is not read from GGUF (byte-level BPE, 'gpt2', is): pass the model's tokenizer "
            "directory (--tokenizer DIR)"));
  }
  const auto* tokens = Array(g, "tokenizer.ggml.tokens", GgufValueType::kString);
  const auto* merges = Array(g, "tokenizer.ggml.merges", GgufValueType::kString);
  if (tokens == nullptr || merges == nullptr) {
    return absl::InvalidArgumentError(Str(g.source(), ": tokenizer.ggml.tokens and "
                                                      "tokenizer.ggml.merges must be string arrays"));
  }
  const GgufValue* types = g.Find("tokenizer.ggml.token_type");
  if (types != nullptr && (types->type != GgufValueType::kArray || !types->array.empty()) &&
      (types->type != GgufValueType::kArray || types->array.size() != tokens->size() ||
       !types->array[0].is_integer())) {
    return absl::InvalidArgumentError(Str(g.source(), ": tokenizer.ggml.token_type must hold one "
                                                      "integer per token"));
  }
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
    const int64_t type = types != nullptr ? types->array[id].i : kNormal;
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id}, {"content", t}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", type == kUserDefined},
                       {"special", type == kControl}});
    } else if (!vocab.contains(t)) {
      vocab[t] = id;
    }
  }
  Json merge_list = Json::array();
  for (const GgufValue& m : *merges) merge_list.push_back(m.s);
  Json config = Json::object();
  auto token_of = [&](const char* key) -> std::optional<std::string> {
    auto id = g.GetUint(key);
    if (!id.ok() || *id >= tokens->size()) return std::nullopt;
    return (*tokens)[*id].s;
  };
  const std::optional<std::string> bos = token_of("tokenizer.ggml.bos_token_id");
  const std::optional<std::string> eos = token_of("tokenizer.ggml.eos_token_id");
  if (bos) config["bos_token"] = *bos;
  if (eos) config["eos_token"] = *eos;
  if (auto tmpl = GgufChatTemplate(g); tmpl.ok()) config["chat_template"] = *tmpl;
  // BOS (and EOS) around the text when special tokens are added, as llama.cpp does.
  const bool add_bos = g.GetBool("tokenizer.ggml.add_bos_token").value_or(false);
  const bool add_eos = g.GetBool("tokenizer.ggml.add_eos_token").value_or(false);
  Json post = nullptr;
  if ((add_bos && bos) || (add_eos && eos)) {
    Json single = Json::array();
    Json specials = Json::object();
    if (add_bos && bos) {
      single.push_back({{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}});
      specials[*bos] = {{"id", *bos}, {"ids", {*g.GetUint("tokenizer.ggml.bos_token_id")}},
                        {"tokens", {*bos}}};
    }
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos && eos) {
      single.push_back({{"SpecialToken", {{"id", *eos}, {"type_id", 0}}}});
      specials[*eos] = {{"id", *eos}, {"ids", {*g.GetUint("tokenizer.ggml.eos_token_id")}},
                        {"tokens", {*eos}}};
    }
    post = {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
  }
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
  return TokenizerFiles{tokenizer.dump(), config.dump()};
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

absl::Status WriteGgufTokenizer(const std::string& dir, bool bos_eos, GgufWriter* w) {
  const std::string path = JoinPath(dir, "tokenizer.json");
  PD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  const Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(Str(path, ": not JSON"));
  Json config = Json::object();
  if (auto c = ReadFileToString(JoinPath(dir, "tokenizer_config.json")); c.ok()) {
    config = Json::parse(*c, nullptr, false);
    if (config.is_discarded() || !config.is_object()) config = Json::object();
  }
  const Json& model = j.value("model", Json::object());
  if (model.value("type", "") != "BPE" || model.value("byte_fallback", false)) {
    return absl::InvalidArgumentError(Str(path, ": only byte-level BPE tokenizers are written to "
                                                "GGUF"));
  }
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
  // Tokens by id: the vocabulary, then the added tokens (control when special).
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  auto put = [&](int64_t id, const std::string& t, int32_t type) {
    if (id < 0 || id > (1 << 22)) return;
    if (static_cast<size_t>(id) >= tokens.size()) {
      for (size_t i = tokens.size(); i <= static_cast<size_t>(id); ++i) {
        tokens.push_back(Str("[PAD", i, "]"));
        types.push_back(static_cast<int32_t>(kUserDefined));
      }
    }
    tokens[static_cast<size_t>(id)] = t;
    types[static_cast<size_t>(id)] = type;
  };
  const Json vocab = model.value("vocab", Json::object());  // items() must not outlive it.
  for (const auto& [t, id] : vocab.items()) {
    if (id.is_number_integer()) put(id.get<int64_t>(), t, static_cast<int32_t>(kNormal));
  }
  for (const Json& a : j.value("added_tokens", Json::array())) {
    put(a.value("id", int64_t{-1}), a.value("content", ""),
        static_cast<int32_t>(a.value("special", false) ? kControl : kUserDefined));
  }
  std::vector<std::string> merges;
  for (const Json& m : model.value("merges", Json::array())) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2) {
      merges.push_back(Str(m[0].get<std::string>(), " ", m[1].get<std::string>()));
    }
  }
  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    if (!config.contains(key)) return std::nullopt;
    const Json& v = config[key];
    const std::string s = v.is_string() ? v.get<std::string>()
                          : v.is_object() ? v.value("content", "") : "";
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == s) return static_cast<int64_t>(i);
    }
    return std::nullopt;
  };
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", pre);
  w->SetStringArray("tokenizer.ggml.tokens", tokens);
  w->SetInt32Array("tokenizer.ggml.token_type", types);
  w->SetStringArray("tokenizer.ggml.merges", merges);
  if (bos_eos) {
    if (auto bos = id_of("bos_token")) w->SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*bos));
    if (auto eos = id_of("eos_token")) w->SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*eos));
  }
  // Whether encoding adds BOS: the post-processor's template, or the Llama flag.
  bool add_bos = false;
  const Json& pp = j.value("post_processor", Json());
  if (pp.is_object() && pp.value("type", "") == "TemplateProcessing") {
    const Json& single = pp.value("single", Json::array());
    add_bos = !single.empty() && single[0].contains("SpecialToken");
  } else if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    add_bos = config["add_bos_token"].get<bool>();
  }
  w->SetBool("tokenizer.ggml.add_bos_token", add_bos);
  w->SetBool("tokenizer.ggml.add_eos_token", false);
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    w->SetString("tokenizer.chat_template", config["chat_template"].get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace pdserve
