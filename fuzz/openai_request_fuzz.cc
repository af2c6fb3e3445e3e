// Fuzzes the OpenAI HTTP API's request parsing (bodies come from any client): completions and
// chat bodies, the latter rendered by a chat template; and the tool-call parsers on the same
// bytes as model output (hermes, llama3_json), whole and streamed in pieces: when the whole text
// holds calls, the stream gives the same content and calls. No input may crash or exhaust the
// stack.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "openai_api/openai_request.h"
#include "openai_api/tool_calls.h"

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

  using pdserve::openai::ToolParser;
  for (ToolParser parser : {ToolParser::kHermes, ToolParser::kLlama3Json}) {
    const pdserve::openai::ExtractedTools whole = pdserve::openai::ExtractToolCalls(parser, body);
    pdserve::openai::ToolCallStream stream(parser);
    std::string content;
    std::vector<pdserve::openai::ToolCall> calls;
    const size_t step = size == 0 ? 1 : 1 + data[0] % 7;
    for (size_t i = 0; i <= body.size(); i += step) {
      auto d = stream.Feed(std::string_view(body).substr(std::min(i, body.size()), step));
      content += d.content;
      for (auto& c : d.calls) calls.push_back(std::move(c));
    }
    auto last = stream.Finish();
    content += last.content;
    for (auto& c : last.calls) calls.push_back(std::move(c));
    if (whole.calls.empty()) {
      if (whole.content != body) __builtin_trap();  // No calls: the text is the content.
      continue;
    }
    if (content != whole.content.value_or("") || calls.size() != whole.calls.size()) {
      __builtin_trap();
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].name != whole.calls[i].name || calls[i].arguments != whole.calls[i].arguments) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
