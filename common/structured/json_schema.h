// JSON Schema as a grammar (grammar_parser.h's syntax) of the JSON texts that validate: what a
// `json_schema` constraint (OpenAI's response_format, vLLM's guided_json) compiles to.
//
// Output is compact, as OpenAI's strict mode writes it, unless JsonGrammarOptions::whitespace
// allows some between tokens; object properties come in the schema's order. Supported keywords: type (a name or a list), properties,
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

struct JsonGrammarOptions {
  // Whitespace allowed between JSON's tokens (after { [ , : and before } ] , :), as a regex
  // (regex_grammar.h), e.g. "[ \\n]{0,2}" or "\\s*"; empty: none, compact as OpenAI's strict
  // mode writes JSON. Whatever it matches goes into the output: it should match only JSON
  // whitespace.
  std::string whitespace;
  // One or more values separated by this (forced tool calls in llama3_json's form); empty: one.
  std::string separator;
};

// The grammar's text (its root rule `root`) for the schema `schema_json` (a JSON text).
absl::StatusOr<std::string> JsonSchemaToGrammar(std::string_view schema_json,
                                                const JsonGrammarOptions& options = {});

// The grammar of any JSON object (`json_object`, OpenAI's JSON mode).
absl::StatusOr<std::string> JsonObjectGrammar(const JsonGrammarOptions& options = {});

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_
