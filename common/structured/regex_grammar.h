// Regular expressions (Python's `re` syntax, the part that describes a regular language) as an
// expression of the grammar syntax (grammar_parser.h), for `regex` constraints and JSON
// schemas' `pattern`. The whole output must match (re.fullmatch).
//
// Supported: literals and escapes (\n \t \r \f \v \xHH \uHHHH \UHHHHHHHH, \. and other
// punctuation), classes [...] and [^...] with ranges and \d \w \s \D \W \S, `.` (not a newline),
// groups ( ) (?: ) (?P<name> ) (?<name> ), `|`, one quantifier * + ? {m} {m,} {,n} {m,n} per atom
// and its lazy form (the same language), `^`/`\A` at the start and `$`/`\Z` at the end. Classes
// mean what Python's re means in a str pattern (Unicode, its default): \d its decimal digits, \w
// its word characters, \s its whitespace, \D \W \S and [^...] their complements (tables read
// from Python's own re: regex_classes.inc). Refused with InvalidArgument naming the construct and
// its offset: backreferences, lookarounds, inline flags (so no case-insensitive matching), word
// boundaries, possessive quantifiers, a quantifier on a quantifier ("multiple repeat", as Python
// says), anchors elsewhere.
#ifndef PDSERVE_COMMON_STRUCTURED_REGEX_GRAMMAR_H_
#define PDSERVE_COMMON_STRUCTURED_REGEX_GRAMMAR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pdserve::structured {

struct RegexOptions {
  // The match is the content of a JSON string: `"`, `\` and control characters appear as their
  // JSON escapes where the pattern names them alone, and are left out of classes and `.`.
  bool json_string = false;
};

absl::StatusOr<std::string> RegexToGrammar(std::string_view pattern, const RegexOptions& options = {});

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_REGEX_GRAMMAR_H_
