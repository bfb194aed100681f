#include "serve/api/output_format.h"

#include <set>
#include <string_view>
#include <vector>

#include "serve/api/json_fields.h"
#include "serve/api/request.h"
#include "serve/structured/gbnf_builder.h"

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

constexpr auto get = json_field;
constexpr auto type_error = json_type_error;

Status unknown_key(const std::string& where, const std::string& key) {
  return invalid_argument("'" + where + "' has an unknown field '" + json_excerpt(key) + "'");
}

// OpenAI's rule for function and schema names: 1..64 of [a-zA-Z0-9_-].
bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

Status set_kind(OutputFormat* out, const char* kind, std::string gbnf) {
  if (!out->kind.empty())
    return invalid_argument("'" + std::string(kind) + "' and '" + out->kind +
                            "' both constrain the answer; send one of them");
  out->kind = kind;
  out->gbnf = std::move(gbnf);
  return Status();
}

Status read_response_format(const json& b, OutputFormat* out) {
  const json* v = get(b, "response_format");
  if (!v) return Status();
  if (!v->is_object()) return type_error("response_format", "an object", *v);
  const json* t = get(*v, "type");
  if (!t || !t->is_string()) return invalid_argument("'response_format.type' must be a string");
  const std::string type = t->get<std::string>();
  for (auto it = v->begin(); it != v->end(); ++it)
    if (it.key() != "type" && !(type == "json_schema" && it.key() == "json_schema"))
      return unknown_key("response_format", it.key());
  if (type == "text") return Status();
  if (type == "json_object") return set_kind(out, "json_object", json_object_gbnf());
  if (type != "json_schema")
    return invalid_argument("'response_format.type' must be one of 'text', 'json_object', 'json_schema'");
  const json* js = get(*v, "json_schema");
  if (!js || !js->is_object()) return invalid_argument("'response_format.json_schema' must be an object");
  for (auto it = js->begin(); it != js->end(); ++it) {
    const std::string& k = it.key();
    if (k != "name" && k != "description" && k != "schema" && k != "strict")
      return unknown_key("response_format.json_schema", k);
  }
  const json* name = get(*js, "name");
  if (!name || !name->is_string() || !valid_name(name->get<std::string>()))
    return invalid_argument("'response_format.json_schema.name' must be 1 to 64 of a-z, A-Z, 0-9, '_' and '-'");
  if (const json* d = get(*js, "description"); d && !d->is_string())
    return type_error("response_format.json_schema.description", "a string", *d);
  if (const json* s = get(*js, "strict"); s && !s->is_boolean())
    return type_error("response_format.json_schema.strict", "a boolean", *s);
  const json* schema = get(*js, "schema");
  if (!schema) return set_kind(out, "json_schema", json_object_gbnf());  // no schema: any object, as OpenAI
  if (!schema->is_object() && !schema->is_boolean())
    return type_error("response_format.json_schema.schema", "an object (a JSON Schema)", *schema);
  auto g = json_schema_to_gbnf(*schema);
  if (!g.ok()) return g.status().with_context("'response_format.json_schema.schema'");
  return set_kind(out, "json_schema", std::move(*g));
}

Status read_guided(const json& b, OutputFormat* out) {
  if (const json* v = get(b, "guided_json")) {
    if (!v->is_object() && !v->is_string()) return type_error("guided_json", "an object (a JSON Schema)", *v);
    json schema = *v;
    if (v->is_string()) {  // vLLM also takes the schema as JSON text
      schema = json::parse(v->get<std::string>(), nullptr, false);
      if (schema.is_discarded() || !schema.is_object()) return invalid_argument("'guided_json' is not a JSON Schema object");
    }
    auto g = json_schema_to_gbnf(schema);
    if (!g.ok()) return g.status().with_context("'guided_json'");
    AFD_RETURN_IF_ERROR(set_kind(out, "guided_json", std::move(*g)));
  }
  if (const json* v = get(b, "guided_choice")) {
    if (!v->is_array() || v->empty()) return invalid_argument("'guided_choice' must be a non-empty array of strings");
    std::vector<std::string> choices;
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) return type_error("guided_choice[" + std::to_string(i) + "]", "a string", (*v)[i]);
      choices.push_back((*v)[i].get<std::string>());
    }
    auto g = choice_to_gbnf(choices);
    if (!g.ok()) return g.status().with_context("'guided_choice'");
    AFD_RETURN_IF_ERROR(set_kind(out, "guided_choice", std::move(*g)));
  }
  if (const json* v = get(b, "guided_regex")) {
    if (!v->is_string()) return type_error("guided_regex", "a string", *v);
    auto g = regex_to_gbnf(v->get<std::string>());
    if (!g.ok()) return g.status().with_context("'guided_regex'");
    AFD_RETURN_IF_ERROR(set_kind(out, "guided_regex", std::move(*g)));
  }
  if (const json* v = get(b, "guided_grammar")) {
    if (!v->is_string() || v->get_ref<const std::string&>().empty())
      return invalid_argument("'guided_grammar' must be a non-empty string (a GBNF grammar)");
    AFD_RETURN_IF_ERROR(set_kind(out, "guided_grammar", v->get<std::string>()));
  }
  return Status();
}

// `tools`, `tool_choice` ("none" | "auto" | "required" | {"type": "function", "function":
// {"name"}}) and `parallel_tool_calls`.
Status read_tools(const json& b, ToolSyntax syntax, OutputFormat* out, json* tools_out) {
  *tools_out = nullptr;
  std::string choice = "auto", named;
  if (const json* c = get(b, "tool_choice")) {
    if (c->is_object()) {
      const json* type = get(*c, "type");
      const json* fn = get(*c, "function");
      const json* name = fn && fn->is_object() ? get(*fn, "name") : nullptr;
      if (!type || *type != "function" || !name || !name->is_string())
        return invalid_argument("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      choice = "named";
      named = name->get<std::string>();
    } else if (c->is_string()) {
      choice = c->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        return invalid_argument("'tool_choice' = '" + json_excerpt(choice) + "' is not one of \"none\", \"auto\", \"required\"");
    } else {
      return type_error("tool_choice", "\"none\", \"auto\", \"required\" or an object naming a function", *c);
    }
  }
  if (const json* v = get(b, "parallel_tool_calls")) {
    if (!v->is_boolean()) return type_error("parallel_tool_calls", "a boolean", *v);
    out->parallel_tool_calls = v->get<bool>();
  }
  const json* t = get(b, "tools");
  if (!t) {
    if (choice == "required" || choice == "named")
      return invalid_argument("'tool_choice' asks for a tool call but the request has no 'tools'");
    return Status();
  }
  if (!t->is_array()) return type_error("tools", "an array", *t);
  std::set<std::string> names;
  for (size_t i = 0; i < t->size(); ++i) {
    const std::string f = "tools[" + std::to_string(i) + "]";
    const json& x = (*t)[i];
    if (!x.is_object()) return type_error(f, "an object", x);
    for (auto it = x.begin(); it != x.end(); ++it)
      if (it.key() != "type" && it.key() != "function") return unknown_key(f, it.key());
    const json* type = get(x, "type");
    if (!type || *type != "function")
      return invalid_argument("'" + f + ".type' must be \"function\" (the only kind of tool afd supports)");
    const json* fn = get(x, "function");
    if (!fn || !fn->is_object()) return invalid_argument("'" + f + ".function' must be an object");
    for (auto it = fn->begin(); it != fn->end(); ++it) {
      const std::string& k = it.key();
      if (k != "name" && k != "description" && k != "parameters" && k != "strict") return unknown_key(f + ".function", k);
    }
    const json* name = get(*fn, "name");
    if (!name || !name->is_string() || !valid_name(name->get<std::string>()))
      return invalid_argument("'" + f + ".function.name' must be 1 to 64 of a-z, A-Z, 0-9, '_' and '-'");
    if (!names.insert(name->get<std::string>()).second)
      return invalid_argument("'" + f + ".function.name' = '" + name->get<std::string>() +
                              "' names another tool too; tool names must be unique");
    if (const json* d = get(*fn, "description"); d && !d->is_string())
      return type_error(f + ".function.description", "a string", *d);
    if (const json* s = get(*fn, "strict"); s && !s->is_boolean())
      return type_error(f + ".function.strict", "a boolean", *s);
    if (const json* p = get(*fn, "parameters")) {
      if (!p->is_object()) return type_error(f + ".function.parameters", "an object (a JSON Schema)", *p);
      // Every tool's schema is checked, also when the call is not forced: a schema afd
      // cannot honour is refused whatever the tool_choice.
      GbnfBuilder check;
      auto r = check.add_schema(*p, "args");
      if (!r.ok()) return r.status().with_context("'" + f + ".function.parameters'");
    }
  }
  if (choice == "named" && !names.count(named))
    return invalid_argument("'tool_choice' names the function '" + json_excerpt(named) + "', which is not in 'tools'");
  if (choice == "none") return Status();
  *tools_out = *t;
  out->tool_calls = true;
  out->tool_syntax = syntax;
  if (choice == "required" || choice == "named") {
    auto g = tool_call_gbnf(syntax, *t, named, choice == "required" && out->parallel_tool_calls);
    if (!g.ok()) return g.status();
    AFD_RETURN_IF_ERROR(set_kind(out, "tool_calls", std::move(*g)));
  }
  return Status();
}

}  // namespace

Status read_output_format(const json& body, Endpoint ep, ToolSyntax syntax, OutputFormat* out, json* tools_out) {
  *out = OutputFormat{};
  *tools_out = nullptr;
  if (ep == Endpoint::chat) AFD_RETURN_IF_ERROR(read_tools(body, syntax, out, tools_out));
  AFD_RETURN_IF_ERROR(read_response_format(body, out));
  return read_guided(body, out);
}

}  // namespace afd::serve
