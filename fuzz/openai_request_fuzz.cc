// Fuzzes the OpenAI HTTP API's request parsing (bodies come from any client): completions and
// chat bodies, the latter rendered by a chat template. No input may crash or exhaust the stack.
#include <cstddef>
#include <cstdint>
#include <string>

#include "openai_api/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tmpl = *pdserve::ChatTemplate::FromSource(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}{% if m.tool_calls %}"
      "{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
      "{% if add_generation_prompt %}assistant:{% endif %}",
      "<s>", "</s>");
  pdserve::openai::ParseOptions options;
  options.served_model_name = "m";
  options.chat_template = &tmpl;
  const std::string body(reinterpret_cast<const char*>(data), size);
  pdserve::openai::ParsedRequest request;
  pdserve::openai::ApiError error;
  (void)pdserve::openai::ParseCompletionRequest(body, options, &request, &error);
  pdserve::openai::ParsedRequest chat;
  (void)pdserve::openai::ParseChatRequest(body, options, &chat, &error);
  return 0;
}
