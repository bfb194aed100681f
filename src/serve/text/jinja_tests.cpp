// The tests of jinja2 (x is [not] name(args)) (jinja_builtins.h).
#include <cmath>
#include <string>

#include "serve/text/jinja_builtins.h"

namespace afd::serve::jinja {

[[gnu::noinline]] Result<bool> Builtins::run_test(int line, const std::string& t, const Value& x, const Args& a) {
  const json& j = x.j();
  if (t == "defined") return !x.undef();
  if (t == "undefined") return x.undef();
  const Value* arg = a.get(0, "other");
  if (t == "none") return !x.undef() && !x.callable() && j.is_null();
  if (t == "boolean") return !x.undef() && j.is_boolean();
  if (t == "true") return !x.undef() && j.is_boolean() && j.get<bool>();
  if (t == "false") return !x.undef() && j.is_boolean() && !j.get<bool>();
  if (t == "string") return !x.undef() && j.is_string();
  if (t == "number") return !x.undef() && numeric(j);
  if (t == "integer") return !x.undef() && j.is_number_integer();
  if (t == "float") return !x.undef() && j.is_number_float();
  if (t == "mapping") return !x.undef() && j.is_object();
  if (t == "iterable") return x.undef() || j.is_array() || j.is_string() || j.is_object();
  if (t == "sequence") return x.undef() || j.is_array() || j.is_string() || j.is_object();  // Undefined has len()
  if (t == "callable") return x.undef() || x.callable();  // Undefined defines __call__
  if (t == "lower" || t == "upper") {  // str(x).islower() / isupper()
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    AFD_ASSIGN_OR_RETURN(
        Value r, call_method(line, Value::of(json(std::move(s))), t == "lower" ? "islower" : "isupper", Args{}));
    return r.j().get<bool>();
  }
  if (t == "even" || t == "odd" || t == "divisibleby") {
    if (x.undef()) return undefined_error(line, x);
    if (!numeric(j)) return error(line, "test '" + t + "' needs a number");
    if (t == "divisibleby") {
      if (!arg || !numeric(arg->j())) return error(line, "divisibleby needs a number");
      if (is_float(j) || is_float(arg->j())) {
        double q = as_double(arg->j());
        if (q == 0) return error(line, "division by zero");
        return std::fmod(as_double(j), q) == 0;
      }
      __int128 q = as_int(arg->j());
      if (q == 0) return error(line, "division by zero");
      return as_int(j) % q == 0;
    }
    if (is_float(j)) return std::fmod(j.get<double>(), 2.0) == (t == "even" ? 0.0 : 1.0);
    __int128 v = as_int(j);
    return (v % 2 == 0) == (t == "even");
  }
  if (t == "equalto" || t == "eq" || t == "==") return arg && x.undef() == arg->undef() && py_equal(j, arg->j());
  if (t == "ne" || t == "!=") return !(arg && x.undef() == arg->undef() && py_equal(j, arg->j()));
  if (t == "sameas") {
    if (!arg) return error(line, "sameas needs an argument");
    if (x.undef() || arg->undef()) return x.undef() && arg->undef() && x.p == arg->p;
    const json& b = arg->j();
    if (j.is_null() || b.is_null()) return j.is_null() && b.is_null();
    if (j.is_boolean() || b.is_boolean()) return j.is_boolean() && b.is_boolean() && j == b;
    return &j == &b;
  }
  if (t == "lt" || t == "lessthan" || t == "<" || t == "le" || t == "<=" || t == "gt" || t == "greaterthan" ||
      t == ">" || t == "ge" || t == ">=") {
    if (!arg) return error(line, "test '" + t + "' needs an argument");
    std::string op = t == "lt" || t == "lessthan"      ? "<"
                     : t == "le"                       ? "<="
                     : t == "gt" || t == "greaterthan" ? ">"
                     : t == "ge"                       ? ">="
                                                       : t;
    AFD_ASSIGN_OR_RETURN(Value r, compare(line, op, x, *arg));
    return r.j().get<bool>();
  }
  if (t == "in") {
    if (!arg) return error(line, "test 'in' needs an argument");
    return contains(line, *arg, x);
  }
  return error(line, "no test named '" + t + "'");
}

}  // namespace afd::serve::jinja
