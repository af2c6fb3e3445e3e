// Fuzzes the constraint compilers with deep and repetitive input, which the plain fuzzers' 16 KB
// inputs cannot reach: a small template expanded to up to ~1 MB before it is compiled. Byte 0
// picks the compiler (JSON schema, regex, grammar, a schema's pattern), byte 1-2 the repetition
// count (x 16), then prefix \0 unit \0 suffix: the text is prefix + unit x count + suffix.
// Nested consts 100k deep and stacked quantifiers ended the server before: no input may crash,
// hang or exhaust memory; a bad constraint is a Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/structured/constraint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pdserve::structured::OutputConstraint;
  if (size < 3 || size > 4096) return 0;
  const size_t count = (static_cast<size_t>(data[1]) << 8 | data[2]) * 16;  // Up to ~1M.
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  const size_t a = rest.find('\0');
  const size_t b = a == std::string_view::npos ? a : rest.find('\0', a + 1);
  if (b == std::string_view::npos) return 0;
  const std::string_view prefix = rest.substr(0, a), unit = rest.substr(a + 1, b - a - 1),
                         suffix = rest.substr(b + 1);
  if (unit.size() * count > (size_t{1} << 20)) return 0;
  std::string text(prefix);
  text.reserve(prefix.size() + unit.size() * count + suffix.size());
  for (size_t i = 0; i < count; ++i) text += unit;
  text += suffix;
  OutputConstraint c;
  switch (data[0] % 4) {
    case 0: c.kind = OutputConstraint::Kind::kJsonSchema; c.value = std::move(text); break;
    case 1: c.kind = OutputConstraint::Kind::kRegex; c.value = std::move(text); break;
    case 2: c.kind = OutputConstraint::Kind::kGrammar; c.value = std::move(text); break;
    default: {
      // The text as a schema's pattern: through the JSON compiler into the regex one.
      std::string escaped;
      for (char ch : text) {
        if (ch == '"' || ch == '\\') escaped += '\\';
        if (static_cast<unsigned char>(ch) < 0x20) continue;
        escaped += ch;
      }
      c.kind = OutputConstraint::Kind::kJsonSchema;
      c.value = "{\"type\":\"string\",\"pattern\":\"" + escaped + "\"}";
    }
  }
  (void)pdserve::structured::CompileConstraint(c);
  return 0;
}
