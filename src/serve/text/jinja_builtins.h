// The builtins of the Jinja interpreter (internal): what jinja2's immutable sandbox gives a
// template besides its own syntax. Filters (jinja_filters.cpp), tests (jinja_tests.cpp),
// the methods of str, list and dict with attribute and item access (jinja_methods.cpp),
// the operators, slicing and iteration (jinja_operators.cpp) and the global functions
// (jinja_globals.cpp), each following Python and jinja2 as transformers configures it.
//
// Builtins work on values only: none of them evaluates template code (map() applies a
// filter, never a macro; macros are the evaluator's). Each charges the render's Budget for
// the steps it takes and the values it builds, and reports failures as Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/text/jinja_budget.h"
#include "serve/text/jinja_value.h"

namespace afd::serve::jinja {

// Arguments of a call, filter or test, bound the way Python binds them: get(i, name)
// is the i-th positional argument or else the keyword argument `name`.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

// a[start:stop:step]'s evaluated bounds: given[k] is false where the bound is absent or None.
struct SliceBounds {
  int64_t idx[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
};

class Builtins {
 public:
  // `budget` outlives the Builtins.
  explicit Builtins(Budget* budget) : budget_(*budget) {}

  // True or False, shared: comparisons and tests build no value.
  Value truth(bool b) const { return b ? true_ : false_; }

  // Items a for loop visits: parts of a list, a dict's keys, a string's characters.
  Result<std::vector<Value>> iterate(int line, const Value& seq);

  // o.name: jinja2's getattr, Python attributes (a dict's methods) first, then the dict's key.
  Result<Value> get_attr(int line, const Value& o, const std::string& name);
  // o[k]: list/string index (negative from the end), dict key, else a method named k.
  Result<Value> get_item(int line, const Value& o, const Value& k);
  // self.m(a...): a method of str, list or dict.
  Result<Value> call_method(int line, const Value& self, const std::string& m, const Args& a);
  // x | f(a...).
  Result<Value> apply_filter(int line, const std::string& f, const Value& x, const Args& a);
  // x is t(a...), before `is not` negates it.
  Result<bool> run_test(int line, const std::string& t, const Value& x, const Args& a);
  // f(a...) for the global functions: raise_exception, namespace, dict, range, strftime_now.
  Result<Value> call_global(int line, const std::string& f, Args a);

  // Unary `not`, `-`, `+`.
  Result<Value> unary(int line, const std::string& op, const Value& x);
  // The binary operators other than `and`/`or` (which short-circuit in the evaluator), on
  // evaluated operands.
  Result<Value> binary(int line, const std::string& op, Value a, Value b);
  // o[start:stop:step] of a defined list or string.
  Result<Value> slice(int line, const Value& o, const SliceBounds& s);
  // needle in hay.
  Result<bool> contains(int line, const Value& hay, const Value& needle);
  // a op b for op in < > <= >=.
  Result<Value> compare(int line, const std::string& op, const Value& a, const Value& b);

 private:
  // jinja_methods.cpp: argument reading and the helpers methods and filters share.
  Result<std::string> str_arg(int line, const Args& a, size_t i, const char* name, const std::string& def);
  Result<int64_t> int_arg(int line, const Args& a, size_t i, const char* name, int64_t def);
  Result<Value> split(int line, const std::string& s, const Args& a, bool from_right);
  Result<Value> replace(int line, const std::string& s, const std::string& from, const std::string& to,
                        int64_t count);
  Result<Value> join(int line, const Value& seq, const std::string& sep, const std::string* attribute);
  Result<Value> attr_path(int line, const Value& item, const std::string& path);
  // jinja_filters.cpp
  Result<Value> tojson(int line, const Value& x, const Args& a);
  Result<Value> indent(int line, const Value& x, const Args& a);
  Result<Value> sort_key(int line, const Value& item, const std::string* attribute, bool case_sensitive);
  Result<Value> sequence_filter(int line, const std::string& f, const Value& x, const Args& a);
  // jinja_operators.cpp
  Result<Value> repeat(int line, const Value& seq, const Value& times);

  Budget& budget_;
  const Value true_ = Value::of(json(true)), false_ = Value::of(json(false));
};

}  // namespace afd::serve::jinja
