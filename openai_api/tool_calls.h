// Tool calls in a chat model's output, as vLLM's --tool-call-parser finds them: the text becomes
// OpenAI's message.tool_calls (and finish_reason "tool_calls").
//
// hermes (Qwen2.5/Qwen3, Hermes, many fine-tunes): <tool_call>{"name": ..., "arguments": {...}}
//   </tool_call> blocks (the last may be unclosed at the end); content is the text before the
//   first block, null when empty.
// llama3_json (Llama 3.1/3.2/3.3): output that starts with a JSON object (after optional
//   whitespace or <|python_tag|>), {"name": ..., "parameters": {...}}, several separated by ';';
//   no content.
// forced (tool_choice "required" or a named function, never a --tool-call-parser): a JSON array
//   of {"name": ..., "parameters": {...}} objects; each call counts once its object closes, so
//   an output cut short (max_tokens) still returns the calls it completed.
// Output that does not parse as calls is content, unchanged.
#ifndef PDSERVE_OPENAI_API_TOOL_CALLS_H_
#define PDSERVE_OPENAI_API_TOOL_CALLS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::openai {

enum class ToolParser { kNone, kHermes, kLlama3Json, kForced };

// "hermes", "llama3_json", or "" / "none" (off). InvalidArgument naming --tool-call-parser else.
absl::StatusOr<ToolParser> ParseToolParserName(std::string_view name);

struct ToolCall {
  std::string id;  // "call_" and 24 hex digits, unique per call.
  std::string name;
  std::string arguments;  // JSON text of an object.
};

struct ExtractedTools {
  std::optional<std::string> content;  // Null: no content (OpenAI's null).
  std::vector<ToolCall> calls;
};

// The whole output at once (non-streamed responses).
ExtractedTools ExtractToolCalls(ToolParser parser, std::string_view text);

// The same, fed as the text streams: each Feed returns what can be sent now (content that can no
// longer begin a call, calls whose end has arrived). When every call parses, the concatenated
// content and the calls equal ExtractToolCalls of the whole text (ids aside), whatever the splits;
// a block that does not parse is sent as content where it stood (a stream cannot take back what
// it sent).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolParser parser) : parser_(parser) {}
  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Delta Feed(std::string_view text);
  Delta Finish();  // The output ended.
  bool called() const { return called_; }

 private:
  ToolParser parser_;
  std::string pending_;   // Not yet sent: a possible tag start, a block, or llama3's whole output.
  bool in_call_ = false;  // hermes: inside a <tool_call> block (pending_ holds its body).
  bool called_ = false;   // A call was sent: later text is not content (as in the whole case).
  bool opened_ = false;   // forced: the array's '[' has been read.
  enum class Mode { kUndecided, kContent, kCalls } mode_ = Mode::kUndecided;  // llama3_json.
};

}  // namespace pdserve::openai

#endif  // PDSERVE_OPENAI_API_TOOL_CALLS_H_
