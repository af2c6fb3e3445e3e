// Fuzzes the chat template parser and renderer (a template is an input file of a model): no
// input may crash, hang or exhaust the stack; errors are Statuses.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;
  auto t = pdserve::ChatTemplate::FromSource(std::string(reinterpret_cast<const char*>(data), size), "<s>", "</s>");
  if (!t.ok()) return 0;
  static const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi é"},
          {"role": "assistant", "content": "<think>x</think>ok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
          {"role": "tool", "content": "1.5"}])");
  static const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  (void)t->Render(messages, tools, true);
  return 0;
}
