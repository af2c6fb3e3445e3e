// A model's chat template (tokenizer_config.json's `chat_template`, or --chat-template FILE),
// parsed once at start-up and rendered per request with the variables Hugging Face's
// apply_chat_template gives it: messages, tools (none when absent), add_generation_prompt,
// bos_token, eos_token, and any extra ones (e.g. enable_thinking).
#ifndef PDSERVE_COMMON_CHAT_CHAT_TEMPLATE_H_
#define PDSERVE_COMMON_CHAT_CHAT_TEMPLATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja.h"
#include "nlohmann/json.hpp"

namespace pdserve {

class ChatTemplate {
 public:
  // The template of model_dir's tokenizer_config.json (a string, or the list form
  // [{"name", "template"}]: the one named "default", else the first), or the file
  // `override_path` when given. NotFound when the model has none; InvalidArgument naming the
  // construct when the template uses what the renderer does not support.
  static absl::StatusOr<ChatTemplate> Load(const std::string& model_dir,
                                           const std::string& override_path = "");
  // InvalidArgument past kMaxSourceBytes: a template is parsed into a tree many times its size.
  static absl::StatusOr<ChatTemplate> FromSource(const std::string& source, std::string bos_token,
                                                 std::string eos_token);
  static constexpr size_t kMaxSourceBytes = size_t{1} << 20;

  // messages: a JSON list of {role, content, ...}; tools: a list or null; extra: an object of
  // further variables. InvalidArgument for a template's raise_exception and type errors.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

 private:
  jinja::Template template_;
  std::string bos_token_, eos_token_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_CHAT_CHAT_TEMPLATE_H_
