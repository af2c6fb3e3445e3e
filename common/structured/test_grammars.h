// Grammars shared by the structured-output tests and benchmarks (test-only).
#ifndef PDSERVE_COMMON_STRUCTURED_TEST_GRAMMARS_H_
#define PDSERVE_COMMON_STRUCTURED_TEST_GRAMMARS_H_

namespace pdserve::structured::test_grammars {

// JSON without whitespace between tokens (as OpenAI's strict mode writes it).
inline constexpr char kCompactJson[] = R"(
  root   ::= value
  value  ::= object | array | string | number | "true" | "false" | "null"
  object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
  array  ::= "[" ( value ( "," value )* )? "]"
  string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ["\\/bfnrt] )* "\""
  number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )?
)";

// The same with up to four whitespace characters between tokens.
inline constexpr char kSpacedJson[] = R"(
  root   ::= ws value ws
  value  ::= object | array | string | number | "true" | "false" | "null"
  object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
  array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
  string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ["\\/bfnrt] )* "\""
  number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )?
  ws     ::= [ \t\n]{0,4}
)";

}  // namespace pdserve::structured::test_grammars

#endif  // PDSERVE_COMMON_STRUCTURED_TEST_GRAMMARS_H_
