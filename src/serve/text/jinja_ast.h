// Jinja AST (internal to the interpreter). Expressions and statements own their children;
// the parser bounds both trees' depth (Limits), so recursing over them is safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace afd::serve::jinja {

struct Expr {
  enum Kind {
    literal,    // value
    var,        // name
    attr,       // a.name
    index,      // a[b]
    slice,      // a[b:c:d] (args: a, b?, c?, d? as nullptr when absent)
    call,       // a(args..., kwargs...)
    filter,     // a | name(args...)
    test,       // a is [not] name(args...)
    unary,      // op: "not", "-", "+"
    binary,     // op: or and == != < > <= >= in notin + - * / // % ** ~
    cond,       // a if b else c  (args: then, cond, else?)
    list,       // [args...]
    dict,       // {k: v, ...}: args alternate key, value
  };
  Kind kind;
  std::string name;  // var/attr/filter/test name, or operator
  nlohmann::ordered_json value;
  bool negate = false;  // test: "is not"
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  int line = 0;
  int height = 1;  // 1 + the largest child's height (bounded by Limits::max_expr_depth)
};

struct Node {
  enum Kind { text, output, if_, for_, set, set_block, macro, break_, continue_, passthrough };
  Kind kind;
  int line = 0;
  std::string content;                       // text node content
  std::unique_ptr<Expr> expr;                // output; set value; for iterable
  // if: branches of (condition or nullptr for else, body)
  std::vector<std::pair<std::unique_ptr<Expr>, std::vector<std::unique_ptr<Node>>>> branches;
  std::vector<std::string> targets;          // for loop variables; set: [name] or [name, attr]
  std::unique_ptr<Expr> filter;              // for ... if filter
  std::vector<std::unique_ptr<Node>> body;   // for/set_block/macro/passthrough body
  std::vector<std::unique_ptr<Node>> else_body;  // for ... else
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> params;  // macro params with defaults
};

using NodeList = std::vector<std::unique_ptr<Node>>;

}  // namespace afd::serve::jinja
