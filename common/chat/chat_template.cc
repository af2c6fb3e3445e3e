#include "common/chat/chat_template.h"

#include "common/base/file_util.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

// bos_token / eos_token: a string, or an AddedToken object {"content": ...}.
std::string TokenText(const nlohmann::ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(const std::string& source, std::string bos_token,
                                                      std::string eos_token) {
  if (source.size() > kMaxSourceBytes) {
    return absl::InvalidArgumentError(Str("chat template: ", source.size(), " bytes, more than ", kMaxSourceBytes,
                                          " (released templates are tens of KB)"));
  }
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status();
  ChatTemplate c;
  c.template_ = std::move(*t);
  c.bos_token_ = std::move(bos_token);
  c.eos_token_ = std::move(eos_token);
  return c;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& model_dir,
                                                const std::string& override_path) {
  const std::string config_path = JoinPath(model_dir, "tokenizer_config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (FileExists(config_path)) {
    auto text = ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(Str(config_path, ": not a JSON object"));
    }
  }
  std::string source;
  if (!override_path.empty()) {
    auto text = ReadFileToString(override_path);
    if (!text.ok()) return text.status();
    source = *text;
  } else {
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) {
      return absl::NotFoundError(Str(config_path, " has no chat_template (give one with --chat-template)"));
    }
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array() && !it->empty()) {
      const nlohmann::ordered_json* pick = &(*it)[0];
      for (const auto& t : *it) {
        if (t.is_object() && t.value("name", "") == "default") pick = &t;
      }
      if (!pick->is_object() || !(*pick)["template"].is_string()) {
        return absl::InvalidArgumentError(Str(config_path, ": chat_template entries need a 'template' string"));
      }
      source = (*pick)["template"].get<std::string>();
    } else {
      return absl::InvalidArgumentError(Str(config_path, ": chat_template must be a string or a list"));
    }
  }
  auto c = FromSource(source, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
  if (!c.ok()) {
    return absl::InvalidArgumentError(Str(override_path.empty() ? config_path : override_path, ": ",
                                          c.status().message()));
  }
  return c;
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& extra) const {
  jinja::Dict vars;
  vars.emplace_back("messages", jinja::Value::FromJson(messages));
  vars.emplace_back("tools", tools.is_null() ? jinja::Value::None() : jinja::Value::FromJson(tools));
  vars.emplace_back("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  vars.emplace_back("bos_token", jinja::Value::String(bos_token_));
  vars.emplace_back("eos_token", jinja::Value::String(eos_token_));
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      vars.emplace_back(it.key(), jinja::Value::FromJson(it.value()));
    }
  }
  return template_.Render(jinja::Value::MakeDict(std::move(vars)));
}

}  // namespace pdserve
