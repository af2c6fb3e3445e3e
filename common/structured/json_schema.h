// JSON Schema as a grammar (grammar_parser.h's syntax) of the JSON texts that validate: what a
// `json_schema` constraint (OpenAI's response_format, vLLM's guided_json) compiles to.
//
// Output is compact, as OpenAI's strict mode writes it, unless JsonGrammarOptions::whitespace
// allows some between tokens; object properties come in the schema's order. Every output
// validates against the schema (Python's jsonschema with its format checker is the tests'
// oracle); a keyword the grammar cannot enforce exactly is refused, never approximated.
// Supported: type (a name or a list), properties, required, additionalProperties (false or a
// schema; unspecified: false where `properties` is given, as strict mode requires, else any
// property; additional keys are never a declared property's name and are written without
// escapes), enum and const (beside them only type, which filters the values, and nullable),
// items, prefixItems, minItems, maxItems, anyOf, oneOf where no value can match two branches
// (branches of disjoint types, or objects told apart by a required const/enum property),
// allOf of one schema, $ref (#, #/$defs/..., #/definitions/..., any local JSON pointer;
// recursion allowed), $defs/definitions, minLength and maxLength (in code points, as JSON
// Schema counts: an escaped surrogate pair is one), pattern (regex_grammar.h, Python's re as
// Python's jsonschema reads it; the output matches it whole), format (date: real calendar
// dates, leap years included; time, date-time, uuid), nullable (OpenAPI). Strings never hold an
// unpaired surrogate escape. No object repeats a key: the grammar cannot see that, the request's
// JsonKeyTracker does (json_keys.h). Annotations (title, description, default, examples,
// $schema, $id, $comment, deprecated, readOnly, writeOnly) constrain nothing. Any other keyword
// is refused (InvalidArgument naming it and where it is). The schema's text nests at most 256
// deep and its schemas 128 (InvalidArgument past either, before any recursion).
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
};

// The grammar's text (its root rule `root`) for the schema `schema_json` (a JSON text).
absl::StatusOr<std::string> JsonSchemaToGrammar(std::string_view schema_json,
                                                const JsonGrammarOptions& options = {});

// The grammar of any JSON object (`json_object`, OpenAI's JSON mode).
absl::StatusOr<std::string> JsonObjectGrammar(const JsonGrammarOptions& options = {});

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_
