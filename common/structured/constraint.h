// What a request constrains its output to (structured outputs), as the APIs give it, and the
// grammar it compiles to. Light on purpose: SamplingParams carries one.
#ifndef PDSERVE_COMMON_STRUCTURED_CONSTRAINT_H_
#define PDSERVE_COMMON_STRUCTURED_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::structured {

class Grammar;

struct OutputConstraint {
  enum class Kind : uint8_t { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  std::string value;                 // The schema (JSON text), the regex or the grammar text.
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these.
  // kJsonSchema, kJsonObject: whitespace allowed between JSON's tokens, a regex (empty: none).
  std::string whitespace;

  // The API field it came from, for messages ("json_schema", "regex", ...).
  const char* field() const;
  // Equal constraints have equal keys (the compiled grammars' cache).
  std::string Key() const;
  bool operator==(const OutputConstraint& o) const {
    return kind == o.kind && value == o.value && choices == o.choices && whitespace == o.whitespace;
  }
};

// The constraint's grammar in grammar_parser.h's syntax (root rule `root`); InvalidArgument
// naming the field and the reason (an unsupported schema keyword, a bad regex, ...).
absl::StatusOr<std::string> ConstraintGrammarText(const OutputConstraint& c);
// Its grammar, parsed and checked.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const OutputConstraint& c);

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_CONSTRAINT_H_
