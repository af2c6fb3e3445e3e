#include "openai_api/openai_request.h"

#include <chrono>
#include <functional>
#include <string>

#include "common/base/strings.h"
#include "gtest/gtest.h"

namespace pdserve::openai {
namespace {

using Json = nlohmann::ordered_json;

// A minimal template: each message as "<role>: <content>\n", then "assistant:" when asked.
constexpr char kTemplate[] =
    "{%- for m in messages %}{{ m['role'] }}: {{ m['content'] }}<end>\n{%- endfor %}"
    "{%- if add_generation_prompt %}assistant:{%- endif %}";

class OpenAiRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = ChatTemplate::FromSource(kTemplate, "<s>", "</s>");
    ASSERT_TRUE(t.ok()) << t.status();
    template_ = std::make_unique<ChatTemplate>(std::move(*t));
    options_.served_model_name = "m";
    options_.chat_template = template_.get();
    options_.tool_parser = ToolParser::kHermes;
  }

  // The error's (status, param) for a completions body, or (200, "") when it parses.
  std::pair<int, std::string> Completion(const std::string& body) {
    ParsedRequest p;
    ApiError e;
    if (ParseCompletionRequest(body, options_, &p, &e)) return {200, ""};
    return {e.http_status, e.param};
  }
  std::pair<int, std::string> Chat(const std::string& body, ParsedRequest* out = nullptr) {
    ParsedRequest p;
    ApiError e;
    if (ParseChatRequest(body, options_, out != nullptr ? out : &p, &e)) return {200, ""};
    return {e.http_status, e.param};
  }

  std::unique_ptr<ChatTemplate> template_;
  ParseOptions options_;
};

const std::pair<int, std::string> kOk{200, ""};

TEST_F(OpenAiRequestTest, IntegersPastTheirRangeAreRefusedNotWrapped) {
  EXPECT_EQ(Completion(R"({"prompt": [4294967396]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(Completion(R"({"prompt": [[1], [-1]]})"), (std::pair<int, std::string>{400, "prompt[1]"}));
  EXPECT_EQ(Completion(R"({"prompt": [1, 2.5]})"), (std::pair<int, std::string>{400, "prompt"}));
  EXPECT_EQ(Completion(R"({"prompt": "x", "stop_token_ids": [4294967296]})"),
            (std::pair<int, std::string>{400, "stop_token_ids"}));
  EXPECT_EQ(Completion(R"({"prompt": "x", "top_k": 18446744073709551615})"),
            (std::pair<int, std::string>{400, "top_k"}));
  EXPECT_EQ(Completion(R"({"prompt": "x", "seed": 9223372036854775808})"),
            (std::pair<int, std::string>{400, "seed"}));
  EXPECT_EQ(Completion(R"({"prompt": "x", "max_tokens": 4294967297})"),
            (std::pair<int, std::string>{400, "max_tokens"}));
  EXPECT_EQ(Completion(R"({"prompt": "x", "n": 18446744073709551615})"),
            (std::pair<int, std::string>{400, "n"}));
  // In range: taken as given.
  ParsedRequest p;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"prompt": [2147483647], "stop_token_ids": [7], "seed": 9223372036854775807})", options_,
      &p, &e))
      << e.message;
  EXPECT_EQ(p.prompts[0].token_ids().ids(0), 2147483647);
  EXPECT_EQ(p.prompts[0].sampling().stop_token_ids(0), 7);
  EXPECT_EQ(p.prompts[0].sampling().seed(), 9223372036854775807ull);
}

TEST_F(OpenAiRequestTest, NumSpeculativeTokensIsPassedOnOrRefusedOutOfRange) {
  ParsedRequest p;
  ApiError e;
  ASSERT_TRUE(ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
                                   "num_speculative_tokens": 0})", options_, &p, &e))
      << e.message;
  ASSERT_TRUE(p.prompts[0].sampling().has_num_speculative_tokens());
  EXPECT_EQ(p.prompts[0].sampling().num_speculative_tokens(), 0);
  ParsedRequest most;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x", "num_speculative_tokens": 16})", options_, &most, &e));
  EXPECT_EQ(most.prompts[0].sampling().num_speculative_tokens(), 16);
  ParsedRequest unset;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x"})", options_, &unset, &e));
  EXPECT_FALSE(unset.prompts[0].sampling().has_num_speculative_tokens());  // The worker's setting.
  for (const char* bad : {"17", "-1", "2.5", "\"4\""}) {
    EXPECT_EQ(Completion(Str(R"({"prompt": "x", "num_speculative_tokens": )", bad, "}")),
              (std::pair<int, std::string>{400, "num_speculative_tokens"}))
        << bad;
  }
}

TEST_F(OpenAiRequestTest, FieldsThatWouldChangeTheAnswerAreRefusedByName) {
  for (const char* field :
       {R"("guided_whitespace_pattern": " ")", R"("chat_template": "{{ 1 }}")",
        R"("min_tokens": 3)", R"("use_beam_search": true)", R"("prompt_logprobs": 1)",
        R"("logit_bias": {"1": 5})", R"("bad_words": ["x"])", R"("allowed_token_ids": [1])",
        R"("echo": true)"}) {
    const std::string body = Str(R"({"messages": [{"role": "user", "content": "hi"}], )", field, "}");
    const auto [status, param] = Chat(body);
    EXPECT_EQ(status, 400) << field;
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    EXPECT_EQ(param, name) << field;
  }
  // response_format of the wrong shape, or a type nobody has.
  EXPECT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}], "response_format": 5})"),
            (std::pair<int, std::string>{400, "response_format"}));
  EXPECT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}],
                     "response_format": {"type": "bogus"}})"),
            (std::pair<int, std::string>{400, "response_format.type"}));
  // Their defaults are fine: the answer is the same as without them.
  EXPECT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}], "response_format":
                     {"type": "text"}, "min_tokens": 0, "use_beam_search": false,
                     "logit_bias": {}, "guided_json": null, "echo": false})"),
            kOk);
  // Completions refuse the same.
  EXPECT_EQ(Completion(R"({"prompt": "x", "guided_whitespace_pattern": "x"})"),
            (std::pair<int, std::string>{400, "guided_whitespace_pattern"}));
  EXPECT_EQ(Completion(R"({"prompt": "x", "echo": "yes"})"), (std::pair<int, std::string>{400, "echo"}));
}

TEST_F(OpenAiRequestTest, UnknownFieldsAreDroppedUnbuilt) {
  ParsedRequest p;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x", "metadata": {"a": [1, 2]},
                                         "store": true, "max_tokens": 3})",
                                     options_, &p, &e))
      << e.message;
  EXPECT_EQ(p.prompts[0].sampling().max_tokens(), 3);
}

TEST_F(OpenAiRequestTest, ChatWithoutMaxTokensRunsToTheContextCompletionsTo16) {
  ParsedRequest chat;
  ASSERT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}]})", &chat), kOk);
  const v1::SamplingParams& s = chat.prompts[0].sampling();
  EXPECT_FALSE(s.has_max_tokens());
  EXPECT_TRUE(s.max_tokens_to_context());
  ParsedRequest bounded;
  ASSERT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})", &bounded),
            kOk);
  EXPECT_EQ(bounded.prompts[0].sampling().max_tokens(), 5);
  ParsedRequest p;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x"})", options_, &p, &e));
  EXPECT_FALSE(p.prompts[0].sampling().has_max_tokens());  // The router's default: 16.
  EXPECT_FALSE(p.prompts[0].sampling().max_tokens_to_context());
}

TEST_F(OpenAiRequestTest, ToolsAreCheckedAndToolChoiceIsConsistent) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::string tool = R"({"type": "function", "function": {"name": "f", "parameters": {}}})";
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": [1]})")), (std::pair<int, std::string>{400, "tools[0]"}));
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": ["a"]})")), (std::pair<int, std::string>{400, "tools[0]"}));
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": [{"type": "function"}]})")),
            (std::pair<int, std::string>{400, "tools[0].function"}));
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": [{"type": "function", "function": {"name": ""}}]})")),
            (std::pair<int, std::string>{400, "tools[0].function.name"}));
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": [)", tool, R"(, {"type": "x", "function": {}}]})")),
            (std::pair<int, std::string>{400, "tools[1].type"}));
  ParsedRequest p;
  ASSERT_EQ(Chat(Str("{", msgs, R"(, "tools": [)", tool, R"(], "parallel_tool_calls": false})"), &p),
            kOk);
  EXPECT_EQ(p.tool_parser, ToolParser::kHermes);
  EXPECT_FALSE(p.parallel_tool_calls);
  // Without a parser, tools with tool_choice absent mean "auto" just as an explicit "auto" does:
  // both refused the same way; "none" serves them as text.
  options_.tool_parser = ToolParser::kNone;
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": [)", tool, "]}")),
            (std::pair<int, std::string>{400, "tool_choice"}));
  EXPECT_EQ(Chat(Str("{", msgs, R"(, "tools": [)", tool, R"(], "tool_choice": "auto"})")),
            (std::pair<int, std::string>{400, "tool_choice"}));
  ParsedRequest none;
  ASSERT_EQ(Chat(Str("{", msgs, R"(, "tools": [)", tool, R"(], "tool_choice": "none"})"), &none), kOk);
  EXPECT_EQ(none.tool_parser, ToolParser::kNone);
  EXPECT_EQ(Chat(Str("{", msgs, "}")), kOk);  // No tools: nothing to parse.
}

TEST_F(OpenAiRequestTest, ContinueFinalMessageLeavesItOpen) {
  ParsedRequest p;
  ASSERT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "The answer is"}],
                     "continue_final_message": true})",
                 &p),
            kOk);
  EXPECT_EQ(p.prompts[0].text(), "user: hi<end>assistant: The answer is");
  EXPECT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}],
                     "continue_final_message": true, "add_generation_prompt": true})"),
            (std::pair<int, std::string>{400, "continue_final_message"}));
  ParsedRequest plain;
  ASSERT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}]})", &plain), kOk);
  EXPECT_EQ(plain.prompts[0].text(), "user: hi<end>assistant:");
}

TEST_F(OpenAiRequestTest, ChoicesBeyondTheInflightBoundAreABadRequest) {
  options_.max_inflight = 4;
  EXPECT_EQ(Completion(R"({"prompt": "x", "n": 4})"), kOk);
  EXPECT_EQ(Completion(R"({"prompt": "x", "n": 5})"), (std::pair<int, std::string>{400, "n"}));
  EXPECT_EQ(Completion(R"({"prompt": ["a", "b", "c"], "n": 2})"),
            (std::pair<int, std::string>{400, "n"}));
  EXPECT_EQ(Chat(R"({"messages": [{"role": "user", "content": "hi"}], "n": 8})"),
            (std::pair<int, std::string>{400, "n"}));
}

TEST_F(OpenAiRequestTest, AnotherModelNameIsALoraAdaptersAndAnEmptyOneIsNotFound) {
  ParsedRequest p;
  ApiError e;
  // The router answers NOT_FOUND (404 model_not_found) when no worker serves that adapter.
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x", "model": "other"})", options_, &p, &e));
  EXPECT_EQ(p.prompts.at(0).sampling().lora_name(), "other");
  EXPECT_EQ(p.model, "other");
  ParsedRequest base;
  ASSERT_TRUE(ParseCompletionRequest(R"({"prompt": "x", "model": "m"})", options_, &base, &e));
  EXPECT_EQ(base.prompts.at(0).sampling().lora_name(), "");
  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt": "x", "model": ""})", options_, &p, &e));
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.code, "model_not_found");
}

TEST_F(OpenAiRequestTest, StopStringInOutputAndSpecialTokensReachTheRequest) {
  ParsedRequest p;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"prompt": "x", "include_stop_str_in_output": true, "add_special_tokens": false})",
      options_, &p, &e));
  EXPECT_TRUE(p.prompts[0].sampling().include_stop_str_in_output());
  EXPECT_FALSE(p.prompts[0].add_special_tokens());
}

// A body under the size limit that was quadratic to parse (an unknown field holding an array of
// 200k objects: seconds of a handler thread) costs a small multiple of nlohmann's linear parse.
TEST_F(OpenAiRequestTest, AJunkFieldCostsALinearParse) {
  std::string body = R"({"prompt": "x", "max_tokens": 1, "junk": [)";
  for (int i = 0; i < 200000; ++i) body += i == 0 ? "{}" : ",{}";
  body += R"(], "logprobs": {)";
  for (int i = 0; i < 1000; ++i) body += Str(i == 0 ? "" : ",", "\"k", i, "\": 1");
  body += "}}";
  auto seconds = [](const std::function<void()>& f) {
    double best = 1e9;
    for (int round = 0; round < 3; ++round) {
      const auto start = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                                .count());
    }
    return best;
  };
  ApiError e;
  const double ours = seconds([&] {
    ParsedRequest p;
    EXPECT_FALSE(ParseCompletionRequest(body, options_, &p, &e));  // logprobs is not an integer.
  });
  EXPECT_EQ(e.param, "logprobs");
  const double reference = seconds([&] { (void)nlohmann::json::parse(body); });
  EXPECT_LT(ours, 5 * reference + 0.005) << ours << " s; nlohmann's parse " << reference << " s";
}

// Every structured-output field becomes the constraint it names, checked here: a bad one is a
// 400 naming its field, two at once are refused, and forced tool calls become a grammar of calls
// parsed as llama3_json whatever the server's parser.
TEST_F(OpenAiRequestTest, StructuredOutputsBecomeConstraints) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}], )";
  auto constraint = [&](const std::string& field) {
    ParsedRequest p;
    EXPECT_EQ(Chat(chat + field + "}", &p), kOk) << field;
    return p.prompts.empty() ? v1::Constraint() : p.prompts[0].sampling().constraint();
  };
  EXPECT_TRUE(constraint(R"("response_format": {"type": "json_object"})").json_object());
  EXPECT_EQ(constraint(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
      "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})").json_schema(),
            R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  EXPECT_EQ(constraint(R"("guided_json": {"type": "string"})").json_schema(), R"({"type":"string"})");
  EXPECT_EQ(constraint(R"("guided_json": "{\"type\": \"string\"}")").json_schema(), R"({"type": "string"})");
  EXPECT_EQ(constraint(R"("guided_regex": "a+")").regex(), "a+");
  EXPECT_EQ(constraint(R"("guided_choice": ["a", "b"])").choice().choices_size(), 2);
  EXPECT_EQ(constraint(R"("guided_grammar": "root ::= \"a\"")").grammar(), "root ::= \"a\"");
  EXPECT_EQ(constraint(R"("structured_outputs": {"regex": "b*"})").regex(), "b*");
  EXPECT_EQ(constraint(R"("structured_outputs": {"choice": ["x"]})").choice().choices(0), "x");
  EXPECT_TRUE(constraint(R"("structured_outputs": {"json_object": true})").json_object());
  EXPECT_EQ(constraint(R"("response_format": {"type": "text"})").kind_case(), v1::Constraint::KIND_NOT_SET);
  EXPECT_EQ(Completion(R"({"prompt": "x", "guided_regex": "\\d+"})"), kOk);
  EXPECT_EQ(Completion(R"({"prompt": "x", "guided_decoding_backend": "xgrammar"})"), kOk);
  const v1::Constraint spaced = constraint(R"("guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ ]?")");
  EXPECT_EQ(spaced.json_whitespace(), "[ ]?");
  EXPECT_EQ(spaced.json_schema(), R"({"type":"object"})");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})", "response_format.json_schema.schema"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 2}}})",
       "response_format.json_schema.schema"},
      {R"("guided_json": 5)", "guided_json"},
      {R"("guided_regex": "(a")", "guided_regex"},
      {R"("guided_choice": [])", "guided_choice"},
      {R"("guided_choice": ["a", 1])", "guided_choice"},
      {R"("guided_grammar": "root ::= undefined")", "guided_grammar"},
      {R"("structured_outputs": {"regex": "\\1"})", "structured_outputs.regex"},
      {R"("structured_outputs": 3)", "structured_outputs"},
      {R"("guided_regex": "a", "guided_choice": ["a"])", "guided_choice"},
      {R"("response_format": {"type": "json_object"}, "guided_regex": "a")", "guided_regex"},
      {R"("guided_regex": "a", "guided_whitespace_pattern": " ")", "guided_whitespace_pattern"},
      {R"("guided_json": {}, "guided_whitespace_pattern": "(")", "guided_whitespace_pattern"},
      {R"("guided_json": {}, "guided_whitespace_pattern": 3)", "guided_whitespace_pattern"},
  };
  for (const auto& [field, param] : bad) {
    EXPECT_EQ(Chat(chat + field + "}"), (std::pair<int, std::string>{400, param})) << field;
  }
  ApiError e;
  ParsedRequest p;
  EXPECT_FALSE(ParseChatRequest(chat + R"("guided_json": {"type": "integer", "minimum": 2}})", options_, &p, &e));
  EXPECT_NE(e.message.find("keyword 'minimum' is not supported"), std::string::npos) << e.message;

  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "now"}}], )";
  ParsedRequest forced;
  ASSERT_EQ(Chat(chat + tools + R"("tool_choice": "required"})", &forced), kOk);
  EXPECT_EQ(forced.tool_parser, ToolParser::kForced);
  // A JSON array of calls that the model closes: at least one, several allowed.
  const auto required = nlohmann::json::parse(forced.prompts[0].sampling().constraint().json_schema());
  EXPECT_EQ(required["type"], "array");
  EXPECT_EQ(required["minItems"], 1);
  EXPECT_FALSE(required.contains("maxItems")) << required;
  ParsedRequest named;
  ASSERT_EQ(Chat(chat + tools + R"("tool_choice": {"type": "function", "function": {"name": "now"}}, "parallel_tool_calls": true})", &named), kOk);
  const auto one = nlohmann::json::parse(named.prompts[0].sampling().constraint().json_schema());
  EXPECT_EQ(one["maxItems"], 1) << one;  // One call.
  // Parameters that refer into their own $defs (Pydantic's way) stay enforceable.
  const std::string pydantic = R"("tools": [{"type": "function", "function": {"name": "book",
      "parameters": {"$defs": {"date": {"type": "string", "format": "date"}}, "type": "object",
        "properties": {"when": {"$ref": "#/$defs/date"}}, "required": ["when"]}}}], )";
  EXPECT_EQ(Chat(chat + pydantic + R"("tool_choice": "required"})"), kOk);
  EXPECT_EQ(Chat(chat + tools + R"("tool_choice": {"type": "function", "function": {"name": "nope"}}})"),
            (std::pair<int, std::string>{400, "tool_choice"}));
  EXPECT_EQ(Chat(chat + R"("tool_choice": "required"})"), (std::pair<int, std::string>{400, "tool_choice"}));
  EXPECT_EQ(Chat(chat + tools + R"("tool_choice": "required", "guided_regex": "a"})"),
            (std::pair<int, std::string>{400, "tool_choice"}));
  EXPECT_EQ(Chat(chat + tools + R"("tool_choice": {"type": "function"}})"), (std::pair<int, std::string>{400, "tool_choice"}));
}

}  // namespace
}  // namespace pdserve::openai
