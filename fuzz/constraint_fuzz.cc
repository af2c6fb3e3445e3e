// Fuzzes the constraint compilers (request input): the first byte picks JSON schema, regex or
// choice, the rest up to a NUL is the constraint's text (choices split at \x01), then bytes to
// feed the matcher. No input may crash, hang or exhaust memory; a bad constraint is a Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/structured/constraint.h"
#include "common/structured/grammar_matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pdserve::structured::OutputConstraint;
  if (size < 1 || size > 1 << 14) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  const std::string_view feed = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1, 64);
  OutputConstraint c;
  switch (data[0] % 3) {
    case 0: c.kind = OutputConstraint::Kind::kJsonSchema; c.value = std::string(text); break;
    case 1: c.kind = OutputConstraint::Kind::kRegex; c.value = std::string(text); break;
    default: {
      c.kind = OutputConstraint::Kind::kChoice;
      size_t start = 0;
      while (start <= text.size()) {
        const size_t end = std::min(text.find('\x01', start), text.size());
        c.choices.emplace_back(text.substr(start, end - start));
        start = end + 1;
      }
    }
  }
  auto grammar = pdserve::structured::CompileConstraint(c);
  if (!grammar.ok()) return 0;
  pdserve::structured::GrammarMatcher m(*grammar);
  for (char ch : feed) {
    (void)m.NextBytes();
    if (!m.Advance(static_cast<uint8_t>(ch))) break;
  }
  (void)m.CanEnd();
  return 0;
}
