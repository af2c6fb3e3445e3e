// JSON Schema as a grammar (grammar_parser.h's syntax) of the JSON texts that validate: what a
// `json_schema` constraint (OpenAI's response_format, vLLM's guided_json) compiles to.
//
// Output is compact, as OpenAI's strict mode writes it: no whitespace between tokens, object
// properties in the schema's order. Supported keywords: type (a name or a list), properties,
// required, additionalProperties (false or a schema; unspecified: false where `properties` is
// given, as strict mode requires, else any property), enum, const, items, prefixItems,
// minItems, maxItems, anyOf, oneOf (as anyOf: the grammar cannot count matches), allOf of one
// schema, $ref (#, #/$defs/..., #/definitions/..., any local JSON pointer; recursion allowed),
// $defs/definitions, minLength, maxLength, pattern (regex_grammar.h), format (date, time,
// date-time, uuid), nullable (OpenAPI). Annotations (title, description, default, examples,
// $schema, $id, $comment, deprecated, readOnly, writeOnly) constrain nothing. Any other keyword
// is refused (InvalidArgument naming it and where it is), never silently ignored.
#ifndef PDSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_
#define PDSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pdserve::structured {

// The grammar's text (its root rule `root`) for the schema `schema_json` (a JSON text). With a
// `separator`: one or more such texts separated by it (forced tool calls in llama3_json's form).
absl::StatusOr<std::string> JsonSchemaToGrammar(std::string_view schema_json,
                                                std::string_view separator = "");

// The grammar of any JSON object (`json_object`, OpenAI's JSON mode), compact like the above.
std::string JsonObjectGrammar();

// Text of the rules every JSON grammar above uses (json-value, json-string, ...).
std::string JsonBaseRules();

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_
