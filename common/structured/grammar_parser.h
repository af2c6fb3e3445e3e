// The text syntax of constraints' grammars, an EBNF covering GBNF's (llama.cpp) features:
//
//   root   ::= "{" ws pair ("," ws pair)* "}"     # a rule: name ::= alternatives
//   pair   ::= [a-z]+ ":" ws value
//   value  ::= "true" | "false" | [0-9]{1,3} | .
//   ws     ::= [ \t\n]*
//
// Names are [A-Za-z0-9_-]+; a rule runs until the next `name ::=`, so rules may span lines.
// Elements: "literal" (escapes \n \r \t \\ \" \' \[ \] \xHH \uHHHH \UHHHHHHHH), [class] and
// [^class] over code points (ranges a-z, the same escapes, \- \^ \]), `.` (any code point), a
// rule's name, ( group ); each may be followed by *, +, ?, {m}, {m,} or {m,n}. `#` comments to
// the end of the line. Code points are matched as their UTF-8 bytes; surrogates never match.
#ifndef PDSERVE_COMMON_STRUCTURED_GRAMMAR_PARSER_H_
#define PDSERVE_COMMON_STRUCTURED_GRAMMAR_PARSER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/structured/grammar.h"

namespace pdserve::structured {

// The grammar whose root is the rule `root`; InvalidArgument with the line and column of a
// syntax error, or naming the rule that is undefined, left-recursive or matches nothing.
absl::StatusOr<std::shared_ptr<const Grammar>> ParseGrammar(std::string_view text,
                                                            std::string_view root = "root");

// A literal of the syntax matching exactly `text` (UTF-8 passes through as written; quotes,
// backslashes and control characters escaped).
std::string GrammarLiteral(std::string_view text);

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_GRAMMAR_PARSER_H_
