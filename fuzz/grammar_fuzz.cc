// Fuzzes the constraint grammar compiler and its matcher (a grammar is request input): the
// input is a grammar, then optionally a NUL and bytes to feed the matcher. No input may crash,
// hang or exhaust memory; a bad grammar is a Status naming the problem.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/structured/grammar_matcher.h"
#include "common/structured/grammar_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 14) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  const std::string_view feed = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1, 64);
  auto grammar = pdserve::structured::ParseGrammar(text);
  if (!grammar.ok()) return 0;
  pdserve::structured::GrammarMatcher m(*grammar);
  for (char c : feed) {
    (void)m.NextBytes();
    if (!m.Advance(static_cast<uint8_t>(c))) break;
  }
  (void)m.CanEnd();
  return 0;
}
