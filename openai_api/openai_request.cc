#include "openai_api/openai_request.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/strings.h"

namespace pdserve::openai {
namespace {

// Choices per request (prompts x n): each is a generation of its own.
constexpr size_t kMaxChoices = 128;

using Json = nlohmann::ordered_json;

nlohmann::json NullOr(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }

bool Fail(ApiError* e, const std::string& param, const std::string& message, int status = 400,
          const std::string& code = "") {
  e->http_status = status;
  e->param = param;
  e->message = message;
  e->code = code;
  e->type = status == 404 ? "NotFoundError" : "invalid_request_error";
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
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi) return Fail(e, key, Str("'", key, "' must be in [", lo, ", ", hi, "], got ", v));
  *out = v;
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
      return Fail(e, "model", Str("The model `", out->model, "` does not exist."), 404, "model_not_found");
    }
  }
  out->model = o.served_model_name;
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
  // Fields that would change the answer and that we do not implement are refused, not ignored.
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() &&
      !(j["logit_bias"].is_object() && j["logit_bias"].empty())) {
    return Fail(e, "logit_bias", "'logit_bias' is not supported");
  }
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
    for (const Json& x : j["stop_token_ids"]) {
      if (!x.is_number_integer()) return Fail(e, "stop_token_ids", "'stop_token_ids' must be a list of integers");
      s->add_stop_token_ids(x.get<int32_t>());
    }
  }
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

// Nesting depth of a JSON value, without recursion (a hostile body may nest millions deep; the
// template renderer and the value conversions recurse, so depth is bounded before them).
int Depth(const Json& root) {
  int max = 0;
  std::vector<std::pair<const Json*, int>> stack = {{&root, 1}};
  while (!stack.empty()) {
    const auto [j, d] = stack.back();
    stack.pop_back();
    max = std::max(max, d);
    if (j->is_structured()) {
      for (const Json& child : *j) stack.emplace_back(&child, d + 1);
    }
  }
  return max;
}

constexpr int kMaxDepth = 64;

}  // namespace

bool ParseJsonObject(const std::string& body, nlohmann::ordered_json* j, ApiError* e) {
  // The parser callback refuses nesting past the bound as it reads, before any recursion.
  int depth = 0;
  bool too_deep = false;
  auto cb = [&](int d, nlohmann::json::parse_event_t event, Json&) {
    (void)event;
    depth = std::max(depth, d);
    if (d > kMaxDepth) too_deep = true;
    return !too_deep;
  };
  *j = Json::parse(body, cb, /*allow_exceptions=*/false);
  if (too_deep) return Fail(e, "", Str("The request body nests JSON deeper than ", kMaxDepth, " levels."));
  if (j->is_discarded()) return Fail(e, "", "The request body is not valid JSON.");
  if (!j->is_object()) return Fail(e, "", "The request body must be a JSON object.");
  if (Depth(*j) > kMaxDepth) return Fail(e, "", Str("The request body nests JSON deeper than ", kMaxDepth, " levels."));
  return true;
}

nlohmann::json ApiError::ToJson() const {
  return {{"error", {{"message", message}, {"type", type}, {"param", NullOr(param)}, {"code", NullOr(code)}}}};
}

bool ParseCompletionRequest(const std::string& body, const ParseOptions& options, ParsedRequest* out,
                            ApiError* e) {
  Json j;
  if (!ParseJsonObject(body, &j, e)) return false;
  v1::SamplingParams s;
  if (!Common(j, options, out, &s, e)) return false;
  if (!MaxTokens(j, "max_tokens", &s, e)) return false;
  int64_t logprobs = -1;
  if (!Integer(j, "logprobs", 0, 20, &logprobs, e)) return false;
  out->logprobs = static_cast<int>(logprobs);
  if (logprobs >= 0) s.set_logprobs(static_cast<int32_t>(logprobs));
  if (j.contains("echo") && j["echo"].is_boolean() && j["echo"].get<bool>()) {
    return Fail(e, "echo", "'echo' is not supported");
  }
  int64_t best_of = out->n;
  if (!Integer(j, "best_of", 1, static_cast<int64_t>(kMaxChoices), &best_of, e)) return false;
  if (best_of != out->n) return Fail(e, "best_of", "'best_of' other than n is not supported");
  if (j.contains("suffix") && !j["suffix"].is_null()) {
    return Fail(e, "suffix", "'suffix' is not supported");
  }
  if (!j.contains("prompt") || j["prompt"].is_null()) return Fail(e, "prompt", "'prompt' is required");
  const Json& p = j["prompt"];
  auto add_text = [&](const std::string& text) {
    v1::GenerateRequest r;
    r.set_text(text);
    *r.mutable_sampling() = s;
    out->prompts.push_back(std::move(r));
  };
  auto add_ids = [&](const Json& ids) {
    v1::GenerateRequest r;
    for (const Json& t : ids) {
      if (!t.is_number_integer()) return false;
      r.mutable_token_ids()->add_ids(t.get<int32_t>());
    }
    *r.mutable_sampling() = s;
    out->prompts.push_back(std::move(r));
    return true;
  };
  const char* kTypes = "'prompt' must be a string, a list of strings, a list of token ids or a list of those";
  if (p.is_string()) {
    add_text(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    if (!add_ids(p)) return Fail(e, "prompt", kTypes);
  } else if (p.is_array() && !p.empty()) {
    for (const Json& x : p) {
      if (x.is_string()) {
        add_text(x.get<std::string>());
      } else if (!x.is_array() || x.empty() || !add_ids(x)) {
        return Fail(e, "prompt", kTypes);
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
  return true;
}

bool ParseChatRequest(const std::string& body, const ParseOptions& options, ParsedRequest* out, ApiError* e) {
  Json j;
  if (!ParseJsonObject(body, &j, e)) return false;
  out->chat = true;
  v1::SamplingParams s;
  if (!Common(j, options, out, &s, e)) return false;
  if (!MaxTokens(j, "max_tokens", &s, e)) return false;
  if (!MaxTokens(j, "max_completion_tokens", &s, e)) return false;
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
  if (!j.contains("messages") || j["messages"].is_null()) return Fail(e, "messages", "'messages' is required");
  const Json& messages = j["messages"];
  if (!messages.is_array() || messages.empty()) return Fail(e, "messages", "'messages' must be a non-empty list");
  Json normalized = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = Str("messages[", i, "]");
    if (!m.is_object()) return Fail(e, where, Str(where, " must be an object"));
    if (!m.contains("role") || !m["role"].is_string()) return Fail(e, where + ".role", Str(where, ".role must be a string"));
    Json copy = m;
    if (m.contains("content") && m["content"].is_array()) {
      // A list of parts: the text parts joined (images are not supported).
      std::string text;
      for (const Json& part : m["content"]) {
        // Every key checked for its type before it is read: json::value throws on a non-string.
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string()) {
          return Fail(e, where + ".content", Str(where, ".content: only text parts are supported"));
        }
        text += part["text"].get<std::string>();
      }
      copy["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      return Fail(e, where + ".content", Str(where, ".content must be a string or a list of text parts"));
    } else if (!m.contains("content") || m["content"].is_null()) {
      copy["content"] = "";
    }
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
        if (ParseJsonObject(f["arguments"].get<std::string>(), &args, &unused)) {
          f["arguments"] = std::move(args);
        }
      }
    }
    normalized.push_back(std::move(copy));
  }
  Json tools = nullptr;
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return Fail(e, "tools", "'tools' must be a list");
    tools = j["tools"];
  }
  // tool_choice: "auto" (the default with tools) parses the output with --tool-call-parser;
  // "none" leaves it text. Forcing a call ("required", a named function) needs guided decoding.
  std::string tool_choice = "auto";
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const Json& c = j["tool_choice"];
    if (c.is_object() || (c.is_string() && c.get<std::string>() == "required")) {
      return Fail(e, "tool_choice",
                  "'required' and named functions are not supported (they need guided decoding)");
    }
    if (!c.is_string() || (c.get<std::string>() != "auto" && c.get<std::string>() != "none")) {
      return Fail(e, "tool_choice", "'tool_choice' must be \"auto\" or \"none\"");
    }
    tool_choice = c.get<std::string>();
    if (tool_choice == "auto" && options.tool_parser == ToolParser::kNone) {
      return Fail(e, "tool_choice", "\"auto\" needs the server's --tool-call-parser");
    }
  }
  if (tools.is_array() && !tools.empty() && tool_choice == "auto") {
    out->tool_parser = options.tool_parser;
  }
  bool add_generation_prompt = true;
  if (!Boolean(j, "add_generation_prompt", &add_generation_prompt, e)) return false;
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
  v1::GenerateRequest r;
  r.set_text(*text);
  r.set_add_special_tokens(false);  // The template writes the special tokens itself.
  *r.mutable_sampling() = s;
  out->prompts.push_back(std::move(r));
  return true;
}

}  // namespace pdserve::openai
