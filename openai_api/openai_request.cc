#include "openai_api/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/base/strings.h"
#include "common/sampling/sampling_params.h"
#include "common/json/json_body.h"
#include "openai_api/structured_request.h"

namespace pdserve::openai {
namespace {

constexpr size_t kMaxStopStrings = 1024;

// Choices per request (prompts x n): each is a generation of its own.
constexpr size_t kMaxChoices = 128;

using Json = nlohmann::ordered_json;

Json NullOr(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

bool Fail(ApiError* e, const std::string& param, const std::string& message, int status = 400,
          const std::string& code = "") {
  e->http_status = status;
  e->param = param;
  e->message = message;
  e->code = code;
  e->type = "invalid_request_error";  // OpenAI's type for 404 model_not_found too.
  return false;
}

// Field readers: absent or null leaves *out alone; a present field of another type fails.
bool Number(const Json& j, const char* key, double lo, double hi, double* out, ApiError* e) {
  if (!j.contains(key) || j[key].is_null()) return true;
  if (!j[key].is_number()) return Fail(e, key, Str("'", key, "' must be a number"));
  const double v = j[key].get<double>();
  if (!(v >= lo && v <= hi)) return Fail(e, key, Str("'", key, "' must be in [", lo, ", ", hi, "], got ", v));
  *out = v;
  return true;
}

bool Integer(const Json& j, const char* key, int64_t lo, int64_t hi, int64_t* out, ApiError* e) {
  if (!j.contains(key) || j[key].is_null()) return true;
  if (!j[key].is_number_integer()) return Fail(e, key, Str("'", key, "' must be an integer"));
  int64_t v = 0;
  if (!JsonInt64(j[key], &v) || v < lo || v > hi) {
    return Fail(e, key, Str("'", key, "' must be in [", lo, ", ", hi, "], got ", j[key].dump()));
  }
  *out = v;
  return true;
}

// A list of token ids: each an integer in [0, 2^31) (the vocabulary is checked later).
bool TokenIdList(const Json& list, const std::string& param, std::vector<int32_t>* out,
                 ApiError* e) {
  for (size_t i = 0; i < list.size(); ++i) {
    int64_t v = -1;
    if (!list[i].is_number_integer() || !JsonInt64(list[i], &v) || v < 0 || v > INT32_MAX) {
      return Fail(e, param,
                  Str("'", param, "' must hold token ids in [0, ", INT32_MAX, "]; item ", i,
                      " is ", list[i].dump()));
    }
    out->push_back(static_cast<int32_t>(v));
  }
  return true;
}

// Fields of OpenAI's or vLLM's API that would change the answer and that pdserve does not
// implement: a request that sets them to anything but their default is refused, never served as
// if they were absent.
struct Unsupported {
  const char* key;
  bool (*is_default)(const Json& v);
  const char* why;
};

bool IsNull(const Json& v) { return v.is_null(); }
bool IsFalse(const Json& v) { return v.is_null() || v == false; }
bool IsZero(const Json& v) { return v.is_null() || v == 0; }
bool IsOne(const Json& v) { return v.is_null() || v == 1; }
bool IsTrue(const Json& v) { return v.is_null() || v == true; }
bool IsEmpty(const Json& v) { return v.is_null() || (v.is_structured() && v.empty()); }

// Structured outputs are parsed in structured_request.cc; guided_decoding_backend is dropped
// (there is one backend: the output's language is the same whichever a client names).
const Unsupported kUnsupported[] = {
    {"logit_bias", IsEmpty, "is not supported"},
    {"suffix", IsNull, "is not supported"},
    {"min_tokens", IsZero, "is not supported"},
    {"use_beam_search", IsFalse, "is not supported"},
    {"length_penalty", IsOne, "is not supported"},
    {"prompt_logprobs", IsNull, "is not supported"},
    {"truncate_prompt_tokens", IsNull, "is not supported"},
    {"bad_words", IsEmpty, "is not supported"},
    {"allowed_token_ids", IsNull, "is not supported"},
    {"logits_processors", IsNull, "is not supported"},
    {"return_tokens_as_token_ids", IsFalse, "is not supported"},
    {"spaces_between_special_tokens", IsTrue, "other than true is not supported"},
    {"chat_template", IsNull,
     "from a request is not accepted (as vLLM without --trust-request-chat-template): start the "
     "server with --chat-template FILE"},
};

bool RefuseUnsupported(const Json& j, ApiError* e) {
  for (const Unsupported& u : kUnsupported) {
    if (j.contains(u.key) && !u.is_default(j[u.key])) {
      return Fail(e, u.key, Str("'", u.key, "' ", u.why));
    }
  }
  return true;
}

bool Boolean(const Json& j, const char* key, bool* out, ApiError* e) {
  if (!j.contains(key) || j[key].is_null()) return true;
  if (!j[key].is_boolean()) return Fail(e, key, Str("'", key, "' must be a boolean"));
  *out = j[key].get<bool>();
  return true;
}

// The fields both endpoints share: model, stream, sampling, stop, n.
bool Common(const Json& j, const ParseOptions& o, ParsedRequest* out, v1::SamplingParams* s, ApiError* e) {
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return Fail(e, "model", "'model' must be a string");
    out->model = j["model"].get<std::string>();
    if (out->model != o.served_model_name) {
      // Another name is a LoRA adapter's (vLLM's convention): the router answers 404 for one no
      // worker serves.
      if (out->model.empty() || out->model.size() > 256) {
        return Fail(e, "model", Str("The model `", out->model.substr(0, 256), "` does not exist."), 404,
                    "model_not_found");
      }
      s->set_lora_name(out->model);
    }
  } else {
    out->model = o.served_model_name;
  }
  if (!Boolean(j, "stream", &out->stream, e)) return false;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) return Fail(e, "stream_options", "'stream_options' must be an object");
    if (!out->stream) return Fail(e, "stream_options", "'stream_options' needs 'stream': true");
    if (!Boolean(j["stream_options"], "include_usage", &out->include_usage, e)) {
      e->param = "stream_options.include_usage";
      return false;
    }
  }
  int64_t n = 1;
  if (!Integer(j, "n", 1, static_cast<int64_t>(kMaxChoices), &n, e)) return false;
  out->n = static_cast<int>(n);
  if (!RefuseUnsupported(j, e)) return false;
  if (!ParseStructuredOutputs(j, s, e)) return false;
  double v = 0;
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    if (!Number(j, "temperature", 0, 2, &v, e)) return false;
    s->set_temperature(static_cast<float>(v));
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    if (!Number(j, "top_p", 0, 1, &v, e)) return false;
    if (v <= 0) return Fail(e, "top_p", "'top_p' must be in (0, 1]");
    s->set_top_p(static_cast<float>(v));
  }
  int64_t k = 0;
  if (!Integer(j, "top_k", -1, 1 << 20, &k, e)) return false;
  s->set_top_k(static_cast<int32_t>(k));
  v = 0;
  if (!Number(j, "min_p", 0, 1, &v, e)) return false;
  s->set_min_p(static_cast<float>(v));
  v = 0;
  if (!Number(j, "presence_penalty", -2, 2, &v, e)) return false;
  s->set_presence_penalty(static_cast<float>(v));
  v = 0;
  if (!Number(j, "frequency_penalty", -2, 2, &v, e)) return false;
  s->set_frequency_penalty(static_cast<float>(v));
  if (j.contains("repetition_penalty") && !j["repetition_penalty"].is_null()) {
    if (!Number(j, "repetition_penalty", 1e-6, 100, &v, e)) return false;
    s->set_repetition_penalty(static_cast<float>(v));
  }
  int64_t seed = 0;
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!Integer(j, "seed", INT64_MIN, INT64_MAX, &seed, e)) return false;
    s->set_seed(static_cast<uint64_t>(seed));
  }
  bool ignore_eos = false;
  if (!Boolean(j, "ignore_eos", &ignore_eos, e)) return false;
  s->set_ignore_eos(ignore_eos);
  bool skip = true;
  if (!Boolean(j, "skip_special_tokens", &skip, e)) return false;
  s->set_skip_special_tokens(skip);
  if (j.contains("stop") && !j["stop"].is_null()) {
    const Json& stop = j["stop"];
    if (stop.is_string()) {
      s->add_stop(stop.get<std::string>());
    } else if (stop.is_array()) {
      // Counted before anything is copied (the router refuses past its --max-stop-strings,
      // 16 by default; this bound only keeps a list of millions from costing seconds first).
      if (stop.size() > kMaxStopStrings) {
        return Fail(e, "stop", Str("'stop' has ", stop.size(), " strings; at most ", kMaxStopStrings));
      }
      for (const Json& x : stop) {
        if (!x.is_string()) return Fail(e, "stop", "'stop' must be a string or a list of strings");
        s->add_stop(x.get<std::string>());
      }
    } else {
      return Fail(e, "stop", "'stop' must be a string or a list of strings");
    }
  }
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null()) {
    if (!j["stop_token_ids"].is_array()) return Fail(e, "stop_token_ids", "'stop_token_ids' must be a list of integers");
    std::vector<int32_t> ids;
    if (!TokenIdList(j["stop_token_ids"], "stop_token_ids", &ids, e)) return false;
    for (int32_t id : ids) s->add_stop_token_ids(id);
  }
  if (j.contains("num_speculative_tokens") && !j["num_speculative_tokens"].is_null()) {
    int64_t k = 0;
    if (!Integer(j, "num_speculative_tokens", 0, SamplingParams::kMaxSpeculativeTokens, &k, e)) {
      return false;
    }
    s->set_num_speculative_tokens(static_cast<int32_t>(k));
  }
  bool include_stop = false;
  if (!Boolean(j, "include_stop_str_in_output", &include_stop, e)) return false;
  s->set_include_stop_str_in_output(include_stop);
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string()) {
    return Fail(e, "user", "'user' must be a string");
  }
  return true;
}

bool MaxTokens(const Json& j, const char* key, v1::SamplingParams* s, ApiError* e) {
  int64_t m = -1;
  if (!Integer(j, key, 1, INT32_MAX, &m, e)) return false;
  if (m > 0) s->set_max_tokens(static_cast<int32_t>(m));
  return true;
}

constexpr int kMaxDepth = 64;

// The root members some endpoint reads (or refuses by name); the rest are dropped unbuilt.
bool KnownField(std::string_view key) {
  static const auto* known = new absl::flat_hash_set<std::string_view>{
      "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
      "top_p", "top_k", "min_p", "n", "stream", "stream_options", "logprobs", "top_logprobs",
      "echo", "stop", "stop_token_ids", "presence_penalty", "frequency_penalty",
      "repetition_penalty", "best_of", "user", "seed", "ignore_eos", "skip_special_tokens",
      "include_stop_str_in_output", "add_special_tokens", "add_generation_prompt",
      "continue_final_message", "chat_template_kwargs", "tools", "tool_choice",
      "parallel_tool_calls", "response_format", "return_token_strs", "tokens",
      "num_speculative_tokens", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
      "structured_outputs", "guided_whitespace_pattern", "lora_name", "lora_path"};
  if (known->contains(key)) return true;
  for (const Unsupported& u : kUnsupported) {
    if (key == u.key) return true;
  }
  return false;
}

// Choices per request against the server's in-flight bound: more could never all be admitted,
// so retrying (429) would never succeed.
bool CheckChoices(size_t choices, const ParseOptions& o, ApiError* e) {
  if (o.max_inflight > 0 && choices > static_cast<size_t>(o.max_inflight)) {
    return Fail(e, "n",
                Str("the request asks for ", choices, " choices (prompts x n); this server runs "
                    "at most ", o.max_inflight, " requests at once (--max-inflight-requests)"));
  }
  return true;
}

}  // namespace

bool JsonBoolField(const nlohmann::ordered_json& j, const char* key, bool* out, ApiError* e) {
  return Boolean(j, key, out, e);
}

bool JsonInt64(const nlohmann::ordered_json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return true;
}

bool ParseJsonObject(std::string_view body, nlohmann::ordered_json* j, ApiError* e, bool keep_all) {
  JsonBodyError error;
  static const std::function<bool(std::string_view)> kKnown = KnownField;
  static const std::function<bool(std::string_view)> kAll;
  if (!ParseJsonBody(body, kMaxDepth, keep_all ? kAll : kKnown, j, &error)) {
    return Fail(e, "",
                error.too_deep ? Str("The request body nests JSON deeper than ", kMaxDepth, " levels.")
                               : Str("The request body is not valid JSON (", error.message, ")."));
  }
  if (!j->is_object()) return Fail(e, "", "The request body must be a JSON object.");
  return true;
}

nlohmann::ordered_json ApiError::ToJson() const {
  return {{"error",
           {{"message", message}, {"type", type}, {"param", NullOr(param)}, {"code", NullOr(code)}}}};
}

bool ParseCompletionRequest(const std::string& body, const ParseOptions& options, ParsedRequest* out,
                            ApiError* e) {
  Json j;
  if (!ParseJsonObject(body, &j, e)) return false;
  v1::SamplingParams s;
  if (!Common(j, options, out, &s, e)) return false;
  if (!MaxTokens(j, "max_tokens", &s, e)) return false;  // Absent: 16, OpenAI's legacy default.
  int64_t logprobs = -1;
  if (!Integer(j, "logprobs", 0, 20, &logprobs, e)) return false;
  out->logprobs = static_cast<int>(logprobs);
  if (logprobs >= 0) s.set_logprobs(static_cast<int32_t>(logprobs));
  bool echo = false;
  if (!Boolean(j, "echo", &echo, e)) return false;
  if (echo) return Fail(e, "echo", "'echo' is not supported");
  bool add_special = true;
  if (!Boolean(j, "add_special_tokens", &add_special, e)) return false;
  int64_t best_of = out->n;
  if (!Integer(j, "best_of", 1, static_cast<int64_t>(kMaxChoices), &best_of, e)) return false;
  if (best_of != out->n) return Fail(e, "best_of", "'best_of' other than n is not supported");
  if (!j.contains("prompt") || j["prompt"].is_null()) return Fail(e, "prompt", "'prompt' is required");
  const Json& p = j["prompt"];
  auto add = [&](v1::GenerateRequest r) {
    r.set_add_special_tokens(add_special);
    *r.mutable_sampling() = s;
    out->prompts.push_back(std::move(r));
  };
  auto add_ids = [&](const Json& list, const std::string& param) {
    std::vector<int32_t> ids;
    if (!TokenIdList(list, param, &ids, e)) return false;
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
    add(std::move(r));
    return true;
  };
  const char* kTypes = "'prompt' must be a string, a list of strings, a list of token ids or a list of those";
  if (p.is_string()) {
    v1::GenerateRequest r;
    r.set_text(p.get<std::string>());
    add(std::move(r));
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    if (!add_ids(p, "prompt")) return false;
  } else if (p.is_array() && !p.empty()) {
    for (size_t i = 0; i < p.size(); ++i) {
      const Json& x = p[i];
      if (x.is_string()) {
        v1::GenerateRequest r;
        r.set_text(x.get<std::string>());
        add(std::move(r));
      } else if (!x.is_array() || x.empty()) {
        return Fail(e, "prompt", kTypes);
      } else if (!add_ids(x, Str("prompt[", i, "]"))) {
        return false;
      }
    }
  } else {
    return Fail(e, "prompt", kTypes);
  }
  if (out->prompts.size() > 16) return Fail(e, "prompt", "at most 16 prompts per request");
  if (out->prompts.size() * static_cast<size_t>(out->n) > kMaxChoices) {
    return Fail(e, "n",
                Str("prompts x n is ", out->prompts.size() * out->n, "; at most ", kMaxChoices,
                    " choices per request"));
  }
  return CheckChoices(out->prompts.size() * static_cast<size_t>(out->n), options, e);
}

namespace {

// tools: a list of {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}, each checked here so a malformed one is a 400 naming it, not a template error or
// a tool the model never sees.
bool CheckTools(const Json& tools, ApiError* e) {
  if (!tools.is_array()) return Fail(e, "tools", "'tools' must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = Str("tools[", i, "]");
    if (!t.is_object()) return Fail(e, at, Str(at, " must be an object"));
    if (!t.contains("type") || t["type"] != "function") {
      return Fail(e, at + ".type", Str(at, ".type must be \"function\""));
    }
    if (!t.contains("function") || !t["function"].is_object()) {
      return Fail(e, at + ".function", Str(at, ".function must be an object"));
    }
    const Json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return Fail(e, at + ".function.name", Str(at, ".function.name must be a non-empty string"));
    }
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string()) {
      return Fail(e, at + ".function.description", Str(at, ".function.description must be a string"));
    }
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object()) {
      return Fail(e, at + ".function.parameters", Str(at, ".function.parameters must be an object"));
    }
    if (f.contains("strict") && !f["strict"].is_null() && !f["strict"].is_boolean()) {
      return Fail(e, at + ".function.strict", Str(at, ".function.strict must be a boolean"));
    }
  }
  return true;
}

// A message's content as text: a string, null (""), or a list of text parts joined with a newline,
// as vLLM joins them for a template that takes text (images are not supported).
bool ContentText(const Json& m, const std::string& where, std::string* text, ApiError* e) {
  if (!m.contains("content") || m["content"].is_null()) return true;
  const Json& c = m["content"];
  if (c.is_string()) {
    *text = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) {
    return Fail(e, where + ".content", Str(where, ".content must be a string or a list of text parts"));
  }
  for (size_t i = 0; i < c.size(); ++i) {
    const Json& part = c[i];
    // Every key checked for its type before it is read: json::value throws on a non-string.
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return Fail(e, where + ".content", Str(where, ".content: only text parts are supported"));
    }
    if (i > 0) *text += '\n';
    *text += part["text"].get<std::string>();
  }
  return true;
}

}  // namespace

bool ParseChatRequest(const std::string& body, const ParseOptions& options, ParsedRequest* out, ApiError* e) {
  Json j;
  if (!ParseJsonObject(body, &j, e)) return false;
  out->chat = true;
  v1::SamplingParams s;
  if (!Common(j, options, out, &s, e)) return false;
  if (!MaxTokens(j, "max_tokens", &s, e)) return false;
  if (!MaxTokens(j, "max_completion_tokens", &s, e)) return false;
  // Without a bound, a chat answer may run to the end of the context (OpenAI's and vLLM's
  // default), not 16 tokens.
  s.set_max_tokens_to_context(true);
  if (!Boolean(j, "logprobs", &out->chat_logprobs, e)) return false;
  int64_t top = 0;
  if (!Integer(j, "top_logprobs", 0, 20, &top, e)) return false;
  if (j.contains("top_logprobs") && !j["top_logprobs"].is_null() && !out->chat_logprobs) {
    return Fail(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  if (out->chat_logprobs) {
    out->logprobs = static_cast<int>(top);
    s.set_logprobs(static_cast<int32_t>(top));
  }
  bool echo = false;
  if (!Boolean(j, "echo", &echo, e)) return false;
  if (echo) return Fail(e, "echo", "'echo' is not supported");
  if (!j.contains("messages") || j["messages"].is_null()) return Fail(e, "messages", "'messages' is required");
  const Json& messages = j["messages"];
  if (!messages.is_array() || messages.empty()) return Fail(e, "messages", "'messages' must be a non-empty list");
  Json normalized = Json::array();
  std::string last_content;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = Str("messages[", i, "]");
    if (!m.is_object()) return Fail(e, where, Str(where, " must be an object"));
    if (!m.contains("role") || !m["role"].is_string()) return Fail(e, where + ".role", Str(where, ".role must be a string"));
    Json copy = m;
    std::string text;
    if (!ContentText(m, where, &text, e)) return false;
    copy["content"] = text;
    if (i + 1 == messages.size()) last_content = std::move(text);
    // An assistant's earlier calls carry their arguments as JSON text (OpenAI's shape); chat
    // templates expect the object (Hugging Face's shape), as vLLM gives it to them.
    if (copy.contains("tool_calls") && copy["tool_calls"].is_array()) {
      for (Json& call : copy["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          continue;
        }
        Json& f = call["function"];
        if (!f.contains("arguments") || !f["arguments"].is_string()) continue;
        Json args;
        ApiError unused;
        if (ParseJsonObject(f["arguments"].get<std::string>(), &args, &unused, /*keep_all=*/true)) {
          f["arguments"] = std::move(args);
        }
      }
    }
    normalized.push_back(std::move(copy));
  }
  Json tools = nullptr;
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!CheckTools(j["tools"], e)) return false;
    tools = j["tools"];
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  // tool_choice: "auto" (the default when there are tools, as in OpenAI's and vLLM's API) parses
  // the output with --tool-call-parser, so without one it is refused whether sent or implied;
  // "none" renders the tools and leaves the output text. Forcing a call ("required", a named
  // function) constrains the output to calls (structured_request.h), whatever the parser.
  std::string tool_choice = has_tools ? "auto" : "none";
  if (!Boolean(j, "parallel_tool_calls", &out->parallel_tool_calls, e)) return false;
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const Json& c = j["tool_choice"];
    if (c.is_object() || (c.is_string() && c.get<std::string>() == "required")) {
      if (s.has_constraint()) {
        return Fail(e, "tool_choice", "a forced tool call and a structured output cannot be combined");
      }
      if (!ForcedToolCallConstraint(tools, c, out->parallel_tool_calls, &s, e)) return false;
      tool_choice = "forced";
      out->tool_parser = ToolParser::kForced;
    } else if (!c.is_string() || (c.get<std::string>() != "auto" && c.get<std::string>() != "none")) {
      return Fail(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function");
    } else {
      tool_choice = c.get<std::string>();
    }
  }
  if (tool_choice == "auto" && options.tool_parser == ToolParser::kNone) {
    return Fail(e, "tool_choice",
                "\"auto\" (the default with tools) needs the server's --tool-call-parser; send "
                "\"tool_choice\": \"none\" to give the model the tools without parsing calls, or "
                "\"required\" to force a call");
  }
  if (has_tools && tool_choice == "auto") out->tool_parser = options.tool_parser;
  bool continue_final = false;
  if (!Boolean(j, "continue_final_message", &continue_final, e)) return false;
  bool add_generation_prompt = !continue_final;
  if (!Boolean(j, "add_generation_prompt", &add_generation_prompt, e)) return false;
  if (continue_final && add_generation_prompt) {
    return Fail(e, "continue_final_message",
                "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  }
  bool add_special = false;  // The template writes the special tokens itself (vLLM's default).
  if (!Boolean(j, "add_special_tokens", &add_special, e)) return false;
  Json extra = Json::object();
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
    if (!j["chat_template_kwargs"].is_object()) return Fail(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    extra = j["chat_template_kwargs"];
  }
  if (options.chat_template == nullptr) {
    return Fail(e, "messages", "this model has no chat template (start the server with --chat-template FILE)");
  }
  auto text = options.chat_template->Render(normalized, tools, add_generation_prompt, extra);
  if (!text.ok()) return Fail(e, "messages", std::string(text.status().message()));
  if (continue_final) {
    // The final message is left open: the text ends where its content ends (what transformers
    // does for continue_final_message), so the model continues it.
    const size_t b = last_content.find_first_not_of(" \t\r\n");
    const size_t en = last_content.find_last_not_of(" \t\r\n");
    const std::string core = b == std::string::npos ? "" : last_content.substr(b, en - b + 1);
    const size_t at = core.empty() ? std::string::npos : text->rfind(core);
    if (at == std::string::npos) {
      return Fail(e, "continue_final_message",
                  "the final message's content does not appear in the rendered chat (empty, or "
                  "changed by the template)");
    }
    text->resize(at + core.size());
  }
  v1::GenerateRequest r;
  r.set_text(*text);
  r.set_add_special_tokens(add_special);
  *r.mutable_sampling() = s;
  out->prompts.push_back(std::move(r));
  return CheckChoices(static_cast<size_t>(out->n), options, e);
}

}  // namespace pdserve::openai
