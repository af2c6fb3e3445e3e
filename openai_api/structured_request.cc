#include "openai_api/structured_request.h"

#include <string>
#include <utility>
#include <vector>

#include "common/base/strings.h"
#include "common/rpc/sampling_proto.h"
#include "common/structured/constraint.h"

namespace pdserve::openai {
namespace {

using Json = nlohmann::ordered_json;

bool Fail(ApiError* e, const std::string& param, const std::string& message) {
  e->http_status = 400;
  e->param = param;
  e->message = message;
  e->code.clear();
  e->type = "invalid_request_error";
  return false;
}

// Compiles the constraint: a 400 naming `param` where it does not.
bool Check(const v1::Constraint& c, const std::string& param, ApiError* e) {
  auto constraint = FromProto(c);
  if (constraint == nullptr) return true;
  auto g = structured::CompileConstraint(*constraint);
  if (!g.ok()) return Fail(e, param, Str("'", param, "': ", g.status().message()));
  return true;
}

bool Schema(const Json& v, const std::string& param, v1::Constraint* c, ApiError* e) {
  if (v.is_string()) {
    c->set_json_schema(v.get<std::string>());
  } else if (v.is_object() || v.is_boolean()) {
    c->set_json_schema(v.dump());
  } else {
    return Fail(e, param, Str("'", param, "' must be a JSON schema (an object)"));
  }
  return Check(*c, param, e);
}

bool Text(const Json& v, const std::string& param, std::string* out, ApiError* e) {
  if (!v.is_string()) return Fail(e, param, Str("'", param, "' must be a string"));
  *out = v.get<std::string>();
  return true;
}

bool Choices(const Json& v, const std::string& param, v1::Constraint* c, ApiError* e) {
  if (!v.is_array() || v.empty()) return Fail(e, param, Str("'", param, "' must be a non-empty list of strings"));
  for (const Json& x : v) {
    if (!x.is_string()) return Fail(e, param, Str("'", param, "' must be a non-empty list of strings"));
    c->mutable_choice()->add_choices(x.get<std::string>());
  }
  return Check(*c, param, e);
}

// One of the constraint fields of `obj` (vLLM's structured_outputs or the guided_* fields):
// names[kind] is the field's name there.
bool FromFields(const Json& obj, const std::string& prefix, const char* const names[4],
                v1::Constraint* c, int* found, ApiError* e) {
  for (int kind = 0; kind < 4; ++kind) {
    if (!obj.contains(names[kind]) || obj[names[kind]].is_null()) continue;
    const std::string param = prefix + names[kind];
    ++*found;
    if (*found > 1) {
      return Fail(e, param, Str("'", param, "': give one structured output (response_format, guided_*, "
                                "structured_outputs) at a time"));
    }
    const Json& v = obj[names[kind]];
    switch (kind) {
      case 0:
        if (!Schema(v, param, c, e)) return false;
        break;
      case 1:
        if (!Text(v, param, c->mutable_regex(), e) || !Check(*c, param, e)) return false;
        break;
      case 2:
        if (!Choices(v, param, c, e)) return false;
        break;
      case 3:
        if (!Text(v, param, c->mutable_grammar(), e) || !Check(*c, param, e)) return false;
        break;
    }
  }
  return true;
}

}  // namespace

bool ParseStructuredOutputs(const Json& j, v1::SamplingParams* s, ApiError* e) {
  v1::Constraint c;
  int found = 0;
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const Json& f = j["response_format"];
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
      return Fail(e, "response_format", "'response_format' must be an object with a 'type'");
    }
    const std::string type = f["type"].get<std::string>();
    if (type == "json_object") {
      c.set_json_object(true);
      ++found;
    } else if (type == "json_schema") {
      if (!f.contains("json_schema") || !f["json_schema"].is_object() ||
          !f["json_schema"].contains("schema")) {
        return Fail(e, "response_format.json_schema.schema",
                    "'response_format' of type json_schema needs 'json_schema': {'name': ..., 'schema': {...}}");
      }
      if (!Schema(f["json_schema"]["schema"], "response_format.json_schema.schema", &c, e)) return false;
      ++found;
    } else if (type != "text") {
      return Fail(e, "response_format.type",
                  Str("'response_format.type' must be text, json_object or json_schema, got '", type, "'"));
    }
  }
  static const char* const kGuided[4] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar"};
  if (!FromFields(j, "", kGuided, &c, &found, e)) return false;
  if (j.contains("structured_outputs") && !j["structured_outputs"].is_null()) {
    const Json& so = j["structured_outputs"];
    if (!so.is_object()) return Fail(e, "structured_outputs", "'structured_outputs' must be an object");
    static const char* const kFields[4] = {"json", "regex", "choice", "grammar"};
    if (!FromFields(so, "structured_outputs.", kFields, &c, &found, e)) return false;
    if (so.contains("json_object") && so["json_object"] == true) {
      if (++found > 1) return Fail(e, "structured_outputs.json_object", "give one structured output at a time");
      c.set_json_object(true);
    }
  }
  if (found > 1) {
    return Fail(e, "response_format", "give one structured output (response_format, guided_*, structured_outputs) at a time");
  }
  // vLLM's guided_whitespace_pattern: the whitespace JSON output may have between its tokens.
  if (j.contains("guided_whitespace_pattern") && !j["guided_whitespace_pattern"].is_null()) {
    if (!j["guided_whitespace_pattern"].is_string()) {
      return Fail(e, "guided_whitespace_pattern", "'guided_whitespace_pattern' must be a string (a regex)");
    }
    if (!c.has_json_schema() && !c.has_json_object()) {
      return Fail(e, "guided_whitespace_pattern",
                  "'guided_whitespace_pattern' applies to JSON outputs (response_format, guided_json)");
    }
    c.set_json_whitespace(j["guided_whitespace_pattern"].get<std::string>());
    if (!Check(c, "guided_whitespace_pattern", e)) return false;
  }
  if (found == 1) *s->mutable_constraint() = std::move(c);
  return true;
}

namespace {

// Every local reference "#..." in a tool's parameters, rewritten to point into the copy of them
// at `prefix` (a pointer such as "#/$defs/tool0"); data (const, enum, default, examples) is not
// a schema and is left as it is. The parameters came from a request body (nesting <= 64).
void RebaseRefs(Json* schema, const std::string& prefix) {
  if (schema->is_array()) {
    for (Json& v : *schema) RebaseRefs(&v, prefix);
    return;
  }
  if (!schema->is_object()) return;
  for (auto& [key, v] : schema->items()) {
    if (key == "const" || key == "enum" || key == "default" || key == "examples") continue;
    if (key == "$ref" && v.is_string()) {
      const std::string r = v.get<std::string>();
      if (!r.empty() && r[0] == '#') v = prefix + r.substr(1);
      continue;
    }
    RebaseRefs(&v, prefix);
  }
}

}  // namespace

bool ForcedToolCallConstraint(const Json& tools, const Json& tool_choice, bool parallel,
                              v1::SamplingParams* s, ApiError* e) {
  if (!tools.is_array() || tools.empty()) {
    return Fail(e, "tool_choice", "'tool_choice' forcing a call needs 'tools'");
  }
  std::string wanted;  // Empty: any tool ("required").
  if (tool_choice.is_object()) {
    if (tool_choice.value("type", "") != "function" || !tool_choice.contains("function") ||
        !tool_choice["function"].is_object() || !tool_choice["function"].contains("name") ||
        !tool_choice["function"]["name"].is_string()) {
      return Fail(e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    wanted = tool_choice["function"]["name"].get<std::string>();
  }
  // Each tool's parameters go whole under $defs/toolN of one schema, their own references
  // rebased into that copy, so a tool written with "$ref": "#/$defs/date" (Pydantic's way)
  // resolves as it did in its own schema.
  Json calls = Json::array();
  Json defs = Json::object();
  for (size_t i = 0; i < tools.size(); ++i) {  // CheckTools has checked their shape.
    const Json& f = tools[i]["function"];
    const std::string name = f["name"].get<std::string>();
    if (!wanted.empty() && name != wanted) continue;
    Json params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"]
                                                                           : Json{{"type", "object"}};
    const std::string def = Str("tool", i);
    RebaseRefs(&params, Str("#/$defs/", def));
    defs[def] = std::move(params);
    calls.push_back(Json{{"type", "object"},
                         {"properties", {{"name", {{"const", name}}},
                                         {"parameters", {{"$ref", Str("#/$defs/", def)}}}}},
                         {"required", {"name", "parameters"}}});
  }
  if (calls.empty()) {
    return Fail(e, "tool_choice", Str("'tool_choice' names the function '", wanted, "', which is not in 'tools'"));
  }
  // A JSON array of calls that the model closes, as vLLM constrains "required": at least one,
  // exactly one for a named function or without parallel_tool_calls.
  const bool many = parallel && wanted.empty();
  Json items = calls.size() == 1 ? calls[0] : Json{{"anyOf", std::move(calls)}};
  Json schema = {{"type", "array"}, {"items", std::move(items)}, {"minItems", 1}};
  if (!many) schema["maxItems"] = 1;
  schema["$defs"] = std::move(defs);
  v1::Constraint c;
  c.set_json_schema(schema.dump());
  auto grammar = structured::CompileConstraint(*FromProto(c));
  if (!grammar.ok()) {
    return Fail(e, "tools", Str("'tools': a function's parameters cannot be enforced: ", grammar.status().message()));
  }
  *s->mutable_constraint() = std::move(c);
  return true;
}

}  // namespace pdserve::openai
