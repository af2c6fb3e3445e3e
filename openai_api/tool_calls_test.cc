#include "openai_api/tool_calls.h"

#include <gtest/gtest.h>

#include <set>

#include "nlohmann/json.hpp"

namespace pdserve::openai {
namespace {

using Json = nlohmann::json;

struct Want {
  std::optional<std::string> content;
  std::vector<std::pair<std::string, Json>> calls;  // name, arguments.
};

void ExpectCalls(const std::vector<ToolCall>& got, const Want& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.calls.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want.calls[i].first) << where;
    EXPECT_EQ(Json::parse(got[i].arguments), want.calls[i].second)
        << where << ": " << got[i].arguments;
    EXPECT_EQ(got[i].id.rfind("call_", 0), 0u);
    EXPECT_EQ(got[i].id.size(), 29u);
  }
}

void ExpectWhole(ToolParser parser, const std::string& text, const Want& want) {
  const ExtractedTools got = ExtractToolCalls(parser, text);
  EXPECT_EQ(got.content, want.content) << text;
  ExpectCalls(got.calls, want, text);
}

// Streamed in pieces of `step` bytes, then in two pieces split at every position: the content
// and calls the whole text gives.
void ExpectStreamEqualsWhole(ToolParser parser, const std::string& text) {
  const ExtractedTools whole = ExtractToolCalls(parser, text);
  Want want{whole.content, {}};
  for (const ToolCall& c : whole.calls) want.calls.emplace_back(c.name, Json::parse(c.arguments));
  auto run = [&](const std::vector<std::string>& pieces, const std::string& where) {
    ToolCallStream s(parser);
    std::string content;
    std::vector<ToolCall> calls;
    for (const std::string& p : pieces) {
      ToolCallStream::Delta d = s.Feed(p);
      content += d.content;
      for (auto& c : d.calls) calls.push_back(std::move(c));
    }
    ToolCallStream::Delta d = s.Finish();
    content += d.content;
    for (auto& c : d.calls) calls.push_back(std::move(c));
    EXPECT_EQ(content, want.content.value_or("")) << where;
    ExpectCalls(calls, want, where);
    EXPECT_EQ(s.called(), !want.calls.empty()) << where;
  };
  for (size_t step : {size_t{1}, size_t{3}}) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size(); i += step) pieces.push_back(text.substr(i, step));
    run(pieces, text + " by " + std::to_string(step));
  }
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    run({text.substr(0, cut), text.substr(cut)}, text + " cut at " + std::to_string(cut));
  }
}

TEST(ToolCalls, HermesBlocks) {
  const std::string two =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>";
  ExpectWhole(ToolParser::kHermes, two,
              {"Let me check.\n",
               {{"get_weather", {{"city", "Paris"}, {"days", 2}}}, {"get_time", Json::object()}}});
  // A block at the start: no content (null). The last block may be unclosed; arguments default {}.
  const std::string unclosed_bad =
      "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\",";
  ExpectWhole(ToolParser::kHermes, unclosed_bad, {unclosed_bad, {}});  // Not JSON: all content.
  ExpectWhole(ToolParser::kHermes,
              "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{\"name\": \"b\"}",
              {std::nullopt, {{"a", Json::object()}, {"b", Json::object()}}});
  ExpectWhole(ToolParser::kHermes, "no calls here <tool_ca", {"no calls here <tool_ca", {}});
  // Not calls: malformed JSON, no name, a name that is not a string, nesting past the bound.
  for (const std::string& bad : {std::string("x<tool_call>{\"name\": \"a\", </tool_call>"),
                                 std::string("<tool_call>{\"arguments\": {}}</tool_call>"),
                                 std::string("<tool_call>{\"name\": 5}</tool_call>"),
                                 std::string("<tool_call>[1]</tool_call>"),
                                 "<tool_call>{\"name\": \"a\", \"arguments\": " +
                                     std::string(100000, '[') + "</tool_call>"}) {
    ExpectWhole(ToolParser::kHermes, bad, {bad, {}});
  }
  EXPECT_EQ(ExtractToolCalls(ToolParser::kHermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}")
                .calls.size(),
            1u);
}

TEST(ToolCalls, Llama3Json) {
  ExpectWhole(ToolParser::kLlama3Json,
              " {\"name\": \"f\", \"parameters\": {\"s\": \"}{\\\"\", \"n\": [1, {\"k\": null}]}}; "
              "{\"name\": \"g\", \"parameters\": {}}\n",
              {std::nullopt,
               {{"f", {{"s", "}{\""}, {"n", {1, {{"k", nullptr}}}}}}, {"g", Json::object()}}});
  ExpectWhole(ToolParser::kLlama3Json, "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
              {std::nullopt, {{"f", {{"a", 1}}}}});
  for (const std::string& text :
       {std::string("Hello {\"name\": \"f\", \"parameters\": {}}"),
        std::string("{\"name\": \"f\", \"parameters\": {}} and then text"),
        std::string("{\"parameters\": {}}"), std::string("{\"name\": \"f\""),
        std::string("<|python_tag|>print(1)"), std::string("")}) {
    ExpectWhole(ToolParser::kLlama3Json, text, {text, {}});
  }
}

// Forced calls (tool_choice "required" or named): a JSON array the model closes; a cut output
// still returns each call it completed.
TEST(ToolCalls, ForcedArray) {
  ExpectWhole(ToolParser::kForced,
              "[{\"name\":\"f\",\"parameters\":{\"s\":\"]}\\\"\",\"n\":[1]}},{\"name\":\"g\",\"parameters\":{}}]",
              {std::nullopt, {{"f", {{"s", "]}\""}, {"n", {1}}}}, {"g", Json::object()}}});
  ExpectWhole(ToolParser::kForced, " [ {\"name\": \"f\", \"parameters\": {}} ,{\"name\":\"g\",\"para",
              {std::nullopt, {{"f", Json::object()}}});
  for (const std::string& text : {std::string("[{\"name\":\"f\""), std::string("not an array"),
                                  std::string("[5]"), std::string("[{\"name\":5}]"), std::string("")}) {
    ExpectWhole(ToolParser::kForced, text, {text, {}});
  }
}

TEST(ToolCalls, StreamedEqualsWhole) {
  for (const std::string& text :
       {std::string(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"Paris\"}}\n"
            "</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>\n"),
        std::string(
            "<tool_call>{\"name\": \"a\"}</tool_call>text after<tool_call>{\"name\": \"b\"}"),
        std::string("plain <tool_ca> text <tool_cal"),
        std::string("<<tool_call>{\"name\": \"x\"}</tool_call>"),
        std::string("x<tool_call>{\"name\": 5}</tool_call>y"), std::string("")}) {
    ExpectStreamEqualsWhole(ToolParser::kHermes, text);
  }
  for (const std::string& text :
       {std::string("  {\"name\": \"f\", \"parameters\": {\"a\": \"{\"}}; {\"name\": \"g\", "
                    "\"parameters\": {}}"),
        std::string("<|python_tag|>{\"name\": \"f\", \"parameters\": {}}"),
        std::string("<|python_ta"), std::string("Sure, here {\"name\": \"f\"}"),
        std::string("{not json")}) {
    ExpectStreamEqualsWhole(ToolParser::kLlama3Json, text);
  }
  for (const std::string& text :
       {std::string("[{\"name\":\"f\",\"parameters\":{\"a\":\"}\"}},{\"name\":\"g\",\"parameters\":{}}]"),
        std::string("[{\"name\":\"f\",\"parameters\":{}},{\"name\":\"g\",\"par"),
        std::string("[{\"name\":\"f\""), std::string("[5]"), std::string("text")}) {
    ExpectStreamEqualsWhole(ToolParser::kForced, text);
  }
  ExpectStreamEqualsWhole(ToolParser::kNone, "<tool_call>{\"name\": \"a\"}</tool_call>");
}

TEST(ToolCalls, AStreamCannotTakeBackACallWhenALaterBlockFails) {
  // The whole text would be content (one block does not parse); the stream already sent the
  // first call, and drops the failed block as it drops all text after a call.
  const std::string text = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{oops}</tool_call>";
  EXPECT_TRUE(ExtractToolCalls(ToolParser::kHermes, text).calls.empty());
  ToolCallStream s(ToolParser::kHermes);
  ToolCallStream::Delta d = s.Feed(text);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "a");
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(s.Finish().content, "");
}

TEST(ToolCalls, IdsAreUnique) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    ids.insert(ExtractToolCalls(ToolParser::kHermes, "<tool_call>{\"name\": \"a\"}</tool_call>")
                   .calls[0]
                   .id);
  }
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(ToolCalls, ParserNames) {
  EXPECT_EQ(*ParseToolParserName("hermes"), ToolParser::kHermes);
  EXPECT_EQ(*ParseToolParserName("llama3_json"), ToolParser::kLlama3Json);
  EXPECT_EQ(*ParseToolParserName(""), ToolParser::kNone);
  EXPECT_EQ(*ParseToolParserName("none"), ToolParser::kNone);
  const auto bad = ParseToolParserName("mistral");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tool-call-parser: 'mistral'"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::openai
