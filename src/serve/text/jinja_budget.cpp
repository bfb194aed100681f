// The render's bounds and the interpreter's errors (jinja_budget.h).
#include "serve/text/jinja_budget.h"

#include <utility>
#include <vector>

#include "serve/text/jinja_ast.h"

namespace afd::serve::jinja {

Status error(int line, const std::string& m) {
  return invalid_argument(line > 0 ? "chat template line " + std::to_string(line) + ": " + m : "chat template: " + m);
}

Status limit_error(int line, const std::string& what, const char* name, int64_t value) {
  return error(line, what + " " + std::to_string(value) + " (limit " + name + ")");
}

Status undefined_error(int line, const Value& v) {
  return error(line, v.name ? "'" + *v.name + "' is undefined" : std::string("a value is undefined"));
}

Status Budget::steps_exceeded(int line) const {
  return limit_error(line, "rendering took more statements, expressions, loop iterations and items than", "max_steps",
                     lim_.max_steps);
}

Status Budget::alloc_exceeded(int line) const {
  return limit_error(line, "rendering built more bytes of strings and values than", "max_alloc_bytes",
                     static_cast<int64_t>(lim_.max_alloc_bytes));
}

Status Budget::too_long(int line, const std::string& what) const {
  return limit_error(line, what, "max_output_bytes", static_cast<int64_t>(lim_.max_output_bytes));
}

Result<Value> Budget::str_value(int line, std::string s) {
  AFD_RETURN_IF_ERROR(string_size(line, s.size()));
  return Value::of(json(std::move(s)));
}

Status Budget::admit(int line, const json& v, int extra_depth) {
  std::vector<std::pair<const json*, int>> stack{{&v, extra_depth}};
  size_t bytes = 0;
  while (!stack.empty()) {
    auto [x, d] = stack.back();
    stack.pop_back();
    if (d > lim_.max_data_depth)
      return limit_error(line, "a value would be nested deeper than", "max_data_depth", lim_.max_data_depth);
    bytes += 64;
    if (x->is_string()) bytes += x->get_ref<const std::string&>().size();
    if (x->is_structured())
      for (const json& c : *x) stack.push_back({&c, d + 1});
  }
  AFD_RETURN_IF_ERROR(step(line, static_cast<int64_t>(bytes / 1024)));
  return alloc(line, bytes);
}

Result<json> Budget::take(int line, Value v, int extra_depth) {
  if (v.method) return error(line, std::string("a method (") + v.method + ") cannot be stored in a list or dict");
  if (v.macro) return error(line, "a macro cannot be stored in a list or dict");
  if (v.undef()) return json(json::value_t::discarded);
  AFD_RETURN_IF_ERROR(admit(line, v.j(), extra_depth));
  if (v.p.use_count() == 1) return std::move(*v.p);
  return v.j();
}

Result<json*> Budget::mutable_json(int line, Value* v) {
  if (v->p.use_count() != 1) {
    AFD_RETURN_IF_ERROR(admit(line, v->j(), 0));
    v->p = std::make_shared<json>(v->j());
  }
  return v->p.get();
}

Status Budget::append_str(int line, const Value& v, std::string* out) {
  if (v.undef()) return Status();
  if (v.method) {  // Python adds the object's address, which no other engine can match
    *out += std::string("<built-in method ") + v.method + " of " + type_name(Value{v.p}) + " object>";
    return Status();
  }
  if (v.macro) {
    *out += "<Macro '" + v.macro->targets[0] + "'>";
    return Status();
  }
  size_t before = out->size();
  if (!py_str(v.j(), true, lim_.max_output_bytes, out))
    return too_long(line, "the output or a string would be longer than");
  return alloc(line, out->size() - before);
}

Result<std::string> Budget::to_str(int line, const Value& v) {
  std::string s;
  AFD_RETURN_IF_ERROR(append_str(line, v, &s));
  return s;
}

}  // namespace afd::serve::jinja
