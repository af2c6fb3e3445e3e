// Structured outputs in OpenAI's and vLLM's request fields, as a pdserve.v1.Constraint:
// response_format (json_object; json_schema with its schema), vLLM's guided_json, guided_regex,
// guided_choice, guided_grammar and structured_outputs {json, regex, choice, grammar,
// json_object}; and tool_choice "required" or a named function, which force the output into
// tool calls. Each constraint is compiled here so that a bad one is a 400 naming its field.
#ifndef PDSERVE_OPENAI_API_STRUCTURED_REQUEST_H_
#define PDSERVE_OPENAI_API_STRUCTURED_REQUEST_H_

#include "nlohmann/json.hpp"
#include "openai_api/openai_request.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve::openai {

// At most one of the fields above; none leaves *s without a constraint.
bool ParseStructuredOutputs(const nlohmann::ordered_json& j, v1::SamplingParams* s, ApiError* e);

// tool_choice "required" (some tool of `tools`; several calls unless !parallel) or
// {"type": "function", "function": {"name": N}} (that one): the output constrained to a JSON
// array of calls, [{"name": ..., "parameters": {...}}, ...], at least one, each call's
// parameters to its function's JSON schema (its $defs and references kept working); the
// response parses it with ToolParser::kForced whatever --tool-call-parser is (vLLM's way: a
// forced call does not depend on the model's own format, and the model closes the array).
bool ForcedToolCallConstraint(const nlohmann::ordered_json& tools, const nlohmann::ordered_json& tool_choice,
                              bool parallel, v1::SamplingParams* s, ApiError* e);

}  // namespace pdserve::openai

#endif  // PDSERVE_OPENAI_API_STRUCTURED_REQUEST_H_
