// The variables a template sees while it renders (internal to the interpreter): a stack of
// scopes, the context's keys at the bottom, one scope per for loop (fresh for each
// iteration) and per macro call. `set` writes the innermost scope; lookups go outwards
// from it, and a macro call's scope continues in the scope where the macro was defined
// (jinja2 scopes macros lexically: a macro body sees its parameters and the template's
// top-level variables, not its caller's locals).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "serve/text/jinja_value.h"

namespace afd::serve::jinja {

// The state of one for loop, read through `loop.*` without building a loop object.
struct LoopState {
  int64_t index0 = 0, length = 0;
  const std::vector<Value>* items = nullptr;
};

class Scopes {
 public:
  // The bottom scope: the context's keys, borrowed (ctx outlives the Scopes).
  explicit Scopes(const json& ctx) {
    scopes_.emplace_back();
    for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_[0].vars[it.key()] = Value::borrow(it.value());
  }

  // The variable `name` and the index of the scope that holds it.
  const Value* lookup(const std::string& name, size_t* where = nullptr) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      auto f = scopes_[i].vars.find(name);
      if (f != scopes_[i].vars.end()) {
        if (where) *where = i;
        return &f->second;
      }
      if (scopes_[i].macro_frame) i = scopes_[i].parent + 1;  // continue where the macro was defined
    }
    return nullptr;
  }
  Value* lookup_mut(const std::string& name) { return const_cast<Value*>(lookup(name)); }
  // The innermost for loop's state, unless a variable named `loop` hides it.
  const LoopState* find_loop() const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      if (scopes_[i].vars.count("loop")) return nullptr;
      if (scopes_[i].loop) return scopes_[i].loop;
      if (scopes_[i].macro_frame) i = scopes_[i].parent + 1;
    }
    return nullptr;
  }

  // Sets `name` in the innermost scope.
  void set(const std::string& name, Value v) { scopes_.back().vars[name] = std::move(v); }
  // Empties the innermost scope (a loop's next iteration).
  void clear_innermost() { scopes_.back().vars.clear(); }

  // A new innermost scope: plain, a for loop's body (`loop` reads *loop, which outlives the
  // scope), or a macro call's (lookups continue in scope `defined_in`). Each is popped by
  // pop(), innermost first.
  void push() { scopes_.emplace_back(); }
  void push_loop(const LoopState* loop) {
    scopes_.emplace_back();
    scopes_.back().loop = loop;
  }
  void push_macro(size_t defined_in) {
    Scope scope;
    scope.macro_frame = true;
    scope.parent = defined_in;
    scopes_.push_back(std::move(scope));
  }
  void pop() { scopes_.pop_back(); }

 private:
  struct Scope {
    std::unordered_map<std::string, Value> vars;
    const LoopState* loop = nullptr;  // a for-loop body's scope: `loop`
    bool macro_frame = false;         // a macro call's scope, defined in scopes_[parent]
    size_t parent = 0;
  };
  std::vector<Scope> scopes_;
};

}  // namespace afd::serve::jinja
