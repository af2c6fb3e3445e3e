// Regular expressions (Python's `re` syntax, the part that describes a regular language) as an
// expression of the grammar syntax (grammar_parser.h), for `regex` constraints and JSON
// schemas' `pattern`. The whole output must match (re.fullmatch).
//
// Supported: literals and escapes (\n \t \r \f \v \xHH \uHHHH \UHHHHHHHH, \. and other
// punctuation), classes [...] and [^...] with ranges and \d \w \s \D \W \S, `.` (not a newline),
// groups ( ) (?: ) (?P<name> ) (?<name> ), `|`, the quantifiers * + ? {m} {m,} {,n} {m,n} and
// their lazy forms (the same language), `^`/`\A` at the start and `$`/`\Z` at the end. \d \w \s
// are ASCII (a subset of Python's Unicode classes, so every output still matches). Refused with
// InvalidArgument naming the construct and its offset: backreferences, lookarounds, inline
// flags, word boundaries, possessive quantifiers, anchors elsewhere.
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
