// The filters of jinja2 that chat templates use (x | name(args)), with transformers' tojson
// (jinja_builtins.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "serve/text/jinja_builtins.h"
#include "serve/text/jinja_pystr.h"
#include "serve/text/unicode.h"

namespace afd::serve::jinja {

[[gnu::noinline]] Result<Value> Builtins::apply_filter(int line, const std::string& f, const Value& x, const Args& a) {
  const json& j = x.j();
  if (f == "safe") {  // Markup(value): a string
    AFD_ASSIGN_OR_RETURN(std::string str, budget_.to_str(line, x));
    return budget_.str_value(line, std::move(str));
  }
  if (f == "default" || f == "d") {
    const Value* bv = a.get(1, "boolean");
    bool boolean = bv && truthy(*bv);
    if (x.undef() || (boolean && !truthy(x))) {
      const Value* dv = a.get(0, "default_value");
      return dv ? *dv : Value::of(json(""));
    }
    return x;
  }
  if (f == "length" || f == "count") {
    if (x.undef()) return Value::of(json(0));
    if (j.is_string()) return Value::of(json(static_cast<int64_t>(utf8_length(j.get_ref<const std::string&>()))));
    if (j.is_array() || j.is_object()) return Value::of(json(static_cast<int64_t>(j.size())));
    return error(line, "object of type '" + std::string(type_name(x)) + "' has no len()");
  }
  if (f == "tojson") return tojson(line, x, a);
  if (f == "string") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    return budget_.str_value(line, std::move(s));
  }
  if (f == "trim") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    AFD_RETURN_IF_ERROR(budget_.scan(line, s.size()));
    const Value* cv = a.get(0, "chars");
    if (cv && !cv->undef() && !cv->j().is_null()) {
      if (!cv->j().is_string()) return error(line, "trim() chars must be a string");
      std::string chars = cv->j().get<std::string>();
      return budget_.str_value(line, py_strip(s, &chars, true, true));
    }
    return budget_.str_value(line, py_strip(s, nullptr, true, true));
  }
  if (f == "lower" || f == "upper" || f == "capitalize") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    return call_method(line, Value::of(json(std::move(s))), f, Args{});
  }
  if (f == "title") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    return budget_.str_value(line, map_case(s, CaseMode::title_jinja));
  }
  if (f == "replace") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    AFD_RETURN_IF_ERROR(budget_.scan(line, s.size()));
    AFD_ASSIGN_OR_RETURN(std::string from, str_arg(line, a, 0, "old", ""));
    AFD_ASSIGN_OR_RETURN(std::string to, str_arg(line, a, 1, "new", ""));
    AFD_ASSIGN_OR_RETURN(int64_t count, int_arg(line, a, 2, "count", -1));
    return replace(line, s, from, to, count);
  }
  if (f == "escape" || f == "e" || f == "forceescape") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    std::string r;
    for (char c : s) {
      switch (c) {
        case '&': r += "&amp;"; break;
        case '<': r += "&lt;"; break;
        case '>': r += "&gt;"; break;
        case '"': r += "&#34;"; break;
        case '\'': r += "&#39;"; break;
        default: r += c;
      }
    }
    return budget_.str_value(line, std::move(r));
  }
  if (f == "indent") return indent(line, x, a);
  if (f == "join") {
    AFD_ASSIGN_OR_RETURN(std::string sep, str_arg(line, a, 0, "d", ""));
    const Value* attr = a.get(1, "attribute");
    std::string attribute = attr && attr->j().is_string() ? attr->j().get<std::string>() : "";
    return join(line, x, sep, attr && attr->j().is_string() ? &attribute : nullptr);
  }
  if (f == "first" || f == "last") {
    if (x.undef()) return Value::undefined();
    if (j.is_array()) {
      if (j.empty()) return Value::undefined();
      return x.part(f == "first" ? j.front() : j.back());
    }
    AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(line, x));
    if (items.empty()) return Value::undefined();
    return f == "first" ? items.front() : items.back();
  }
  if (f == "list" || f == "reverse" || f == "unique" || f == "sort" || f == "dictsort" || f == "items" ||
      f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr" || f == "map" || f == "min" ||
      f == "max" || f == "sum")
    return sequence_filter(line, f, x, a);
  if ((f == "int" || f == "float" || f == "round" || f == "indent") && x.undef()) return undefined_error(line, x);
  if (f == "int") {
    const Value* dv = a.get(0, "default");
    Value def = dv ? *dv : Value::of(json(0));
    if (j.is_number_integer() && !x.undef()) return x;
    if (j.is_boolean()) return Value::of(json(static_cast<int64_t>(j.get<bool>())));
    double d = 0;
    int64_t v = 0;
    if (j.is_number_float()) d = j.get<double>();
    else if (j.is_string() && parse_py_int(j.get_ref<const std::string&>(), &v)) return Value::of(json(v));
    else if (!(j.is_string() && parse_py_float(j.get_ref<const std::string&>(), &d)))
      return def;
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return Value::of(json(static_cast<int64_t>(d)));
  }
  if (f == "float") {
    const Value* dv = a.get(0, "default");
    Value def = dv ? *dv : Value::of(json(0.0));
    if (numeric(j) && !x.undef()) return Value::of(json(as_double(j)));
    double d = 0;
    if (j.is_string() && parse_py_float(j.get_ref<const std::string&>(), &d)) return Value::of(json(d));
    return def;
  }
  if (f == "abs") {
    if (!numeric(j) || x.undef()) return error(line, "bad operand type for abs(): '" + std::string(type_name(x)) + "'");
    if (is_float(j)) return Value::of(json(std::fabs(j.get<double>())));
    __int128 v = as_int(j);
    if (v < 0) v = -v;
    if (v > INT64_MAX) return error(line, "integer overflow in abs");
    return Value::of(json(static_cast<int64_t>(v)));
  }
  if (f == "round") {  // Python's round(): half to even on the exact binary value
    if (!numeric(j) || x.undef()) return error(line, "round() of a non-number");
    AFD_ASSIGN_OR_RETURN(int64_t prec, int_arg(line, a, 0, "precision", 0));
    AFD_ASSIGN_OR_RETURN(std::string method, str_arg(line, a, 1, "method", "common"));
    if (method != "common" && method != "floor" && method != "ceil")
      return error(line, "method must be common, ceil or floor");
    if (prec < -300 || prec > 300) return error(line, "round() precision out of range");
    if (method != "common") {  // math.floor/ceil(value * 10**precision) / 10**precision
      double scale = std::pow(10.0, static_cast<double>(prec));
      double v = as_double(j) * scale;
      return Value::of(json((method == "floor" ? std::floor(v) : std::ceil(v)) / scale));
    }
    if (!is_float(j)) {  // round(int, n) stays an int
      __int128 v = as_int(j);
      if (prec >= 0) return Value::of(json(static_cast<int64_t>(v)));
      __int128 m = 1;
      for (int64_t k = 0; k < -prec && m < (static_cast<__int128>(1) << 100); ++k) m *= 10;
      __int128 q = v / m, r = v % m;
      if (r < 0) q -= 1, r += m;
      if (2 * r > m || (2 * r == m && q % 2 != 0)) q += 1;
      __int128 res = q * m;
      if (res > INT64_MAX || res < INT64_MIN) return error(line, "integer overflow in round");
      return Value::of(json(static_cast<int64_t>(res)));
    }
    double v = j.get<double>();
    if (!std::isfinite(v)) return Value::of(json(v));
    if (prec < 0) {
      double m = std::pow(10.0, static_cast<double>(-prec));
      return Value::of(json(std::nearbyint(v / m) * m));
    }
    int n = std::snprintf(nullptr, 0, "%.*f", static_cast<int>(prec), v);
    std::string buf(static_cast<size_t>(n) + 1, '\0');
    std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(prec), v);
    return Value::of(json(std::strtod(buf.c_str(), nullptr)));
  }
  if (f == "wordcount") {
    AFD_ASSIGN_OR_RETURN(std::string s, budget_.to_str(line, x));
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.size();) {
      size_t len = 1;
      char32_t c = utf8_decode(s, i, &len);
      bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : (is_letter(c) || is_number(c)));
      if (w && !in_word) ++n;
      in_word = w;
      i += len;
    }
    return Value::of(json(n));
  }
  return error(line, "no filter named '" + f + "'");
}

Result<Value> Builtins::tojson(int line, const Value& x, const Args& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  if (x.undef() || x.callable() || contains_undefined(x.j()))
    return error(line, std::string("Object of type ") + (x.callable() ? type_name(x) : "Undefined") +
                           " is not JSON serializable");
  DumpOptions o;
  if (const Value* v = a.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*v);
  if (const Value* v = a.get(1, "indent"); v && !v->undef() && !v->j().is_null()) {
    if (!v->j().is_number_integer()) return error(line, "tojson indent must be an integer");
    o.indent = static_cast<int>(std::clamp<int64_t>(v->j().get<int64_t>(), 0, 64));
    o.item_sep = ",";
  }
  if (const Value* v = a.get(2, "separators"); v && !v->undef() && !v->j().is_null()) {
    const json& sj = v->j();
    if (!sj.is_array() || sj.size() != 2 || !sj[0].is_string() || !sj[1].is_string())
      return error(line, "tojson separators must be a pair of strings");
    o.item_sep = sj[0].get<std::string>();
    o.key_sep = sj[1].get<std::string>();
  }
  if (const Value* v = a.get(3, "sort_keys")) o.sort_keys = truthy(*v);
  std::string s;
  if (!py_dumps(x.j(), o, budget_.limits().max_output_bytes, &s))
    return budget_.too_long(line, "tojson output would be longer than");
  AFD_RETURN_IF_ERROR(budget_.scan(line, s.size()));
  return budget_.str_value(line, std::move(s));
}

Result<Value> Builtins::indent(int line, const Value& x, const Args& a) {
  if (!x.j().is_string())  // jinja2 appends "\n" to the value itself
    return error(line, std::string("unsupported operand type(s) for +=: '") + type_name(x) + "' and 'str'");
  std::string s = x.j().get<std::string>();
  std::string pad(4, ' ');
  if (const Value* w = a.get(0, "width"); w && !w->undef()) {
    if (w->j().is_string()) pad = w->j().get<std::string>();
    else if (w->j().is_number_integer())
      pad.assign(static_cast<size_t>(std::clamp<int64_t>(w->j().get<int64_t>(), 0, 256)), ' ');
    else return error(line, "indent width must be an integer or a string");
  }
  const Value* fv = a.get(1, "first");
  const Value* bv = a.get(2, "blank");
  bool first = fv && truthy(*fv), blank = bv && truthy(*bv);
  AFD_RETURN_IF_ERROR(budget_.string_size(line, s.size() + (count_lines(s) + 2) * (pad.size() + 1)));
  AFD_RETURN_IF_ERROR(budget_.alloc(line, s.size() + 64 * (count_lines(s) + 2)));
  std::vector<std::string> lines = py_splitlines(s + "\n");
  std::string r;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      r += "\n";
      if (blank || !lines[i].empty()) r += pad;
    }
    r += lines[i];
  }
  if (first) r = pad + r;
  return budget_.str_value(line, std::move(r));
}

// Sorting key: the item or its attribute (shared, not copied), strings lower-cased
// unless case-sensitive.
Result<Value> Builtins::sort_key(int line, const Value& item, const std::string* attribute, bool case_sensitive) {
  Value v = item;
  if (attribute) {
    AFD_ASSIGN_OR_RETURN(v, attr_path(line, item, *attribute));
  }
  if (v.undef()) return error(line, "sort key is undefined");
  if (!case_sensitive && v.j().is_string())
    return budget_.str_value(line, map_case(v.j().get<std::string>(), CaseMode::lower));
  return v;
}

Result<Value> Builtins::sequence_filter(int line, const std::string& f, const Value& x, const Args& a) {
  const json& j = x.j();
  if (f == "items") {
    if (x.undef()) return Value::of(json::array());
    if (!j.is_object()) return error(line, "can only get item pairs from a mapping");
    return call_method(line, x, "items", Args{});
  }
  if (f == "dictsort") {
    if (!j.is_object()) return error(line, "you can only sort by either \"key\" or \"value\" of a mapping");
    AFD_ASSIGN_OR_RETURN(Value pairs, call_method(line, x, "items", Args{}));
    const Value* cs = a.get(0, "case_sensitive");
    AFD_ASSIGN_OR_RETURN(std::string by, str_arg(line, a, 1, "by", "key"));
    const Value* rv = a.get(2, "reverse");
    size_t pos = by == "value" ? 1 : 0;
    if (by != "key" && by != "value") return error(line, "dictsort by must be 'key' or 'value'");
    json arr = pairs.j();
    bool case_sensitive = cs && truthy(*cs), ok = true;
    auto key = [&](const json& p) {
      return !case_sensitive && p[pos].is_string() ? json(map_case(p[pos].get<std::string>(), CaseMode::lower))
                                                   : p[pos];
    };
    std::stable_sort(arr.begin(), arr.end(), [&](const json& p, const json& q) {
      bool o = true;
      bool r = py_less(key(p), key(q), &o);
      ok = ok && o;
      return r;
    });
    if (!ok) return error(line, "dictsort: values are not comparable");
    if (rv && truthy(*rv)) std::reverse(arr.begin(), arr.end());
    return Value::of(std::move(arr));
  }
  if (j.is_string() && f == "reverse") {
    const std::string& str = j.get_ref<const std::string&>();
    AFD_RETURN_IF_ERROR(budget_.string_size(line, str.size()));
    std::string r;
    r.reserve(str.size());
    for (size_t end = str.size(); end > 0;) {  // code points from the last
      size_t b = end - 1;
      while (b > 0 && (static_cast<unsigned char>(str[b]) & 0xC0) == 0x80) --b;
      r.append(str, b, end - b);
      end = b;
    }
    return Value::of(json(std::move(r)));
  }
  // jinja2's map/select/reject family starts with `if value:`, so a falsy non-sequence
  // (0, false, none) gives nothing rather than an error.
  bool lazy_family = f == "map" || f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr";
  if (lazy_family && !truthy(x)) return Value::of(json::array());
  if (!x.undef() && !j.is_array() && !j.is_object() && !j.is_string())
    return error(line, "'" + std::string(type_name(x)) + "' object is not iterable");
  AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(line, x));
  AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(items.size())));
  auto to_list = [&](const std::vector<Value>& vs) -> Result<Value> {
    json arr = json::array();
    for (const Value& v : vs) {
      AFD_ASSIGN_OR_RETURN(json item, budget_.take(line, v, 1));
      arr.push_back(std::move(item));
    }
    return Value::of(std::move(arr));
  };
  if (f == "list") return to_list(items);
  if (f == "reverse") {
    std::reverse(items.begin(), items.end());
    return to_list(items);
  }
  // attribute= is positional after the sort options (sort: 3rd, unique/min/max: 2nd,
  // sum: 1st); map takes it by keyword only.
  const Value* attr = f == "map" ? a.get(SIZE_MAX, "attribute")
                                 : a.get(f == "sort"  ? 2
                                         : f == "sum" ? 0
                                                      : 1,
                                         "attribute");
  std::string attribute = attr && attr->j().is_string() ? attr->j().get<std::string>() : "";
  const std::string* attr_p = attr && attr->j().is_string() ? &attribute : nullptr;
  if (f == "sort" || f == "unique" || f == "min" || f == "max") {
    const Value* cs = a.get(f == "sort" ? 1 : 0, "case_sensitive");
    bool case_sensitive = cs && truthy(*cs);
    std::vector<std::pair<Value, Value>> keyed;  // (key, item)
    for (const Value& v : items) {
      AFD_ASSIGN_OR_RETURN(Value k, sort_key(line, v, attr_p, case_sensitive));
      keyed.push_back({std::move(k), v});
    }
    if (f == "unique") {  // a set of the keys: lists and dicts are unhashable
      for (auto& kv : keyed)
        if (kv.first.j().is_structured())
          return error(line, std::string("unhashable type: '") + type_name(kv.second) + "'");
      std::vector<Value> out;
      std::vector<Value> seen;
      for (auto& [k, v] : keyed) {
        bool dup = false;
        for (const Value& s : seen) dup = dup || py_equal(s.j(), k.j());
        AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(seen.size())));
        if (!dup) {
          seen.push_back(k);
          out.push_back(v);
        }
      }
      return to_list(out);
    }
    bool ok = true;
    auto less = [&](const std::pair<Value, Value>& p, const std::pair<Value, Value>& q) {
      bool o = true;
      bool r = py_less(p.first.j(), q.first.j(), &o);
      ok = ok && o;
      return r;
    };
    if (f == "sort") {
      std::stable_sort(keyed.begin(), keyed.end(), less);
      if (!ok) return error(line, "sort: items are not comparable");
      const Value* rv = a.get(0, "reverse");
      if (rv && truthy(*rv)) {
        // Python's reverse sort keeps equal items in their original order.
        std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) { return less(q, p); });
      }
      std::vector<Value> out;
      for (auto& kv : keyed) out.push_back(kv.second);
      return to_list(out);
    }
    if (keyed.empty()) return Value::undefined();
    // Both return the first of equal extremes, as Python's min and max do.
    auto it = f == "min" ? std::min_element(keyed.begin(), keyed.end(), less)
                         : std::max_element(keyed.begin(), keyed.end(), less);
    if (!ok) return error(line, f + ": items are not comparable");
    return it->second;
  }
  if (f == "sum") {
    const Value* st = a.get(1, "start");
    json acc = st ? st->j() : json(0);
    for (const Value& v : items) {
      Value x2 = v;
      if (attr_p) {
      AFD_ASSIGN_OR_RETURN(x2, attr_path(line, v, *attr_p));
    }
      if (!numeric(acc) || !numeric(x2.j()) || x2.undef()) return error(line, "sum() of non-numbers");
      if (is_float(acc) || is_float(x2.j())) acc = as_double(acc) + as_double(x2.j());
      else {
        __int128 r = as_int(acc) + as_int(x2.j());
        if (r > INT64_MAX || r < INT64_MIN) return error(line, "integer overflow in sum");
        acc = static_cast<int64_t>(r);
      }
    }
    return Value::of(std::move(acc));
  }
  if (f == "map") {
    std::vector<Value> out;
    if (attr_p) {
      const Value* def = a.get(99, "default");
      for (const Value& v : items) {
        AFD_ASSIGN_OR_RETURN(Value r, attr_path(line, v, *attr_p));
        if (r.undef() && def) r = *def;
        out.push_back(std::move(r));
      }
    } else {
      if (a.pos.empty() || !a.pos[0].j().is_string()) return error(line, "map() needs a filter name or attribute=");
      std::string name = a.pos[0].j().get<std::string>();
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (const Value& v : items) {
        AFD_ASSIGN_OR_RETURN(Value r, apply_filter(line, name, v, rest));
        out.push_back(std::move(r));
      }
    }
    return to_list(out);
  }
  // select / reject / selectattr / rejectattr
  bool by_attr = f == "selectattr" || f == "rejectattr";
  bool want = f == "select" || f == "selectattr";
  size_t t0 = by_attr ? 1 : 0;  // index of the test name
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].j().is_string()) return error(line, f + "() needs an attribute name");
    attribute = a.pos[0].j().get<std::string>();
  }
  std::string test;
  if (a.pos.size() > t0) {
    if (!a.pos[t0].j().is_string()) return error(line, f + "() test name must be a string");
    test = a.pos[t0].j().get<std::string>();
  }
  Args targs;
  if (a.pos.size() > t0 + 1) targs.pos.assign(a.pos.begin() + static_cast<long>(t0) + 1, a.pos.end());
  std::vector<Value> out;
  for (const Value& v : items) {
    Value probe = v;
    if (by_attr) {
      AFD_ASSIGN_OR_RETURN(probe, attr_path(line, v, attribute));
    }
    bool r;
    if (test.empty()) r = truthy(probe);
    else {
      AFD_ASSIGN_OR_RETURN(r, run_test(line, test, probe, targs));
    }
    if (r == want) out.push_back(v);
  }
  return to_list(out);
}

}  // namespace afd::serve::jinja
