#include "openai_api/tool_calls.h"

#include <cstdio>
#include <random>

#include "common/base/strings.h"
#include "openai_api/openai_request.h"

namespace pdserve::openai {
namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string NewCallId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[32];
  snprintf(buf, sizeof(buf), "call_%016llx%08llx", static_cast<unsigned long long>(rng()),
           static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}

std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  return s;
}

// A call from one JSON object (bounded parse: model output is untrusted): "name" a string, the
// arguments under `args_key` (or "arguments"), an object's JSON text; absent: {}.
std::optional<ToolCall> CallFromJson(std::string_view text, const char* args_key) {
  nlohmann::ordered_json j;
  ApiError unused;
  if (!ParseJsonObject(text, &j, &unused, /*keep_all=*/true)) return std::nullopt;
  if (!j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call;
  call.id = NewCallId();
  call.name = j["name"].get<std::string>();
  const char* key = j.contains(args_key) ? args_key : "arguments";
  call.arguments = j.contains(key) ? j[key].dump(-1, ' ', false,
                                                 nlohmann::ordered_json::error_handler_t::replace)
                                   : "{}";
  return call;
}

// Where the JSON object starting at s[0] == '{' ends (one past its '}'), or npos when it does not
// close. Strings (with escapes) are skipped; only braces and brackets count.
size_t JsonObjectEnd(std::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
      if (depth < 0) return std::string_view::npos;
    }
  }
  return std::string_view::npos;
}

ExtractedTools Hermes(std::string_view text) {
  ExtractedTools out;
  const size_t first = text.find(kHermesOpen);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  size_t pos = first;
  while (pos != std::string_view::npos) {
    const size_t start = pos + kHermesOpen.size();
    const size_t end = text.find(kHermesClose, start);
    const std::string_view block =
        end == std::string_view::npos ? text.substr(start) : text.substr(start, end - start);
    auto call = CallFromJson(block, "arguments");
    if (!call) return ExtractedTools{std::string(text), {}};  // Not calls after all: all content.
    out.calls.push_back(std::move(*call));
    pos = end == std::string_view::npos ? end : text.find(kHermesOpen, end + kHermesClose.size());
  }
  if (first > 0) out.content = std::string(text.substr(0, first));
  return out;
}

ExtractedTools Llama3Json(std::string_view text) {
  ExtractedTools out;
  std::string_view s = TrimLeft(text);
  if (s.substr(0, kPythonTag.size()) == kPythonTag) s = TrimLeft(s.substr(kPythonTag.size()));
  while (!s.empty() && s.front() == '{') {
    const size_t end = JsonObjectEnd(s);
    if (end == std::string_view::npos) break;
    auto call = CallFromJson(s.substr(0, end), "parameters");
    if (!call) break;
    out.calls.push_back(std::move(*call));
    s = TrimLeft(s.substr(end));
    if (!s.empty() && s.front() == ';') s = TrimLeft(s.substr(1));
  }
  if (out.calls.empty() || !s.empty()) return ExtractedTools{std::string(text), {}};
  return out;
}

// forced: the complete calls at the front of `*s`, a JSON array's text (after its '[' when
// *opened); what is consumed leaves *s. False when the text is not such an array.
bool ForcedCalls(std::string_view* s, bool* opened, std::vector<ToolCall>* calls) {
  std::string_view rest = TrimLeft(*s);
  if (!*opened) {
    if (rest.empty()) return true;
    if (rest.front() != '[') return false;
    *opened = true;
    rest.remove_prefix(1);
  }
  while (true) {
    rest = TrimLeft(rest);
    if (!rest.empty() && rest.front() == ',') rest = TrimLeft(rest.substr(1));
    if (rest.empty() || rest.front() == ']') break;
    if (rest.front() != '{') return false;
    const size_t end = JsonObjectEnd(rest);
    if (end == std::string_view::npos) break;  // Not closed yet (or never: cut short).
    auto call = CallFromJson(rest.substr(0, end), "parameters");
    if (!call) return false;
    calls->push_back(std::move(*call));
    rest.remove_prefix(end);
  }
  *s = rest;
  return true;
}

ExtractedTools Forced(std::string_view text) {
  ExtractedTools out;
  bool opened = false;
  std::string_view s = text;
  if (!ForcedCalls(&s, &opened, &out.calls) || out.calls.empty()) return ExtractedTools{std::string(text), {}};
  return out;
}

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t PartialTag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

absl::StatusOr<ToolParser> ParseToolParserName(std::string_view name) {
  if (name.empty() || name == "none") return ToolParser::kNone;
  if (name == "hermes") return ToolParser::kHermes;
  if (name == "llama3_json") return ToolParser::kLlama3Json;
  return absl::InvalidArgumentError(
      Str("--tool-call-parser: '", name, "' is not one of hermes, llama3_json, none"));
}

ExtractedTools ExtractToolCalls(ToolParser parser, std::string_view text) {
  switch (parser) {
    case ToolParser::kHermes:
      return Hermes(text);
    case ToolParser::kLlama3Json:
      return Llama3Json(text);
    case ToolParser::kForced:
      return Forced(text);
    case ToolParser::kNone:
      break;
  }
  return ExtractedTools{std::string(text), {}};
}

ToolCallStream::Delta ToolCallStream::Feed(std::string_view text) {
  Delta out;
  pending_ += text;
  if (parser_ == ToolParser::kNone) {
    out.content = std::move(pending_);
    pending_.clear();
    return out;
  }
  if (parser_ == ToolParser::kForced) {
    // The text stays pending until a call completes (content, if it never does, is all of it).
    if (mode_ == Mode::kContent) {
      out.content = std::move(pending_);
      pending_.clear();
      return out;
    }
    std::string_view rest = pending_;
    bool opened = opened_;
    if (!ForcedCalls(&rest, &opened, &out.calls)) {
      if (!called_) {
        mode_ = Mode::kContent;  // Not an array of calls: the text is content.
        out.content = std::move(pending_);
      }
      pending_.clear();
      return out;
    }
    if (!out.calls.empty()) {
      opened_ = opened;
      pending_.erase(0, pending_.size() - rest.size());
      called_ = true;
    }
    return out;
  }
  if (parser_ == ToolParser::kLlama3Json) {
    if (mode_ == Mode::kUndecided) {
      const std::string_view s = TrimLeft(pending_);
      if (s.empty() || (s.size() < kPythonTag.size() && kPythonTag.substr(0, s.size()) == s)) {
        return out;
      }
      mode_ = s.front() == '{' || s.substr(0, kPythonTag.size()) == kPythonTag ? Mode::kCalls
                                                                               : Mode::kContent;
    }
    if (mode_ == Mode::kContent) {
      out.content = std::move(pending_);
      pending_.clear();
    }
    return out;  // kCalls: the whole output is parsed at the end.
  }
  for (;;) {
    if (!in_call_) {
      const size_t at = pending_.find(kHermesOpen);
      if (at == std::string::npos) {
        const size_t keep = PartialTag(pending_, kHermesOpen);
        if (!called_) out.content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return out;
      }
      if (!called_) out.content += pending_.substr(0, at);
      pending_.erase(0, at + kHermesOpen.size());
      in_call_ = true;
    }
    const size_t end = pending_.find(kHermesClose);
    if (end == std::string::npos) return out;
    const std::string block = pending_.substr(0, end);
    pending_.erase(0, end + kHermesClose.size());
    in_call_ = false;
    if (auto call = CallFromJson(block, "arguments")) {
      out.calls.push_back(std::move(*call));
      called_ = true;
    } else if (!called_) {
      out.content += Str(kHermesOpen, block, kHermesClose);
    }
  }
}

ToolCallStream::Delta ToolCallStream::Finish() {
  Delta out;
  if (parser_ == ToolParser::kForced) {
    if (!called_) out.content = std::move(pending_);  // A cut array's unfinished call is dropped.
  } else if (parser_ == ToolParser::kLlama3Json && mode_ == Mode::kCalls) {
    ExtractedTools t = Llama3Json(pending_);
    out.calls = std::move(t.calls);
    if (t.content) out.content = std::move(*t.content);
  } else if (in_call_) {
    if (auto call = CallFromJson(pending_, "arguments")) {
      out.calls.push_back(std::move(*call));
    } else if (!called_) {
      out.content = Str(kHermesOpen, pending_);
    }
  } else if (!called_) {
    out.content = std::move(pending_);
  }
  pending_.clear();
  in_call_ = false;
  called_ = called_ || !out.calls.empty();
  return out;
}

}  // namespace pdserve::openai
