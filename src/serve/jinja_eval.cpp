// Evaluator for the Jinja subset. Values are JSON (ordered, like Python dicts) plus an
// "undefined" flag. Scoping follows Jinja: a for loop body and a macro call get their own
// scope; `set` writes to the innermost scope; `set ns.attr` updates the namespace object
// where `ns` lives.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "serve/jinja.h"
#include "serve/jinja_ast.h"

namespace afd::serve::jinja {
namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxOutput = 16u << 20;   // bytes
constexpr int64_t kMaxSteps = 10'000'000;  // loop iterations + node executions
constexpr int kMaxDepth = 64;              // macro recursion

struct Value {
  json j;
  bool undef = false;
  static Value undefined() { return Value{json(), true}; }
};

enum class Flow { normal, brk, cont };

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == std::floor(d) && std::fabs(d) < 1e16) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", d);
    return buf;
  }
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

// Python-like json.dumps (ensure_ascii=False).
void dumps(const json& v, int indent, int depth, std::string* out) {
  auto nl = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  if (v.is_object()) {
    if (v.empty()) {
      *out += "{}";
      return;
    }
    out->push_back('{');
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += item_sep;
      first = false;
      nl(depth + 1);
      *out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace);
      *out += ": ";
      dumps(it.value(), indent, depth + 1, out);
    }
    nl(depth);
    out->push_back('}');
  } else if (v.is_array()) {
    if (v.empty()) {
      *out += "[]";
      return;
    }
    out->push_back('[');
    bool first = true;
    for (const json& x : v) {
      if (!first) *out += item_sep;
      first = false;
      nl(depth + 1);
      dumps(x, indent, depth + 1, out);
    }
    nl(depth);
    out->push_back(']');
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    *out += std::isfinite(d) ? py_float(d) : (std::isnan(d) ? "NaN" : (d > 0 ? "Infinity" : "-Infinity"));
  } else {
    *out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

// Python repr of a value (lists and dicts printed by {{ }}).
void repr(const json& v, std::string* out, bool top) {
  if (v.is_string()) {
    if (top) {
      *out += v.get_ref<const std::string&>();
      return;
    }
    const std::string& s = v.get_ref<const std::string&>();
    char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    out->push_back(q);
    for (char c : s) {
      if (c == q || c == '\\') out->push_back('\\');
      if (c == '\n') {
        *out += "\\n";
        continue;
      }
      out->push_back(c);
    }
    out->push_back(q);
  } else if (v.is_null()) {
    *out += "None";
  } else if (v.is_boolean()) {
    *out += v.get<bool>() ? "True" : "False";
  } else if (v.is_number_float()) {
    *out += py_float(v.get<double>());
  } else if (v.is_number()) {
    *out += v.dump();
  } else if (v.is_array()) {
    out->push_back('[');
    bool first = true;
    for (const json& x : v) {
      if (!first) *out += ", ";
      first = false;
      repr(x, out, false);
    }
    out->push_back(']');
  } else {
    out->push_back('{');
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += ", ";
      first = false;
      repr(json(it.key()), out, false);
      *out += ": ";
      repr(it.value(), out, false);
    }
    out->push_back('}');
  }
}

std::string to_str(const Value& v) {
  if (v.undef) return "";
  std::string s;
  repr(v.j, &s, true);
  return s;
}

bool truthy(const Value& v) {
  if (v.undef || v.j.is_null()) return false;
  if (v.j.is_boolean()) return v.j.get<bool>();
  if (v.j.is_number_integer()) return v.j.get<int64_t>() != 0;
  if (v.j.is_number()) return v.j.get<double>() != 0.0;
  if (v.j.is_string() || v.j.is_array() || v.j.is_object()) return !v.j.empty();
  return false;
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  auto in = [&](char c) { return chars.find(c) != std::string::npos; };
  if (left)
    while (b < e && in(s[b])) ++b;
  if (right)
    while (e > b && in(s[e - 1])) --e;
  return s.substr(b, e - b);
}
const std::string kSpace = " \t\n\r\f\v";

class Evaluator {
 public:
  explicit Evaluator(const json& ctx) {
    scopes_.emplace_back();
    for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_[0][it.key()] = Value{it.value(), false};
  }

  Status error(int line, const std::string& m) const {
    return invalid_argument("chat template line " + std::to_string(line) + ": " + m);
  }

  Result<Flow> exec_list(const NodeList& nodes, std::string* out) {
    for (const auto& n : nodes) {
      AFD_ASSIGN_OR_RETURN(Flow f, exec(*n, out));
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Value* lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  Result<Flow> exec(const Node& n, std::string* out) {
    if (++steps_ > kMaxSteps) return error(n.line, "template execution exceeded its step budget");
    if (out->size() > kMaxOutput) return error(n.line, "template output exceeded " + std::to_string(kMaxOutput) + " bytes");
    switch (n.kind) {
      case Node::text:
        *out += n.content;
        return Flow::normal;
      case Node::output: {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        *out += to_str(v);
        return Flow::normal;
      }
      case Node::if_:
        for (const auto& [cond, body] : n.branches) {
          bool take = true;
          if (cond) {
            AFD_ASSIGN_OR_RETURN(Value c, eval(*cond));
            take = truthy(c);
          }
          if (take) return exec_list(body, out);
        }
        return Flow::normal;
      case Node::for_:
        return exec_for(n, out);
      case Node::set: {
        AFD_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        return assign(n, std::move(v));
      }
      case Node::set_block: {
        std::string s;
        AFD_ASSIGN_OR_RETURN(Flow f, exec_list(n.body, &s));
        (void)f;
        return assign(n, Value{json(s), false});
      }
      case Node::macro:
        macros_[n.targets[0]] = &n;
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

  Result<Flow> assign(const Node& n, Value v) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return Flow::normal;
    }
    Value* ns = lookup(n.targets[0]);
    if (!ns || !ns->j.is_object()) return error(n.line, "cannot set attribute of '" + n.targets[0] + "'");
    ns->j[n.targets[1]] = std::move(v.j);
    return Flow::normal;
  }

  Result<Flow> exec_for(const Node& n, std::string* out) {
    AFD_ASSIGN_OR_RETURN(Value seq, eval(*n.expr));
    std::vector<json> items;
    if (seq.j.is_array()) {
      items.assign(seq.j.begin(), seq.j.end());
    } else if (seq.j.is_object()) {
      for (auto it = seq.j.begin(); it != seq.j.end(); ++it) items.push_back(it.key());
    } else if (seq.j.is_string()) {
      for (char c : seq.j.get<std::string>()) items.push_back(std::string(1, c));
    } else if (!seq.undef && !seq.j.is_null()) {
      return error(n.line, "cannot iterate over " + std::string(seq.j.type_name()));
    }
    // `for x in xs if cond` filters before loop indices are assigned.
    std::vector<json> kept;
    for (json& it : items) {
      if (n.filter) {
        scopes_.emplace_back();
        bind_targets(n, it);
        auto c = eval(*n.filter);
        scopes_.pop_back();
        if (!c.ok()) return c.status();
        if (!truthy(*c)) continue;
      }
      kept.push_back(std::move(it));
    }
    if (kept.empty()) return exec_list(n.else_body, out);
    const int64_t len = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++steps_ > kMaxSteps) return error(n.line, "template execution exceeded its step budget");
      scopes_.emplace_back();
      bind_targets(n, kept[i]);
      json loop = {{"index", i + 1},          {"index0", i},      {"revindex", len - i}, {"revindex0", len - i - 1},
                   {"first", i == 0},         {"last", i == len - 1}, {"length", len}};
      loop["previtem"] = i > 0 ? kept[i - 1] : json();
      loop["nextitem"] = i + 1 < len ? kept[i + 1] : json();
      scopes_.back()["loop"] = Value{std::move(loop), false};
      auto f = exec_list(n.body, out);
      scopes_.pop_back();
      if (!f.ok()) return f.status();
      if (*f == Flow::brk) break;
    }
    return Flow::normal;
  }

  void bind_targets(const Node& n, const json& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = Value{item, false};
      return;
    }
    for (size_t k = 0; k < n.targets.size(); ++k)
      scopes_.back()[n.targets[k]] =
          item.is_array() && k < item.size() ? Value{item[k], false} : Value::undefined();
  }

  Result<Value> eval(const Expr& e) {
    switch (e.kind) {
      case Expr::literal:
        return Value{e.value, false};
      case Expr::var: {
        Value* v = lookup(e.name);
        return v ? *v : Value::undefined();
      }
      case Expr::attr: {
        AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
        if (o.j.is_object() && o.j.contains(e.name)) return Value{o.j[e.name], false};
        return Value::undefined();
      }
      case Expr::index: {
        AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
        AFD_ASSIGN_OR_RETURN(Value k, eval(*e.args[1]));
        return index(o, k);
      }
      case Expr::slice:
        return eval_slice(e);
      case Expr::call:
        return eval_call(e);
      case Expr::filter:
        return eval_filter(e);
      case Expr::test: {
        AFD_ASSIGN_OR_RETURN(bool r, eval_test(e));
        return Value{json(e.negate ? !r : r), false};
      }
      case Expr::unary: {
        AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
        if (e.name == "not") return Value{json(!truthy(x)), false};
        if (!x.j.is_number()) return error(e.line, "unary " + e.name + " on a non-number");
        if (e.name == "+") return x;
        if (x.j.is_number_integer()) {
          int64_t r;
          if (__builtin_sub_overflow(int64_t{0}, x.j.get<int64_t>(), &r)) return error(e.line, "integer overflow in -");
          return Value{json(r), false};
        }
        return Value{json(-x.j.get<double>()), false};
      }
      case Expr::binary:
        return eval_binary(e);
      case Expr::cond: {
        AFD_ASSIGN_OR_RETURN(Value c, eval(*e.args[1]));
        if (truthy(c)) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined();
      }
      case Expr::list: {
        json a = json::array();
        for (const auto& x : e.args) {
          AFD_ASSIGN_OR_RETURN(Value v, eval(*x));
          a.push_back(v.j);
        }
        return Value{std::move(a), false};
      }
      case Expr::dict: {
        json o = json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          AFD_ASSIGN_OR_RETURN(Value k, eval(*e.args[i]));
          AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1]));
          if (!k.j.is_string()) return error(e.line, "dict keys must be strings");
          o[k.j.get<std::string>()] = v.j;
        }
        return Value{std::move(o), false};
      }
    }
    return Value::undefined();
  }

  Result<Value> index(const Value& o, const Value& k) {
    if (o.j.is_array() && k.j.is_number_integer()) {
      int64_t i = k.j.get<int64_t>(), n = static_cast<int64_t>(o.j.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return Value{o.j[static_cast<size_t>(i)], false};
    }
    if (o.j.is_object() && k.j.is_string()) {
      auto it = o.j.find(k.j.get<std::string>());
      if (it == o.j.end()) return Value::undefined();
      return Value{*it, false};
    }
    if (o.j.is_string() && k.j.is_number_integer()) {
      const std::string& s = o.j.get_ref<const std::string&>();
      int64_t i = k.j.get<int64_t>(), n = static_cast<int64_t>(s.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return Value{json(std::string(1, s[static_cast<size_t>(i)])), false};
    }
    return Value::undefined();
  }

  Result<Value> eval_slice(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value o, eval(*e.args[0]));
    int64_t idx[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[k + 1]));
      if (v.j.is_null() || v.undef) continue;
      if (!v.j.is_number_integer()) return error(e.line, "slice bounds must be integers");
      idx[k] = v.j.get<int64_t>();
      given[k] = true;
    }
    int64_t step = idx[2];
    if (step == 0) return error(e.line, "slice step cannot be zero");
    int64_t n = o.j.is_array() || o.j.is_string() ? static_cast<int64_t>(o.j.is_array() ? o.j.size() : o.j.get_ref<const std::string&>().size()) : -1;
    if (n < 0) return error(e.line, "cannot slice " + std::string(o.j.type_name()));
    auto norm = [&](int64_t v, bool g, int64_t def) {
      if (!g) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    int64_t start = norm(idx[0], given[0], step > 0 ? 0 : n - 1);
    int64_t stop = norm(idx[1], given[1], step > 0 ? n : -1);
    std::vector<int64_t> pick;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      pick.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (o.j.is_array()) {
      json a = json::array();
      for (int64_t i : pick) a.push_back(o.j[static_cast<size_t>(i)]);
      return Value{std::move(a), false};
    }
    const std::string& s = o.j.get_ref<const std::string&>();
    std::string r;
    for (int64_t i : pick) r += s[static_cast<size_t>(i)];
    return Value{json(r), false};
  }

  Result<std::vector<Value>> eval_args(const Expr& e, size_t first) {
    std::vector<Value> a;
    for (size_t i = first; i < e.args.size(); ++i) {
      AFD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      a.push_back(std::move(v));
    }
    return a;
  }
  Result<Value> kwarg(const Expr& e, const std::string& name) {
    for (const auto& [k, v] : e.kwargs)
      if (k == name) return eval(*v);
    return Value::undefined();
  }

  Result<Value> eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    AFD_ASSIGN_OR_RETURN(std::vector<Value> args, eval_args(e, 1));
    if (callee.kind == Expr::attr) {
      AFD_ASSIGN_OR_RETURN(Value self, eval(*callee.args[0]));
      return call_method(e, self, callee.name, args);
    }
    if (callee.kind != Expr::var) return error(e.line, "call of a non-function");
    const std::string& f = callee.name;
    if (auto it = macros_.find(f); it != macros_.end()) return call_macro(e, *it->second, args);
    if (f == "raise_exception") {
      return invalid_argument("chat template raised: " + (args.empty() ? std::string("error") : to_str(args[0])));
    }
    if (f == "namespace" || f == "dict") {
      json o = json::object();
      for (const auto& [k, v] : e.kwargs) {
        AFD_ASSIGN_OR_RETURN(Value x, eval(*v));
        o[k] = x.j;
      }
      return Value{std::move(o), false};
    }
    if (f == "range") {
      int64_t a = 0, b = 0, s = 1;
      for (auto& x : args)
        if (!x.j.is_number_integer()) return error(e.line, "range() takes integers");
      if (args.size() == 1) b = args[0].j.get<int64_t>();
      else if (args.size() >= 2) a = args[0].j.get<int64_t>(), b = args[1].j.get<int64_t>();
      if (args.size() == 3) s = args[2].j.get<int64_t>();
      if (s == 0) return error(e.line, "range() step is zero");
      json r = json::array();
      for (int64_t i = a; s > 0 ? i < b : i > b;) {
        if (r.size() > 1'000'000) return error(e.line, "range() too long");
        r.push_back(i);
        if (__builtin_add_overflow(i, s, &i)) break;
      }
      return Value{std::move(r), false};
    }
    if (f == "strftime_now") {
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[256];
      std::string fmt = args.empty() ? "%Y-%m-%d" : to_str(args[0]);
      size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value{json(std::string(buf, n)), false};
    }
    return error(e.line, "unknown function '" + f + "'");
  }

  Result<Value> call_macro(const Expr& e, const Node& m, const std::vector<Value>& args) {
    if (depth_ >= kMaxDepth) return error(e.line, "macro recursion too deep");
    std::unordered_map<std::string, Value> scope;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      Value v = Value::undefined();
      if (i < args.size()) {
        v = args[i];
      } else {
        bool found = false;
        for (const auto& [k, x] : e.kwargs)
          if (k == name) {
            AFD_ASSIGN_OR_RETURN(v, eval(*x));
            found = true;
          }
        if (!found && def) {
          AFD_ASSIGN_OR_RETURN(v, eval(*def));
        }
      }
      scope[name] = std::move(v);
    }
    scopes_.push_back(std::move(scope));
    ++depth_;
    std::string out;
    auto f = exec_list(m.body, &out);
    --depth_;
    scopes_.pop_back();
    if (!f.ok()) return f.status();
    return Value{json(out), false};
  }

  Result<Value> call_method(const Expr& e, const Value& self, const std::string& m, const std::vector<Value>& args) {
    auto str_arg = [&](size_t i) -> std::string {
      return i < args.size() && args[i].j.is_string() ? args[i].j.get<std::string>() : std::string();
    };
    if (self.j.is_string()) {
      const std::string& s = self.j.get_ref<const std::string&>();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        std::string chars = args.empty() || args[0].j.is_null() ? kSpace : str_arg(0);
        return Value{json(strip_chars(s, chars, m != "rstrip", m != "lstrip")), false};
      }
      if (m == "startswith" || m == "endswith") {
        std::vector<std::string> pre;
        if (!args.empty() && args[0].j.is_array()) {
          for (auto& x : args[0].j)
            if (x.is_string()) pre.push_back(x.get<std::string>());
        } else {
          pre.push_back(str_arg(0));
        }
        bool r = false;
        for (auto& p : pre)
          r = r || (m == "startswith" ? s.compare(0, p.size(), p) == 0 && s.size() >= p.size()
                                      : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0);
        return Value{json(r), false};
      }
      if (m == "split") {
        json a = json::array();
        int64_t maxsplit = args.size() > 1 && args[1].j.is_number_integer() ? args[1].j.get<int64_t>() : -1;
        if (args.empty() || args[0].j.is_null()) {
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && kSpace.find(s[i]) != std::string::npos) ++i;
            if (i >= s.size()) break;
            size_t j = i;
            while (j < s.size() && kSpace.find(s[j]) == std::string::npos) ++j;
            a.push_back(s.substr(i, j - i));
            i = j;
          }
          return Value{std::move(a), false};
        }
        std::string sep = str_arg(0);
        if (sep.empty()) return error(e.line, "split() with an empty separator");
        size_t i = 0;
        for (;;) {
          size_t j = s.find(sep, i);
          if (j == std::string::npos || maxsplit == 0) {
            a.push_back(s.substr(i));
            break;
          }
          a.push_back(s.substr(i, j - i));
          i = j + sep.size();
          if (maxsplit > 0) --maxsplit;
        }
        return Value{std::move(a), false};
      }
      if (m == "upper" || m == "lower") {
        std::string r = s;
        for (char& c : r) c = m == "upper" ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                                           : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return Value{json(r), false};
      }
      if (m == "replace") {
        std::string from = str_arg(0), to = str_arg(1), r;
        if (from.empty()) return Value{json(s), false};
        size_t i = 0;
        for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) r += s.substr(i, j - i) + to;
        r += s.substr(i);
        return Value{json(r), false};
      }
      if (m == "find") {
        size_t p = s.find(str_arg(0));
        return Value{json(p == std::string::npos ? int64_t{-1} : static_cast<int64_t>(p)), false};
      }
      if (m == "join") {
        std::string r;
        if (!args.empty() && args[0].j.is_array()) {
          bool first = true;
          for (auto& x : args[0].j) {
            if (!first) r += s;
            first = false;
            r += to_str(Value{x, false});
          }
        }
        return Value{json(r), false};
      }
      if (m == "title" || m == "capitalize") return apply_filter(e, m, self, args);
    }
    if (self.j.is_object()) {
      if (m == "items") {
        json a = json::array();
        for (auto it = self.j.begin(); it != self.j.end(); ++it) a.push_back(json::array({it.key(), it.value()}));
        return Value{std::move(a), false};
      }
      if (m == "keys" || m == "values") {
        json a = json::array();
        for (auto it = self.j.begin(); it != self.j.end(); ++it) a.push_back(m == "keys" ? json(it.key()) : it.value());
        return Value{std::move(a), false};
      }
      if (m == "get") {
        std::string k = str_arg(0);
        auto it = self.j.find(k);
        if (it != self.j.end()) return Value{*it, false};
        return args.size() > 1 ? args[1] : Value{json(), false};
      }
    }
    return error(e.line, "unknown method '" + m + "' on " + std::string(self.undef ? "undefined" : self.j.type_name()));
  }

  Result<Value> eval_filter(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(std::vector<Value> args, eval_args(e, 1));
    return apply_filter(e, e.name, x, args);
  }

  Result<Value> apply_filter(const Expr& e, const std::string& f, const Value& x, const std::vector<Value>& args) {
    if (f == "trim") {
      std::string chars = args.empty() || !args[0].j.is_string() ? kSpace : args[0].j.get<std::string>();
      return Value{json(strip_chars(to_str(x), chars, true, true)), false};
    }
    if (f == "length" || f == "count") {
      if (x.j.is_string() || x.j.is_array() || x.j.is_object()) return Value{json(static_cast<int64_t>(x.j.size())), false};
      if (x.undef) return Value{json(0), false};
      return error(e.line, "length of " + std::string(x.j.type_name()));
    }
    if (f == "tojson") {
      AFD_ASSIGN_OR_RETURN(Value ind, kwarg(e, "indent"));
      int indent = -1;
      if (!args.empty() && args[0].j.is_number_integer()) indent = static_cast<int>(args[0].j.get<int64_t>());
      if (ind.j.is_number_integer()) indent = static_cast<int>(ind.j.get<int64_t>());
      indent = std::clamp(indent, -1, 16);
      std::string s;
      dumps(x.j, indent, 0, &s);
      return Value{json(s), false};
    }
    if (f == "string") return Value{json(to_str(x)), false};
    if (f == "safe") return x;
    if (f == "lower" || f == "upper") {
      std::string s = to_str(x);
      for (char& c : s) c = f == "upper" ? static_cast<char>(std::toupper(static_cast<unsigned char>(c)))
                                         : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return Value{json(s), false};
    }
    if (f == "capitalize" || f == "title") {
      std::string s = to_str(x);
      bool start = true;
      for (size_t i = 0; i < s.size(); ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (f == "capitalize") s[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
        else {
          s[i] = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
          start = !std::isalnum(c);
        }
      }
      return Value{json(s), false};
    }
    if (f == "default" || f == "d") {
      bool boolean = args.size() > 1 && truthy(args[1]);
      if (x.undef || (boolean && !truthy(x))) return args.empty() ? Value{json(""), false} : args[0];
      return x;
    }
    if (f == "first" || f == "last") {
      if (x.j.is_array() && !x.j.empty()) return Value{f == "first" ? x.j.front() : x.j.back(), false};
      if (x.j.is_string() && !x.j.get_ref<const std::string&>().empty()) {
        const std::string& s = x.j.get_ref<const std::string&>();
        return Value{json(std::string(1, f == "first" ? s.front() : s.back())), false};
      }
      return Value::undefined();
    }
    if (f == "join") {
      std::string sep = !args.empty() && args[0].j.is_string() ? args[0].j.get<std::string>() : "";
      std::string r;
      if (x.j.is_array()) {
        bool first = true;
        for (auto& v : x.j) {
          if (!first) r += sep;
          first = false;
          r += to_str(Value{v, false});
        }
      }
      return Value{json(r), false};
    }
    if (f == "items") return call_method(e, x, "items", {});
    if (f == "list") {
      if (x.j.is_array()) return x;
      json a = json::array();
      if (x.j.is_string())
        for (char c : x.j.get<std::string>()) a.push_back(std::string(1, c));
      else if (x.j.is_object())
        for (auto it = x.j.begin(); it != x.j.end(); ++it) a.push_back(it.key());
      return Value{std::move(a), false};
    }
    if (f == "reverse") {
      if (x.j.is_array()) {
        json a = x.j;
        std::reverse(a.begin(), a.end());
        return Value{std::move(a), false};
      }
      std::string s = to_str(x);
      std::reverse(s.begin(), s.end());
      return Value{json(s), false};
    }
    if (f == "int") {
      if (x.j.is_number_integer()) return x;
      if (x.j.is_number()) {
        double d = x.j.get<double>();
        if (!(std::fabs(d) < 9.2e18)) return error(e.line, "int() of an out-of-range number");
        return Value{json(static_cast<int64_t>(d)), false};
      }
      try {
        return Value{json(std::stoll(to_str(x))), false};
      } catch (...) {
        return Value{json(0), false};
      }
    }
    if (f == "float") {
      if (x.j.is_number()) return Value{json(x.j.get<double>()), false};
      return Value{json(std::strtod(to_str(x).c_str(), nullptr)), false};
    }
    if (f == "abs") {
      if (x.j.is_number_integer() && x.j.get<int64_t>() != INT64_MIN) return Value{json(std::llabs(x.j.get<int64_t>())), false};
      if (x.j.is_number()) return Value{json(std::fabs(x.j.get<double>())), false};
      return error(e.line, "abs of a non-number");
    }
    if (f == "replace") return call_method(e, Value{json(to_str(x)), false}, "replace", args);
    if (f == "selectattr" || f == "rejectattr") {
      if (!x.j.is_array()) return Value{json::array(), false};
      std::string attr = !args.empty() && args[0].j.is_string() ? args[0].j.get<std::string>() : "";
      std::string test = args.size() > 1 && args[1].j.is_string() ? args[1].j.get<std::string>() : "";
      json a = json::array();
      for (auto& item : x.j) {
        Value v = item.is_object() && item.contains(attr) ? Value{item[attr], false} : Value::undefined();
        bool r;
        if (test.empty()) r = truthy(v);
        else {
          std::vector<Value> targs(args.begin() + std::min<size_t>(2, args.size()), args.end());
          AFD_ASSIGN_OR_RETURN(r, run_test(e, test, v, targs));
        }
        if (r == (f == "selectattr")) a.push_back(item);
      }
      return Value{std::move(a), false};
    }
    if (f == "map") {
      AFD_ASSIGN_OR_RETURN(Value attr, kwarg(e, "attribute"));
      json a = json::array();
      if (x.j.is_array()) {
        for (auto& item : x.j) {
          if (attr.j.is_string()) {
            a.push_back(item.is_object() && item.contains(attr.j.get<std::string>()) ? item[attr.j.get<std::string>()] : json());
          } else if (!args.empty() && args[0].j.is_string()) {
            AFD_ASSIGN_OR_RETURN(Value r, apply_filter(e, args[0].j.get<std::string>(), Value{item, false}, {}));
            a.push_back(r.j);
          }
        }
      }
      return Value{std::move(a), false};
    }
    return error(e.line, "unknown filter '" + f + "'");
  }

  Result<bool> eval_test(const Expr& e) {
    AFD_ASSIGN_OR_RETURN(Value x, eval(*e.args[0]));
    AFD_ASSIGN_OR_RETURN(std::vector<Value> args, eval_args(e, 1));
    return run_test(e, e.name, x, args);
  }

  Result<bool> run_test(const Expr& e, const std::string& t, const Value& x, const std::vector<Value>& args) {
    const json& j = x.j;
    if (t == "defined") return !x.undef;
    if (t == "undefined") return x.undef;
    if (x.undef && t != "none") return false;
    if (t == "none") return !x.undef && j.is_null();
    if (t == "string") return j.is_string();
    if (t == "number") return j.is_number();
    if (t == "integer") return j.is_number_integer();
    if (t == "float") return j.is_number_float();
    if (t == "boolean") return j.is_boolean();
    if (t == "true") return j.is_boolean() && j.get<bool>();
    if (t == "false") return j.is_boolean() && !j.get<bool>();
    if (t == "mapping") return j.is_object();
    if (t == "iterable") return j.is_array() || j.is_string() || j.is_object();
    if (t == "sequence") return j.is_array() || j.is_string();
    if (t == "even" || t == "odd") {
      if (!j.is_number_integer()) return false;
      return (j.get<int64_t>() % 2 == 0) == (t == "even");
    }
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return !args.empty() && j == args[0].j;
    if (t == "ne" || t == "!=") return args.empty() || j != args[0].j;
    if (t == "in") {
      if (args.empty()) return false;
      return contains(args[0], x);
    }
    return error(e.line, "unknown test '" + t + "'");
  }

  static bool contains(const Value& hay, const Value& needle) {
    if (hay.j.is_array()) return std::find(hay.j.begin(), hay.j.end(), needle.j) != hay.j.end();
    if (hay.j.is_object()) return needle.j.is_string() && hay.j.contains(needle.j.get<std::string>());
    if (hay.j.is_string() && needle.j.is_string())
      return hay.j.get_ref<const std::string&>().find(needle.j.get_ref<const std::string&>()) != std::string::npos;
    return false;
  }

  Result<Value> eval_binary(const Expr& e) {
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
    const json &x = a.j, &y = b.j;
    if (op == "==") return Value{json(a.undef == b.undef && x == y), false};
    if (op == "!=") return Value{json(!(a.undef == b.undef && x == y)), false};
    if (op == "in") return Value{json(contains(b, a)), false};
    if (op == "notin") return Value{json(!contains(b, a)), false};
    if (op == "~") return Value{json(to_str(a) + to_str(b)), false};
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      bool ok = (x.is_number() && y.is_number()) || (x.is_string() && y.is_string());
      if (!ok) return error(e.line, "cannot compare " + std::string(x.type_name()) + " and " + y.type_name());
      bool r = op == "<" ? x < y : op == ">" ? y < x : op == "<=" ? !(y < x) : !(x < y);
      return Value{json(r), false};
    }
    if (op == "+") {
      if (x.is_string() && y.is_string()) {
        if (x.get_ref<const std::string&>().size() + y.get_ref<const std::string&>().size() > kMaxOutput)
          return error(e.line, "string too long");
        return Value{json(x.get<std::string>() + y.get<std::string>()), false};
      }
      if (x.is_array() && y.is_array()) {
        json r = x;
        for (auto& v : y) r.push_back(v);
        return Value{std::move(r), false};
      }
    }
    if (op == "*" && x.is_string() && y.is_number_integer()) {
      int64_t n = y.get<int64_t>();
      if (n < 0) n = 0;
      if (static_cast<double>(n) * static_cast<double>(x.get_ref<const std::string&>().size()) > kMaxOutput)
        return error(e.line, "string too long");
      std::string r;
      for (int64_t i = 0; i < n; ++i) r += x.get<std::string>();
      return Value{json(r), false};
    }
    if (!x.is_number() || !y.is_number())
      return error(e.line, "operator " + op + " on " + std::string(a.undef ? "undefined" : x.type_name()) + " and " +
                               (b.undef ? "undefined" : y.type_name()));
    bool ints = x.is_number_integer() && y.is_number_integer();
    if (ints && op != "/" && op != "**") {
      int64_t p = x.get<int64_t>(), q = y.get<int64_t>(), r = 0;
      bool ovf = false;
      if (op == "+") ovf = __builtin_add_overflow(p, q, &r);
      else if (op == "-") ovf = __builtin_sub_overflow(p, q, &r);
      else if (op == "*") ovf = __builtin_mul_overflow(p, q, &r);
      else {
        if (q == 0) return error(e.line, "division by zero");
        if (q == -1) {
          ovf = __builtin_sub_overflow(int64_t{0}, p, &r);  // p // -1 = -p; p % -1 = 0
          if (op == "%") r = 0, ovf = false;
        } else if (op == "//") {
          r = p / q - ((p % q != 0) && ((p < 0) != (q < 0)) ? 1 : 0);
        } else {
          r = p % q;
          if (r != 0 && ((r < 0) != (q < 0))) r += q;
        }
      }
      if (ovf) return error(e.line, "integer overflow in " + op);
      return Value{json(r), false};
    }
    double p = x.get<double>(), q = y.get<double>();
    if (op == "+") return Value{json(p + q), false};
    if (op == "-") return Value{json(p - q), false};
    if (op == "*") return Value{json(p * q), false};
    if (op == "**") {
      double r = std::pow(p, q);
      if (ints && q >= 0 && std::fabs(r) < 9.2e18) return Value{json(static_cast<int64_t>(r)), false};
      return Value{json(r), false};
    }
    if (q == 0) return error(e.line, "division by zero");
    if (op == "/") return Value{json(p / q), false};
    if (op == "//") return Value{json(std::floor(p / q)), false};
    if (op == "%") return Value{json(std::fmod(p, q)), false};
    return error(e.line, "unknown operator " + op);
  }

 private:
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::unordered_map<std::string, const Node*> macros_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::string> Template::render(const json& context) const {
  if (!context.is_object()) return invalid_argument("chat template context must be an object");
  Evaluator ev(context);
  std::string out;
  try {
    auto f = ev.exec_list(body_, &out);
    if (!f.ok()) return f.status();
  } catch (const std::exception& ex) {  // nlohmann type errors on unexpected data shapes
    return invalid_argument(std::string("chat template evaluation failed: ") + ex.what());
  }
  return out;
}

}  // namespace afd::serve::jinja
