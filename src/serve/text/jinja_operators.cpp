// Python's operators as jinja2 compiles them (arithmetic on ints of unbounded size within
// int64, floats, string and list concatenation and repetition, comparisons, `in`), slicing
// and iteration (jinja_builtins.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "serve/text/jinja_builtins.h"
#include "serve/text/jinja_pystr.h"

namespace afd::serve::jinja {

// Items a for loop visits: parts of a list, a dict's keys, a string's characters.
Result<std::vector<Value>> Builtins::iterate(int line, const Value& seq) {
  std::vector<Value> items;
  if (seq.undef()) return items;
  const json& j = seq.j();
  if (j.is_array()) {
    AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(j.size())));
    items.reserve(j.size());
    for (const json& x : j) items.push_back(seq.part(x));
  } else if (j.is_object()) {
    AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(j.size())));
    for (auto it = j.begin(); it != j.end(); ++it) {
      AFD_RETURN_IF_ERROR(budget_.alloc(line, 64 + it.key().size()));
      items.push_back(Value::of(json(it.key())));
    }
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(s.size())));
    AFD_RETURN_IF_ERROR(budget_.alloc(line, 64 * s.size()));
    for (std::string_view c : code_points(s)) items.push_back(Value::of(json(std::string(c))));
  } else {
    return error(line, "'" + std::string(type_name(seq)) + "' object is not iterable");
  }
  return items;
}


[[gnu::noinline]] Result<Value> Builtins::unary(int line, const std::string& op, const Value& x) {
  if (op == "not") return truth(!truthy(x));
  if (x.undef()) return undefined_error(line, x);
  const json& j = x.j();
  if (!numeric(j)) return error(line, "bad operand type for unary " + op + ": '" + type_name(x) + "'");
  if (is_float(j)) return Value::of(json(op == "-" ? -j.get<double>() : j.get<double>()));
  __int128 v = as_int(j);
  if (op == "-") v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return error(line, "integer overflow in unary " + op);
  return Value::of(json(static_cast<int64_t>(v)));
}

Result<Value> Builtins::slice(int line, const Value& o, const SliceBounds& s) {
  const int64_t* idx = s.idx;
  const bool* given = s.given;
  const int64_t step_by = idx[2];
  if (step_by == 0) return error(line, "slice step cannot be zero");
  const json& j = o.j();
  std::vector<uint32_t> offs;  // a non-ASCII string's code point offsets, and its size
  int64_t n;
  if (j.is_array()) {
    n = static_cast<int64_t>(j.size());
  } else if (j.is_string()) {
    const std::string& str = j.get_ref<const std::string&>();
    AFD_RETURN_IF_ERROR(budget_.scan(line, str.size()));
    if (std::any_of(str.begin(), str.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
      AFD_RETURN_IF_ERROR(budget_.alloc(line, 4 * (str.size() + 1)));
      for (size_t i = 0; i < str.size(); ++i)
        if ((static_cast<unsigned char>(str[i]) & 0xC0) != 0x80) offs.push_back(static_cast<uint32_t>(i));
      offs.push_back(static_cast<uint32_t>(str.size()));
      n = static_cast<int64_t>(offs.size()) - 1;
    } else {
      n = static_cast<int64_t>(str.size());
    }
  } else {  // jinja2 compiles slices to Python's own subscript, which raises
    return error(line, "'" + std::string(type_name(o)) + "' object is not subscriptable");
  }
  auto norm = [&](int64_t v, bool g, int64_t def) {
    if (!g) return def;
    if (v < 0) v = std::max<int64_t>(v, INT64_MIN + n) + n;
    if (step_by > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t start = norm(idx[0], given[0], step_by > 0 ? 0 : n - 1);
  const int64_t stop = norm(idx[1], given[1], step_by > 0 ? n : -1);
  __int128 count = 0;
  if (step_by > 0 && stop > start) count = (static_cast<__int128>(stop) - start + step_by - 1) / step_by;
  if (step_by < 0 && stop < start)
    count = (static_cast<__int128>(start) - stop - step_by - 1) / -static_cast<__int128>(step_by);
  AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(count)));
  if (j.is_array()) {
    json a = json::array();
    for (__int128 k = 0; k < count; ++k) {
      const json& item = j[static_cast<size_t>(start + k * step_by)];
      AFD_RETURN_IF_ERROR(budget_.admit(line, item, 1));
      a.push_back(item);
    }
    return Value::of(std::move(a));
  }
  const std::string& str = j.get_ref<const std::string&>();
  std::string r;
  for (__int128 k = 0; k < count; ++k) {
    size_t i = static_cast<size_t>(start + k * step_by);
    if (offs.empty()) r += str[i];
    else r.append(str, offs[i], offs[i + 1] - offs[i]);
  }
  return budget_.str_value(line, std::move(r));
}

Result<bool> Builtins::contains(int line, const Value& hay, const Value& needle) {
  if (hay.undef()) return false;
  const json& h = hay.j();
  const json& n = needle.j();
  if (h.is_array()) {
    AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(h.size())));
    for (const json& x : h)
      if (!needle.undef() && py_equal(x, n)) return true;
    return false;
  }
  if (h.is_object()) {
    if (n.is_structured()) return error(line, std::string("unhashable type: '") + type_name(needle) + "'");
    return !needle.undef() && n.is_string() && h.contains(n.get_ref<const std::string&>());
  }
  if (h.is_string()) {
    if (needle.undef() || !n.is_string())
      return error(line, "'in <string>' requires string as left operand, not " + std::string(type_name(needle)));
    AFD_RETURN_IF_ERROR(budget_.scan(line, h.get_ref<const std::string&>().size()));
    return h.get_ref<const std::string&>().find(n.get_ref<const std::string&>()) != std::string::npos;
  }
  return error(line, "argument of type '" + std::string(type_name(hay)) + "' is not iterable");
}

Result<Value> Builtins::compare(int line, const std::string& op, const Value& a, const Value& b) {
  if (a.undef()) return undefined_error(line, a);
  if (b.undef()) return undefined_error(line, b);
  bool ok = true;
  bool r = op == "<"    ? py_less(a.j(), b.j(), &ok)
           : op == ">"  ? py_less(b.j(), a.j(), &ok)
           : op == "<=" ? !py_less(b.j(), a.j(), &ok)
                        : !py_less(a.j(), b.j(), &ok);
  if (!ok)
    return error(line, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                           type_name(b) + "'");
  return truth(r);
}

Result<Value> Builtins::repeat(int line, const Value& seq, const Value& times) {
  __int128 n = as_int(times.j());
  if (n < 0) n = 0;
  const json& s = seq.j();
  if (s.empty() || (s.is_string() && s.get_ref<const std::string&>().empty()))
    return Value::of(s.is_string() ? json("") : json::array());
  if (s.is_string()) {
    const std::string& str = s.get_ref<const std::string&>();
    if (static_cast<double>(n) * static_cast<double>(str.size()) >
        static_cast<double>(budget_.limits().max_output_bytes))
      return budget_.too_long(line, "a string would be longer than");
    std::string r;
    r.reserve(static_cast<size_t>(n) * str.size());
    for (__int128 i = 0; i < n; ++i) r += str;
    return budget_.str_value(line, std::move(r));
  }
  if (static_cast<double>(n) * static_cast<double>(s.size()) > static_cast<double>(budget_.limits().max_steps))
    return limit_error(line, "a list would have more items than", "max_steps", budget_.limits().max_steps);
  json r = json::array();
  for (__int128 i = 0; i < n; ++i)
    for (const json& x : s) {
      AFD_RETURN_IF_ERROR(budget_.admit(line, x, 1));
      r.push_back(x);
    }
  return Value::of(std::move(r));
}

[[gnu::noinline]] Result<Value> Builtins::binary(int line, const std::string& op, Value a, Value b) {
  const json &x = a.j(), &y = b.j();
  if (op == "==" || op == "!=") {
    bool eq = a.callable() || b.callable() ? a.method == b.method && a.macro == b.macro && a.p == b.p
                                           : a.undef() == b.undef() && py_equal(x, y);
    return truth(op == "==" ? eq : !eq);
  }
  if (op == "in" || op == "notin") {
    AFD_ASSIGN_OR_RETURN(bool r, contains(line, b, a));
    return truth(op == "in" ? r : !r);
  }
  if (op == "~") {
    std::string s;
    AFD_RETURN_IF_ERROR(budget_.append_str(line, a, &s));
    AFD_RETURN_IF_ERROR(budget_.append_str(line, b, &s));
    return Value::of(json(std::move(s)));
  }
  if (a.undef()) return undefined_error(line, a);
  if (b.undef()) return undefined_error(line, b);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") return compare(line, op, a, b);
  if (op == "+") {
    if (x.is_string() && y.is_string()) {
      const std::string &p = x.get_ref<const std::string&>(), &q = y.get_ref<const std::string&>();
      AFD_RETURN_IF_ERROR(budget_.string_size(line, p.size() + q.size()));
      std::string r;
      r.reserve(p.size() + q.size());
      r += p;
      r += q;
      return Value::of(json(std::move(r)));
    }
    if (x.is_array() && y.is_array()) {
      AFD_RETURN_IF_ERROR(budget_.admit(line, y, 0));
      AFD_ASSIGN_OR_RETURN(json r, budget_.take(line, std::move(a), 0));  // x dangles from here
      for (const json& v : y) r.push_back(v);
      return Value::of(std::move(r));
    }
  }
  if (op == "*") {
    if ((x.is_string() || x.is_array()) && (y.is_number_integer() || y.is_boolean())) return repeat(line, a, b);
    if ((y.is_string() || y.is_array()) && (x.is_number_integer() || x.is_boolean())) return repeat(line, b, a);
  }
  if (!numeric(x) || !numeric(y))
    return error(line, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  bool ints = !is_float(x) && !is_float(y);
  if (ints && op != "/") {
    __int128 p = as_int(x), q = as_int(y), r = 0;
    if (op == "+") r = p + q;
    else if (op == "-") r = p - q;
    else if (op == "*") r = p * q;
    else if (op == "**") {
      if (q < 0 && p == 0) return error(line, "0.0 cannot be raised to a negative power");
      if (q < 0) return Value::of(json(std::pow(static_cast<double>(p), static_cast<double>(q))));
      r = 1;
      for (__int128 k = 0; k < q; ++k) {
        r *= p;
        if (r > INT64_MAX || r < INT64_MIN) return error(line, "integer overflow in **");
        if (r == 0 || r == 1) break;
        if (r == -1) {
          r = ((q - k - 1) % 2 == 0) ? -1 : 1;
          break;
        }
      }
    } else {
      if (q == 0) return error(line, "integer division or modulo by zero");
      __int128 quo = p / q, rem = p % q;
      if (rem != 0 && ((rem < 0) != (q < 0))) {
        quo -= 1;
        rem += q;
      }
      r = op == "//" ? quo : rem;
    }
    if (r > INT64_MAX || r < INT64_MIN) return error(line, "integer overflow in " + op);
    return Value::of(json(static_cast<int64_t>(r)));
  }
  double p = as_double(x), q = as_double(y);
  if (op == "+") return Value::of(json(p + q));
  if (op == "-") return Value::of(json(p - q));
  if (op == "*") return Value::of(json(p * q));
  if (op == "**") {
    if (p == 0 && q < 0) return error(line, "0.0 cannot be raised to a negative power");
    double r = std::pow(p, q);
    if (std::isinf(r) && std::isfinite(p) && std::isfinite(q)) return error(line, "numerical result out of range");
    return Value::of(json(r));
  }
  if (q == 0) return error(line, "division by zero");
  if (op == "/") return Value::of(json(p / q));
  // Python's float divmod: the remainder takes the divisor's sign (+0.0 or -0.0 when zero).
  double m = std::fmod(p, q);
  if (m != 0 && ((m < 0) != (q < 0))) m += q;
  if (m == 0) m = std::copysign(0.0, q);
  if (op == "%") return Value::of(json(m));
  if (op == "//") {
    double d = std::floor((p - m) / q + 0.5);
    return Value::of(json(d == 0 ? std::copysign(0.0, p / q) : d));
  }
  return error(line, "unknown operator " + op);
}

}  // namespace afd::serve::jinja
