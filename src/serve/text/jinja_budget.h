// The bounds of one render (jinja.h Limits) and the errors the interpreter reports
// (internal to the interpreter). Every statement, expression, loop iteration and item
// handled by a builtin costs a step; every string or value built is charged to the
// allocation budget before it is built where its size is known, or while it grows;
// statements, expressions and macro calls being evaluated count towards the evaluation
// depth; values built by the template may not nest deeper than max_data_depth.
//
// One Budget per render, shared by the evaluator and the builtins; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "serve/text/jinja.h"
#include "serve/text/jinja_value.h"

namespace afd::serve::jinja {

// An error of the template at `line` (0: no line): "chat template line N: m".
Status error(int line, const std::string& m);
// An error naming the exceeded limit: "<what> <value> (limit <name>)".
Status limit_error(int line, const std::string& what, const char* name, int64_t value);
// Using undefined value `v` where jinja2's Undefined raises.
Status undefined_error(int line, const Value& v);

class Budget {
 public:
  explicit Budget(const Limits& lim) : lim_(lim) {}
  const Limits& limits() const { return lim_; }

  Status step(int line, int64_t n = 1) {
    steps_ += n;
    if (steps_ > lim_.max_steps) return steps_exceeded(line);
    return Status();
  }
  // Charges `bytes` about to be built to the allocation budget.
  Status alloc(int line, size_t bytes) {
    alloc_ += bytes;
    if (alloc_ > lim_.max_alloc_bytes) return alloc_exceeded(line);
    return Status();
  }
  // A string of `bytes` is about to be built.
  Status string_size(int line, size_t bytes) {
    if (bytes > lim_.max_output_bytes) return too_long(line, "a string would be longer than");
    return alloc(line, bytes);
  }
  // Scanning `bytes` of a string (search, split, compare) costs steps.
  Status scan(int line, size_t bytes) { return step(line, 1 + static_cast<int64_t>(bytes / 64)); }
  // The error for a string or output that would exceed max_output_bytes, led by `what`.
  Status too_long(int line, const std::string& what) const;

  // A string value of s, charged.
  Result<Value> str_value(int line, std::string s);
  // A copy of `v` is about to become part of a new value `extra_depth` levels down:
  // checks the resulting depth and charges the copy.
  Status admit(int line, const json& v, int extra_depth);
  // The JSON of `v` for embedding into a new value: moved when `v` is its sole owner.
  Result<json> take(int line, Value v, int extra_depth);
  // Writable JSON of *v, copied first when anything else shares it.
  Result<json*> mutable_json(int line, Value* v);
  // Appends str(v) to *out within max_output_bytes.
  Status append_str(int line, const Value& v, std::string* out);
  Result<std::string> to_str(int line, const Value& v);

  // One level of evaluation (a statement, expression or macro call) while alive.
  class Depth {
   public:
    explicit Depth(Budget* b) : b_(b) { ++b_->depth_; }
    ~Depth() { --b_->depth_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;

   private:
    Budget* b_;
  };
  Status depth_ok(int line) const {
    if (depth_ > lim_.max_eval_depth)
      return limit_error(line, "evaluation nested deeper than", "max_eval_depth", lim_.max_eval_depth);
    return Status();
  }

 private:
  Status steps_exceeded(int line) const;
  Status alloc_exceeded(int line) const;

  const Limits& lim_;
  int64_t steps_ = 0;
  size_t alloc_ = 0;
  int depth_ = 0;
};

}  // namespace afd::serve::jinja
