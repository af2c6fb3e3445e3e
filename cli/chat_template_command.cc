// pdserve chat-template: renders conversations with a model's chat template (no weights needed),
// as the OpenAI chat API does before tokenizing. One JSON line in, one out.
#include <cstdio>
#include <fstream>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/strings.h"
#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"
#include "openai_api/openai_server.h"

namespace pdserve::cli {

int ChatTemplateCommand(int argc, char** argv) {
  const char* cmd = "chat-template";
  std::string model, override_path, input;
  FlagSet flags("chat-template",
                "Renders conversations with a model's chat template (tokenizer_config.json).");
  flags.String("model", &model, "model directory (its tokenizer_config.json) or GGUF file (its tokenizer.chat_template)");
  flags.String("chat-template", &override_path, "a Jinja file to use instead of the model's template");
  flags.String("input-jsonl", &input,
               "a file of {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": bool, "
               "\"extra\": {...}} lines; prints {\"text\": ...} or {\"error\": ...} lines (empty: "
               "only check that the template parses)");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (model.empty() && override_path.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("--model or --chat-template is required"), kExitUsage);
  }
  auto tmpl = openai::LoadChatTemplate(model, override_path);
  if (!tmpl.ok()) return ReportError(cmd, tmpl.status());
  if (input.empty()) {
    std::printf("ok\n");
    return kExitOk;
  }
  std::ifstream in(input);
  if (!in) return ReportError(cmd, absl::NotFoundError(Str(input, ": cannot open")));
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("messages")) {
      return ReportError(cmd, absl::InvalidArgumentError(Str(input, ":", number, ": not a JSON object with messages")),
                         kExitUsage);
    }
    const auto tools = j.contains("tools") ? j["tools"] : nlohmann::ordered_json();
    const auto extra = j.contains("extra") ? j["extra"] : nlohmann::ordered_json::object();
    auto text = tmpl->Render(j["messages"], tools, j.value("add_generation_prompt", false), extra);
    nlohmann::ordered_json out;
    if (text.ok()) {
      out["text"] = *text;
    } else {
      out["error"] = std::string(text.status().message());
    }
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return kExitOk;
}

}  // namespace pdserve::cli
