// Unit tests of the Jinja subset: errors and limits (tests/chat/test_chat_template.py holds the
// byte-equality against Jinja2 on real templates).
#include "common/chat/jinja.h"

#include <string>

#include "common/chat/chat_template.h"
#include "gtest/gtest.h"

namespace pdserve::jinja {
namespace {

std::string Render(const std::string& src, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  auto t = Template::Parse(src);
  if (!t.ok()) return "parse error: " + std::string(t.status().message());
  auto out = t->Render(Value::FromJson(vars));
  if (!out.ok()) return "render error: " + std::string(out.status().message());
  return *out;
}

TEST(JinjaTest, PythonValuesPrintAsPython) {
  EXPECT_EQ(PythonFloat(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(PythonFloat(1e16), "1e+16");
  EXPECT_EQ(PythonFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloat(1.5e-5), "1.5e-05");
  EXPECT_EQ(PythonFloat(0.0001), "0.0001");
  EXPECT_EQ(PythonFloat(-2.0), "-2.0");
  EXPECT_EQ(Render("{{ [1, 'it\\'s', none, true, {'a': 2.5}] }}"), "[1, \"it's\", None, True, {'a': 2.5}]");
  EXPECT_EQ(Render("{{ x | tojson }}", {{"x", {{"k", "é\n\"<"}, {"n", {1, 2.0, nullptr}}}}}),
            "{\"k\": \"é\\n\\\"<\", \"n\": [1, 2.0, null]}");
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("x\n    {% if true %}\n    y\n    {% endif %}\nz"), "x\n    y\nz");  // trim + lstrip
  EXPECT_EQ(Render("x {% if true %}y{% endif %}"), "x y");  // Not at a line start: kept.
  EXPECT_EQ(Render("  {%+ if true %}y{% endif %}"), "  y");
  EXPECT_EQ(Render("{# comment #}\n{{ 'a' }}\n"), "a\n");
}

TEST(JinjaTest, ErrorsNameTheProblem) {
  EXPECT_EQ(Render("{{ raise_exception('roles must alternate') }}"),
            "render error: chat template: roles must alternate");
  EXPECT_NE(Render("{% set x = 1 %}{% set x.y = 2 %}").find("only a namespace"), std::string::npos);
  EXPECT_NE(Render("{{ nosuch(1) }}").find("parse error: chat template line 1: unknown function 'nosuch'"),
            std::string::npos);
  EXPECT_EQ(Render("{% macro m() %}x{% endmacro %}{{ m() }}"), "x");  // Macros are known functions.
  EXPECT_NE(Render("{{ 1 + 'a' }}").find("unsupported operand types for +: int and string"), std::string::npos);
  EXPECT_NE(Render("{% for a, b in [1] %}{% endfor %}").find("cannot unpack"), std::string::npos);
  EXPECT_NE(Render("{% include 'x' %}").find("'include' tag is not supported"), std::string::npos);
  EXPECT_NE(Render("{% for x in y %}").find("missing '{% endfor %}'"), std::string::npos);
  EXPECT_NE(Render("line1\n{{ 1 + }}").find("line 2"), std::string::npos);
  EXPECT_NE(Render("{{ 7 // 0 }}").find("division by zero"), std::string::npos);
  // Found by the fuzzer: 64-bit overflow and a non-string strip() argument are errors.
  EXPECT_NE(Render("{{ 9223372036854775807 + 1 }}").find("integer overflow in +"), std::string::npos);
  EXPECT_NE(Render("{{ -9223372036854775807 - 2 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(Render("{{ 3 ** 99 }}").find("integer overflow in **"), std::string::npos);
  EXPECT_EQ(Render("{{ 1 ** 99 }} {{ 0 ** 99 }} {{ 2 ** 10 }}"), "1 0 1024");
  EXPECT_EQ(Render("{{ (-1) ** 9223372036854775807 }} {{ (-1) ** 9223372036854775806 }} {{ 0 ** 0 }} "
                   "{{ (-2) ** 3 }} {{ 1 ** 9223372036854775807 }} {{ 0 ** 9223372036854775807 }}"),
            "-1 1 1 -8 1 0");
  // Found by the fuzzer: an empty string repeated 2^63-1 times looped for hours; a literal past
  // 64 bits had saturated to 2^63-1.
  EXPECT_EQ(Render("[{{ 9223372036854775807 * '' }}{{ (x | upper) * 9223372036854775807 }}{{ 'ab' * 0 }}]"), "[]");
  EXPECT_EQ(Render("{{ 'ab' * 3 }}{{ 2 * 'c' }}{{ 'd' * -1 }}"), "abababcc");
  EXPECT_NE(Render("{{ 'ab' * 9223372036854775807 }}").find("a repeated string longer than"), std::string::npos);
  EXPECT_NE(Render("{{ 9999999999999999999 * 'a' }}").find("integer literal 9999999999999999999 does not fit"),
            std::string::npos);
  EXPECT_NE(Render("{{ 'ab'.strip(3) }}").find("chars must be a string"), std::string::npos);
  EXPECT_NE(Render("{{ x | tojson(indent=99999999) }}").find("indent"), std::string::npos);
}

TEST(JinjaTest, NestingIsBounded) {
  EXPECT_NE(Render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested deeper"),
            std::string::npos);
  EXPECT_NE(Render("{{ " + std::string(5000, '-') + "1 }}").find("nested deeper"), std::string::npos);
  std::string deep;
  for (int i = 0; i < 500; ++i) deep += "{% if true %}";
  EXPECT_NE(Render(deep).find("nested deeper"), std::string::npos);
  EXPECT_NE(Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nested deeper"),
            std::string::npos);
}

TEST(JinjaTest, ValuesCannotNestWithoutBoundOrContainThemselves) {
  // Found by the fuzzer: `set ns.x = ns` made a namespace that held itself (printing it overflowed
  // the stack, and the cycle was never freed).
  EXPECT_NE(Render("{% set ns = namespace(a=1) %}{% set ns.x = ns %}{{ ns }}").find("cannot hold a namespace"),
            std::string::npos);
  EXPECT_NE(Render("{% set ns = namespace(a=1) %}{% set ns.x = [{'k': ns}] %}").find("cannot hold a namespace"),
            std::string::npos);
  EXPECT_NE(Render("{% set a = namespace() %}{% set b = namespace(p=[a]) %}").find("cannot hold a namespace"),
            std::string::npos);
  EXPECT_EQ(Render("{% set ns = namespace(a=1) %}{% set ns.x = [ns.a, {'k': 2}] %}{{ ns.x }} {{ [ns] | length }}"),
            "[1, {'k': 2}] 1");
  // Lists in lists, one level per loop step: an error at the bound, not a stack overflow later.
  EXPECT_NE(Render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                   "{% endfor %}{{ ns.x }}")
                .find("a value nested deeper than 128 levels"),
            std::string::npos);
  std::string deep = "[";
  for (int i = 0; i < 90; ++i) deep = "[" + deep + "]";  // The parser allows 100.
  EXPECT_EQ(Render("{{ (" + deep + "] | length) }}"), "1");
}

// Values that grow each loop step (a string or a list doubled, a join with a long separator, a
// replace that lengthens, an indented tojson) stop at the bound with an error instead of
// outgrowing memory; found by trying what the depth fix left open.
TEST(JinjaTest, ValuesCannotOutgrowMemory) {
  const std::string doubled = Render(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}");
  EXPECT_NE(doubled.find("a value of more than 67108864 bytes"), std::string::npos) << doubled;
  EXPECT_NE(Render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                   "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("more than 67108864 bytes"),
            std::string::npos);
  EXPECT_NE(Render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                   "{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("more than 67108864 bytes"),
            std::string::npos);
  const std::string big = "{% set big = 'x' * 60000000 %}";
  EXPECT_NE(Render(big + "{{ big.join([1, 2, 3]) }}").find("join() would make"), std::string::npos);
  EXPECT_NE(Render(big + "{{ [1, 2, 3] | join(big) }}").find("join() would make"),
            std::string::npos);
  EXPECT_NE(Render("{{ ('a' * 1000000).replace('a', 'b' * 1000) }}").find("replace() would make"),
            std::string::npos);
  EXPECT_NE(Render("{{ [[[[range(1000000) | list]]]] | tojson(indent=32) }}")
                .find("tojson of more than"),
            std::string::npos);
  // What real templates do is far below the bounds.
  EXPECT_EQ(Render("{{ range(3) | list | tojson(indent=2) }}"), "[\n  0,\n  1,\n  2\n]");
  EXPECT_EQ(Render("{{ ', '.join(['a', 'b']) }} {{ 'aXa'.replace('a', 'bb') }} "
                   "{{ range(1000000) | length }}"),
            "a, b bbXbb 1000000");
}

TEST(JinjaTest, LoopsAndNamespaces) {
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");  // Scoped.
  EXPECT_EQ(Render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}{{ x }}{% endfor %}"), "1123");
}

TEST(ChatTemplateTest, RendersWithTheModelsTokens) {
  auto t = ChatTemplate::FromSource("{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
                                    "{% if add_generation_prompt %}assistant:{% endif %}{{ eos_token if tools }}",
                                    "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(*t->Render(messages, nullptr, true), "<s>user:hi;assistant:");
  EXPECT_EQ(*t->Render(messages, nlohmann::ordered_json::array({1}), false), "<s>user:hi;</s>");
}

}  // namespace
}  // namespace pdserve::jinja
