#include "common/structured/constraint.h"

#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/structured/grammar.h"
#include "common/structured/grammar_parser.h"
#include "common/structured/json_schema.h"
#include "common/structured/regex_grammar.h"

namespace pdserve::structured {
const char* OutputConstraint::field() const {
  switch (kind) {
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kJsonObject: return "json_object";
    case Kind::kRegex: return "regex";
    case Kind::kChoice: return "choice";
    case Kind::kGrammar: return "grammar";
  }
  return "constraint";
}

std::string OutputConstraint::Key() const {
  std::string key = Str(static_cast<int>(kind), ":", whitespace.size(), ":", whitespace, ":",
                        value.size(), ":", value);
  for (const std::string& c : choices) key += Str(":", c.size(), ":", c);
  return key;
}

absl::StatusOr<std::string> ConstraintGrammarText(const OutputConstraint& c) {
  const bool json = c.kind == OutputConstraint::Kind::kJsonSchema || c.kind == OutputConstraint::Kind::kJsonObject;
  if (!json && !c.whitespace.empty()) {
    return absl::InvalidArgumentError("json_whitespace: applies to json_schema and json_object only");
  }
  JsonGrammarOptions options;
  options.whitespace = c.whitespace;
  switch (c.kind) {
    case OutputConstraint::Kind::kJsonSchema:
      return JsonSchemaToGrammar(c.value, options);
    case OutputConstraint::Kind::kJsonObject:
      return JsonObjectGrammar(options);
    case OutputConstraint::Kind::kRegex: {
      PD_ASSIGN_OR_RETURN(std::string expr, RegexToGrammar(c.value));
      return Str("root ::= ", expr, "\n");
    }
    case OutputConstraint::Kind::kChoice: {
      if (c.choices.empty()) return absl::InvalidArgumentError("choice: must list at least one choice");
      std::string out = "root ::= ";
      for (size_t i = 0; i < c.choices.size(); ++i) {
        if (c.choices[i].empty()) {
          return absl::InvalidArgumentError(Str("choice: choice ", i, " is empty"));
        }
        out += (i > 0 ? " | " : "") + GrammarLiteral(c.choices[i]);
      }
      return out + "\n";
    }
    case OutputConstraint::Kind::kGrammar:
      return c.value;
  }
  return absl::InvalidArgumentError("constraint: unknown kind");
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const OutputConstraint& c) {
  auto text = ConstraintGrammarText(c);
  if (!text.ok()) return text.status();
  auto grammar = ParseGrammar(*text);
  if (!grammar.ok()) {
    if (c.kind == OutputConstraint::Kind::kGrammar) {
      return absl::InvalidArgumentError(Str("grammar: ", grammar.status().message()));
    }
    // A compiled schema or regex the grammar layer refuses (too large, ...).
    return absl::InvalidArgumentError(Str(c.field(), ": ", grammar.status().message()));
  }
  return grammar;
}

}  // namespace pdserve::structured
