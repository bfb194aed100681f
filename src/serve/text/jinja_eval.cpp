// Evaluator for the Jinja subset, following jinja2 as transformers configures it (an
// ImmutableSandboxedEnvironment with Undefined, trim_blocks, lstrip_blocks, loopcontrols,
// and its own tojson / raise_exception / strftime_now).
//
// The Evaluator runs statements and evaluates expressions: variables live in Scopes
// (jinja_scope.h: jinja's scoping, macros scoped lexically), what a template can call or
// apply (filters, tests, methods, operators, global functions) is in Builtins
// (jinja_builtins.h), and every step and value is charged to the render's Budget
// (jinja_budget.h). Statements, expressions and macro calls being evaluated count towards
// the evaluation depth, so recursion over the AST is bounded by max_eval_depth, and
// recursion over data (printing, json, equality) by max_data_depth.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "serve/text/jinja.h"
#include "serve/text/jinja_ast.h"
#include "serve/text/jinja_budget.h"
#include "serve/text/jinja_builtins.h"
#include "serve/text/jinja_scope.h"
#include "serve/text/jinja_value.h"

namespace afd::serve::jinja {

namespace {

enum class Flow { normal, brk, cont };

class Evaluator {
 public:
  // ctx and lim outlive the Evaluator.
  Evaluator(const json& ctx, const Limits& lim) : budget_(lim), builtins_(&budget_), scopes_(ctx) {}

  // The context's nesting (request data) must be within max_data_depth.
  Status check_context(const json& ctx) {
    const Limits& lim = budget_.limits();
    std::vector<std::pair<const json*, int>> stack{{&ctx, 0}};
    while (!stack.empty()) {
      auto [v, d] = stack.back();
      stack.pop_back();
      if (d > lim.max_data_depth)
        return limit_error(0, "the messages, tools or other context data are nested deeper than", "max_data_depth",
                           lim.max_data_depth);
      if (v->is_structured())
        for (const json& c : *v) stack.push_back({&c, d + 1});
    }
    return Status();
  }

  Result<Flow> exec_list(const NodeList& nodes, std::string* out) {
    for (const auto& n : nodes) {
      AFD_ASSIGN_OR_RETURN(Flow f, exec(*n, out));
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  // ---- statements ---------------------------------------------------------------------
  [[gnu::noinline]] Result<Value> loop_attr(int line, const LoopState& L, const std::string& name) {
    const int64_t i = L.index0, n = L.length;
    if (name == "index") return Value::of(json(i + 1));
    if (name == "index0") return Value::of(json(i));
    if (name == "revindex") return Value::of(json(n - i));
    if (name == "revindex0") return Value::of(json(n - i - 1));
    if (name == "first") return builtins_.truth(i == 0);
    if (name == "last") return builtins_.truth(i == n - 1);
    if (name == "length") return Value::of(json(n));
    if (name == "depth") return Value::of(json(1));
    if (name == "depth0") return Value::of(json(0));
    if (name == "previtem") return i > 0 ? (*L.items)[static_cast<size_t>(i - 1)] : Value::undefined(&name);
    if (name == "nextitem") return i + 1 < n ? (*L.items)[static_cast<size_t>(i + 1)] : Value::undefined(&name);
    (void)line;
    return Value::undefined(&name);
  }
  // `loop` used as a value ({{ loop }}, set l = loop): a dict of its attributes.
  [[gnu::noinline]] Result<Value> loop_value(int line, const LoopState& L) {
    json o = json::object();
    for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                          "previtem", "nextitem"}) {
      AFD_ASSIGN_OR_RETURN(Value v, loop_attr(line, L, k));
      if (v.undef()) continue;
      AFD_RETURN_IF_ERROR(budget_.admit(line, v.j(), 1));
      o[k] = v.j();
    }
    return Value::of(std::move(o));
  }

  Result<Flow> exec(const Node& n, std::string* out) {
    Budget::Depth d(&budget_);
    AFD_RETURN_IF_ERROR(budget_.depth_ok(n.line));
    AFD_RETURN_IF_ERROR(budget_.step(n.line));
    switch (n.kind) {
      case Node::text:
        if (out->size() + n.content.size() > budget_.limits().max_output_bytes)
          return budget_.too_long(n.line, "the output or a string would be longer than");
        AFD_RETURN_IF_ERROR(budget_.alloc(n.line, n.content.size()));
        *out += n.content;
        return Flow::normal;
      case Node::output: {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        AFD_RETURN_IF_ERROR(budget_.append_str(n.line, v, out));
        return Flow::normal;
      }
      case Node::if_:
        for (const auto& [cond, body] : n.branches) {
          bool take_branch = true;
          if (cond) {
            AFD_ASSIGN_OR_RETURN(Value c, eval(*cond));
            take_branch = truthy(c);
          }
          if (take_branch) return exec_list(body, out);
        }
        return Flow::normal;
      case Node::for_:
        return exec_for(n, out);
      case Node::set: {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        AFD_RETURN_IF_ERROR(assign(n, std::move(v)));
        return Flow::normal;
      }
      case Node::set_block: {
        std::string s;
        AFD_ASSIGN_OR_RETURN(Flow f, exec_list(n.body, &s));
        (void)f;
        AFD_RETURN_IF_ERROR(assign(n, Value::of(json(std::move(s)))));
        return Flow::normal;
      }
      case Node::macro:
        scopes_.set(n.targets[0], macro_value(n));
        return Flow::normal;
      case Node::break_:
        return Flow::brk;
      case Node::continue_:
        return Flow::cont;
      case Node::passthrough:
        return exec_list(n.body, out);
    }
    return Flow::normal;
  }

  [[gnu::noinline]] Status assign(const Node& n, Value v) {
    if (n.targets.size() == 1) {
      scopes_.set(n.targets[0], std::move(v));
      return Status();
    }
    Value* ns = scopes_.lookup_mut(n.targets[0]);
    if (!ns || !ns->j().is_object())
      return error(n.line, "cannot assign attribute on " + std::string(ns ? type_name(*ns) : "an undefined value") +
                               " '" + n.targets[0] + "'");
    AFD_ASSIGN_OR_RETURN(json x, budget_.take(n.line, std::move(v), 1));
    AFD_ASSIGN_OR_RETURN(json * obj, budget_.mutable_json(n.line, ns));
    (*obj)[n.targets[1]] = std::move(x);
    return Status();
  }

  Status bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.set(n.targets[0], item);
      return Status();
    }
    AFD_ASSIGN_OR_RETURN(std::vector<Value> parts, builtins_.iterate(n.line, item));
    if (parts.size() != n.targets.size())
      return error(n.line, parts.size() < n.targets.size()
                               ? "not enough values to unpack (expected " + std::to_string(n.targets.size()) + ")"
                               : "too many values to unpack (expected " + std::to_string(n.targets.size()) + ")");
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.set(n.targets[k], std::move(parts[k]));
    return Status();
  }

  [[gnu::noinline]] Result<Flow> exec_for(const Node& n, std::string* out) {
    AFD_ASSIGN_OR_RETURN(Value seq, eval(*n.expr));
    AFD_ASSIGN_OR_RETURN(std::vector<Value> items, builtins_.iterate(n.line, seq));
    // `for x in xs if cond` filters before loop indices are assigned.
    if (n.filter) {
      std::vector<Value> kept;
      for (Value& it : items) {
        scopes_.push();
        Status s = bind_targets(n, it);
        Result<Value> c = s.is_ok() ? eval(*n.filter) : Result<Value>(s);
        scopes_.pop();
        if (!c.ok()) return c.status();
        if (truthy(*c)) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_list(n.else_body, out);
    LoopState state;
    state.length = static_cast<int64_t>(items.size());
    state.items = &items;
    scopes_.push_loop(&state);
    struct Pop {
      Scopes* s;
      ~Pop() { s->pop(); }
    } pop{&scopes_};
    for (; state.index0 < state.length; ++state.index0) {
      AFD_RETURN_IF_ERROR(budget_.step(n.line));
      scopes_.clear_innermost();  // each iteration starts with a fresh scope
      AFD_RETURN_IF_ERROR(bind_targets(n, items[static_cast<size_t>(state.index0)]));
      AFD_ASSIGN_OR_RETURN(Flow f, exec_list(n.body, out));
      if (f == Flow::brk) break;
    }
    return Flow::normal;
  }

  // ---- expressions --------------------------------------------------------------------
  Result<Value> eval(const Expr& e) {
    Budget::Depth d(&budget_);
    AFD_RETURN_IF_ERROR(budget_.depth_ok(e.line));
    AFD_RETURN_IF_ERROR(budget_.step(e.line));
    switch (e.kind) {
      case Expr::literal:
        return Value::borrow(e.value);
      case Expr::var: {
        const Value* v = scopes_.lookup(e.name);
        if (v) return *v;
        if (e.name == "loop")
          if (const LoopState* L = scopes_.find_loop()) return loop_value(e.line, *L);
        return Value::undefined(&e.name);
      }
      case Expr::attr: {
        if (e.args[0]->kind == Expr::var && e.args[0]->name == "loop")
          if (const LoopState* L = scopes_.find_loop()) return loop_attr(e.line, *L, e.name);
        AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
        return builtins_.get_attr(e.line, o, e.name);
      }
      case Expr::index:
        return eval_index(e);
      case Expr::slice:
        return eval_slice(e);
      case Expr::call:
        return eval_call(e);
      case Expr::filter:
        return eval_filter(e);
      case Expr::test:
        return eval_test(e);
      case Expr::unary:
        return eval_unary(e);
      case Expr::binary:
        return eval_binary(e);
      case Expr::cond: {
        AFD_ASSIGN_OR_RETURN(Value c, eval(*e.args[1]));
        if (truthy(c)) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined();
      }
      case Expr::list:
      case Expr::dict:
        return eval_literal(e);
    }
    return Value::undefined();
  }

  // The cases of eval() live in their own functions so that eval's frame, which every
  // level of expression nesting adds to the stack, stays small.
  [[gnu::noinline]] Result<Value> eval_index(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(Value k, eval(*e.args[1]));
    return builtins_.get_item(e.line, o, k);
  }
  [[gnu::noinline]] Result<Value> eval_filter(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    return builtins_.apply_filter(e.line, e.name, x, a);
  }
  [[gnu::noinline]] Result<Value> eval_test(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    AFD_ASSIGN_OR_RETURN(bool r, builtins_.run_test(e.line, e.name, x, a));
    return builtins_.truth(e.negate ? !r : r);
  }
  [[gnu::noinline]] Result<Value> eval_unary(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    return builtins_.unary(e.line, e.name, x);
  }
  [[gnu::noinline]] Result<Value> eval_literal(const Expr& e) {
    if (e.kind == Expr::list) {
      json a = json::array();
      for (const auto& x : e.args) {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*x));
        AFD_ASSIGN_OR_RETURN(json item, budget_.take(e.line, std::move(v), 1));
        a.push_back(std::move(item));
      }
      return Value::of(std::move(a));
    }
    json o = json::object();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      AFD_ASSIGN_OR_RETURN(Value k, eval(*e.args[i]));
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1]));
      if (!k.j().is_string() || k.undef()) return error(e.line, "dict keys must be strings");
      AFD_ASSIGN_OR_RETURN(json item, budget_.take(e.line, std::move(v), 1));
      o[k.j().get<std::string>()] = std::move(item);
    }
    return Value::of(std::move(o));
  }

  [[gnu::noinline]] Result<Value> eval_slice(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
    if (o.undef()) return undefined_error(e.line, o);
    SliceBounds s;
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[k + 1]));
      if (v.undef() || v.j().is_null()) continue;
      if (!v.j().is_number_integer()) return error(e.line, "slice indices must be integers or None");
      s.idx[k] = v.j().get<int64_t>();
      s.given[k] = true;
    }
    return builtins_.slice(e.line, o, s);
  }

  Result<Args> eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) {
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      a.pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      AFD_ASSIGN_OR_RETURN(Value v, eval(*x));
      a.kw.push_back({k, std::move(v)});
    }
    return a;
  }

  [[gnu::noinline]] Result<Value> eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::attr && callee.name == "cycle" && callee.args[0]->kind == Expr::var &&
        callee.args[0]->name == "loop") {
      if (const LoopState* L = scopes_.find_loop()) {
        AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
        if (a.pos.empty()) return error(e.line, "no items for cycling given");
        return a.pos[static_cast<size_t>(L->index0) % a.pos.size()];
      }
    }
    if (callee.kind == Expr::attr) {
      AFD_ASSIGN_OR_RETURN(Value self, eval(*callee.args[0]));
      if (self.undef()) return undefined_error(e.line, self);
      AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
      return builtins_.call_method(e.line, self, callee.name, a);
    }
    if (callee.kind != Expr::var) return error(e.line, "only named functions, macros and methods can be called");
    const std::string& f = callee.name;
    AFD_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    size_t defined_in = 0;
    if (const Value* v = scopes_.lookup(f, &defined_in); v && v->macro)
      return call_macro(e.line, *v->macro, defined_in, a);
    return builtins_.call_global(e.line, f, std::move(a));
  }

  Value macro_value(const Node& n) {
    Value v;
    v.p = macro_placeholder_;
    v.macro = &n;
    return v;
  }

  [[gnu::noinline]] Result<Value> call_macro(int line, const Node& m, size_t defined_in, const Args& a) {
    if (call_depth_ >= budget_.limits().max_call_depth)
      return limit_error(line, "macro calls nested deeper than", "max_call_depth", budget_.limits().max_call_depth);
    if (a.pos.size() > m.params.size())
      return error(line, "macro '" + m.targets[0] + "' takes not more than " + std::to_string(m.params.size()) +
                             " argument(s)");
    for (const auto& [k, v] : a.kw) {
      bool known = false;
      for (const auto& p : m.params) known = known || p.first == k;
      if (!known) return error(line, "macro '" + m.targets[0] + "' takes no keyword argument '" + k + "'");
    }
    scopes_.push_macro(defined_in);
    ++call_depth_;
    struct Pop {
      Evaluator* ev;
      ~Pop() {
        ev->scopes_.pop();
        --ev->call_depth_;
      }
    } pop{this};
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      Value v = Value::undefined(&name);
      if (const Value* given = a.get(i, name.c_str())) {
        v = *given;
      } else if (def) {
        AFD_ASSIGN_OR_RETURN(v, eval(*def));
      }
      scopes_.set(name, std::move(v));
    }
    std::string out;
    AFD_ASSIGN_OR_RETURN(Flow f, exec_list(m.body, &out));
    (void)f;
    return Value::of(json(std::move(out)));
  }

  [[gnu::noinline]] Result<Value> eval_binary(const Expr& e) {
    const std::string& op = e.name;
    AFD_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
    if (op == "and") {
      if (!truthy(a)) return a;
      return eval(*e.args[1]);
    }
    if (op == "or") {
      if (truthy(a)) return a;
      return eval(*e.args[1]);
    }
    AFD_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
    return builtins_.binary(e.line, op, std::move(a), std::move(b));
  }

  Budget budget_;
  Builtins builtins_;
  Scopes scopes_;
  const std::shared_ptr<json> macro_placeholder_ = std::make_shared<json>();
  int call_depth_ = 0;
};

}  // namespace

Result<std::string> Template::render(const json& context) const {
  if (!context.is_object()) return invalid_argument("chat template context must be an object");
  Evaluator ev(context, limits_);
  std::string out;
  try {
    AFD_RETURN_IF_ERROR(ev.check_context(context));
    auto f = ev.exec_list(body_, &out);
    if (!f.ok()) return f.status();
  } catch (const std::exception& ex) {  // nlohmann type errors on unexpected data shapes, bad_alloc
    return invalid_argument(std::string("chat template evaluation failed: ") + ex.what());
  }
  return out;
}

}  // namespace afd::serve::jinja
