// OpenAI API requests (POST /v1/completions, /v1/chat/completions) turned into pdserve.v1
// GenerateRequests, with every field checked and errors shaped as OpenAI shapes them: an HTTP
// status and {"error": {"message", "type", "param", "code"}}. No network here.
#ifndef PDSERVE_OPENAI_API_OPENAI_REQUEST_H_
#define PDSERVE_OPENAI_API_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"
#include "openai_api/tool_calls.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve::openai {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // Empty: null.
  std::string code;   // Empty: null.
  nlohmann::ordered_json ToJson() const;
};

struct ParsedRequest {
  bool chat = false;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int logprobs = -1;           // Completions: logprobs=N (-1: off). Chat: top_logprobs when logprobs.
  bool chat_logprobs = false;
  // One per prompt (completions may send a list). Each runs `n` times: choice i * n + j is sample
  // j of prompt i (its seed, when the request has one, is seed + j).
  std::vector<v1::GenerateRequest> prompts;
  int n = 1;
  // Chat: how the output is searched for tool calls (kNone: it is all content). Set when the
  // request has tools, its tool_choice is "auto" (or absent) and the server has a parser.
  ToolParser tool_parser = ToolParser::kNone;
  bool parallel_tool_calls = true;  // false: only the first call is returned.
};

struct ParseOptions {
  std::string served_model_name;
  const ChatTemplate* chat_template = nullptr;  // Null: chat completions are refused.
  ToolParser tool_parser = ToolParser::kNone;   // --tool-call-parser.
  // --max-inflight-requests (0: none): a request of more choices could never be admitted.
  int64_t max_inflight = 0;
};

// The body as a JSON object, nesting at most 64 deep, in time linear in its size (json_body.h).
// The root's members that no endpoint reads are dropped unbuilt (as vLLM ignores unknown
// fields); `keep_all` builds them too (a tool call's arguments).
bool ParseJsonObject(std::string_view body, nlohmann::ordered_json* out, ApiError* error,
                     bool keep_all = false);

// An optional boolean member: absent or null leaves *out alone; another type fails naming `key`.
bool JsonBoolField(const nlohmann::ordered_json& j, const char* key, bool* out, ApiError* error);

// A JSON integer as an int64 (false when it is not an integer or is past int64's range: a
// uint64 above it must not wrap).
bool JsonInt64(const nlohmann::ordered_json& v, int64_t* out);

// `body` is the raw request body. On failure returns false with *error set.
bool ParseCompletionRequest(const std::string& body, const ParseOptions& options, ParsedRequest* out,
                            ApiError* error);
bool ParseChatRequest(const std::string& body, const ParseOptions& options, ParsedRequest* out,
                      ApiError* error);

}  // namespace pdserve::openai

#endif  // PDSERVE_OPENAI_API_OPENAI_REQUEST_H_
