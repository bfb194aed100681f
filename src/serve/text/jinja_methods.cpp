// The methods of str, list and dict that jinja2's immutable sandbox lets a template fetch and
// call, attribute and item access (which fall back to those methods), and the argument
// helpers the filters share (jinja_builtins.h).
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "serve/text/jinja_builtins.h"
#include "serve/text/jinja_pystr.h"
#include "serve/text/unicode.h"

namespace afd::serve::jinja {

namespace {

// Python methods of the value's type that jinja2's immutable sandbox lets a template
// fetch (mutating ones are "unsafe" and read as undefined), or nullptr.
const char* safe_method(const json& j, const std::string& name) {
  static const char* const kDict[] = {"copy", "fromkeys", "get", "items", "keys", "values"};
  static const char* const kList[] = {"copy", "count", "index"};
  static const char* const kStr[] = {
      "capitalize", "casefold", "center",     "count",      "encode",       "endswith",    "expandtabs",
      "find",       "format",   "format_map", "index",      "isalnum",      "isalpha",     "isascii",
      "isdecimal",  "isdigit",  "isidentifier", "islower",  "isnumeric",    "isprintable", "isspace",
      "istitle",    "isupper",  "join",       "ljust",      "lower",        "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",     "rindex",      "rjust",
      "rpartition", "rsplit",   "rstrip",     "split",      "splitlines",   "startswith",  "strip",
      "swapcase",   "title",    "translate",  "upper",      "zfill"};
  auto find = [&](const auto& table) -> const char* {
    for (const char* m : table)
      if (name == m) return m;
    return nullptr;
  };
  if (j.is_object()) return find(kDict);
  if (j.is_array()) return find(kList);
  if (j.is_string()) return find(kStr);
  return nullptr;
}
Value method_value(const Value& receiver, const char* m) {
  Value v;
  v.p = receiver.p;
  v.method = m;
  return v;
}

}  // namespace

// jinja2's getattr: Python attributes (a dict's methods) first, then the dict's key;
// anything else is undefined. Undefined itself has no attributes.
[[gnu::noinline]] Result<Value> Builtins::get_attr(int line, const Value& o, const std::string& name) {
  if (o.undef()) return undefined_error(line, o);
  const json& j = o.j();
  if (const char* m = safe_method(j, name)) return method_value(o, m);
  if (j.is_object()) {
    auto it = j.find(name);
    if (it != j.end()) return o.part(*it);
  }
  return Value::undefined(&name);
}

// jinja2's subscript: list/string index (negative from the end), dict key; a missing
// item is undefined.
[[gnu::noinline]] Result<Value> Builtins::get_item(int line, const Value& o, const Value& k) {
  if (o.undef()) return undefined_error(line, o);
  const json& j = o.j();
  const json& key = k.j();
  if (j.is_array() && (key.is_number_integer() || key.is_boolean())) {
    __int128 i = as_int(key), n = static_cast<__int128>(j.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    return o.part(j[static_cast<size_t>(i)]);
  }
  if (j.is_object() && key.is_string()) {
    auto it = j.find(key.get_ref<const std::string&>());
    if (it != j.end()) return o.part(*it);
    // jinja2's subscript falls back to the attribute: d['items'] is d.items.
    if (const char* m = safe_method(j, key.get_ref<const std::string&>())) return method_value(o, m);
    return Value::undefined(&key.get_ref<const std::string&>());
  }
  if (key.is_string() && !k.undef())
    if (const char* m = safe_method(j, key.get_ref<const std::string&>())) return method_value(o, m);
  if (j.is_string() && key.is_number_integer()) {
    const std::string& s = j.get_ref<const std::string&>();
    AFD_RETURN_IF_ERROR(budget_.scan(line, s.size()));
    __int128 i = as_int(key), n = static_cast<__int128>(utf8_length(s));
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    size_t b = utf8_offset(s, static_cast<size_t>(i));
    size_t len = 1;
    utf8_decode(s, b, &len);
    return budget_.str_value(line, s.substr(b, len));
  }
  return Value::undefined();
}

Result<std::string> Builtins::str_arg(int line, const Args& a, size_t i, const char* name, const std::string& def) {
  const Value* v = a.get(i, name);
  if (!v || v->undef() || v->j().is_null()) return def;
  if (!v->j().is_string()) return error(line, std::string("argument '") + name + "' must be a string");
  return v->j().get<std::string>();
}
Result<int64_t> Builtins::int_arg(int line, const Args& a, size_t i, const char* name, int64_t def) {
  const Value* v = a.get(i, name);
  if (!v || v->undef() || v->j().is_null()) return def;
  if (!v->j().is_number_integer() && !v->j().is_boolean())
    return error(line, std::string("argument '") + name + "' must be an integer");
  return static_cast<int64_t>(as_int(v->j()));
}

Result<Value> Builtins::split(int line, const std::string& s, const Args& a, bool from_right) {
  AFD_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(line, a, 1, "maxsplit", -1));
  const Value* sepv = a.get(0, "sep");
  AFD_RETURN_IF_ERROR(budget_.scan(line, s.size()));
  std::vector<std::string> parts;
  if (!sepv || sepv->undef() || sepv->j().is_null()) {
    // Runs of whitespace separate; leading/trailing whitespace yields no empty parts.
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) byte ranges
    size_t i = 0;
    while (i < s.size()) {
      size_t len = 1;
      if (py_isspace(utf8_decode(s, i, &len))) {
        i += len;
        continue;
      }
      size_t b = i;
      while (i < s.size()) {
        size_t l2 = 1;
        if (py_isspace(utf8_decode(s, i, &l2))) break;
        i += l2;
      }
      words.push_back({b, i});
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) parts.push_back(s.substr(b, e - b));
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k)
        parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      parts.push_back(py_strip(s.substr(words[static_cast<size_t>(maxsplit)].first), nullptr, false, true));
    } else {
      size_t keep = words.size() - static_cast<size_t>(maxsplit);
      parts.push_back(py_strip(s.substr(0, words[keep - 1].second), nullptr, true, false));
      for (size_t k = keep; k < words.size(); ++k)
        parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
  } else {
    if (!sepv->j().is_string()) return error(line, "split() separator must be a string or None");
    const std::string& sep = sepv->j().get_ref<const std::string&>();
    if (sep.empty()) return error(line, "empty separator");
    std::vector<size_t> hits;
    for (size_t j = s.find(sep); j != std::string::npos; j = s.find(sep, j + sep.size())) hits.push_back(j);
    if (maxsplit >= 0 && hits.size() > static_cast<size_t>(maxsplit)) {
      if (from_right) {
        // rsplit: the rightmost non-overlapping matches, found from the right.
        hits.clear();
        size_t end = s.size();
        while (static_cast<int64_t>(hits.size()) < maxsplit && end >= sep.size()) {
          size_t j = s.rfind(sep, end - sep.size());
          if (j == std::string::npos) break;
          hits.insert(hits.begin(), j);
          if (j == 0) break;
          end = j;
        }
      } else {
        hits.resize(static_cast<size_t>(maxsplit));
      }
    }
    size_t b = 0;
    for (size_t j : hits) {
      parts.push_back(s.substr(b, j - b));
      b = j + sep.size();
    }
    parts.push_back(s.substr(b));
  }
  AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(parts.size())));
  AFD_RETURN_IF_ERROR(budget_.alloc(line, s.size() + 64 * parts.size()));
  json arr = json::array();
  for (auto& p : parts) arr.push_back(std::move(p));
  return Value::of(std::move(arr));
}

[[gnu::noinline]] Result<Value> Builtins::call_method(int line, const Value& self, const std::string& m,
                                                      const Args& a) {
  const json& j = self.j();
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    AFD_RETURN_IF_ERROR(budget_.scan(line, s.size()));
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      const Value* cv = a.get(0, "chars");
      std::string chars;
      bool have = cv && !cv->undef() && !cv->j().is_null();
      if (have) {
        if (!cv->j().is_string()) return error(line, m + " arg must be None or str");
        chars = cv->j().get<std::string>();
      }
      return budget_.str_value(line, py_strip(s, have ? &chars : nullptr, m != "rstrip", m != "lstrip"));
    }
    if (m == "startswith" || m == "endswith") {
      const Value* pv = a.get(0, "prefix");
      if (!pv) return error(line, m + "() takes at least 1 argument");
      std::vector<std::string> pre;
      if (pv->j().is_array()) {
        for (const json& x : pv->j()) {
          if (!x.is_string()) return error(line, m + "() arguments must be strings");
          pre.push_back(x.get<std::string>());
        }
      } else if (pv->j().is_string() && !pv->undef()) {
        pre.push_back(pv->j().get<std::string>());
      } else {
        return error(line, m + "() argument must be str or a tuple of str");
      }
      bool r = false;
      for (const auto& p : pre)
        r = r || (s.size() >= p.size() && (m == "startswith" ? s.compare(0, p.size(), p) == 0
                                                             : s.compare(s.size() - p.size(), p.size(), p) == 0));
      return Value::of(json(r));
    }
    if (m == "split" || m == "rsplit") return split(line, s, a, m == "rsplit");
    if (m == "splitlines") {
      AFD_RETURN_IF_ERROR(budget_.alloc(line, s.size() + 64 * (count_lines(s) + 1)));
      std::vector<std::string> lines = py_splitlines(s);
      json arr = json::array();
      for (auto& l : lines) arr.push_back(std::move(l));
      return Value::of(std::move(arr));
    }
    if (m == "upper" || m == "lower" || m == "title" || m == "capitalize") {
      CaseMode mode = m == "upper" ? CaseMode::upper : m == "lower" ? CaseMode::lower
                      : m == "title" ? CaseMode::title_py : CaseMode::capitalize;
      return budget_.str_value(line, map_case(s, mode));
    }
    if (m == "replace") {
      AFD_ASSIGN_OR_RETURN(std::string from, str_arg(line, a, 0, "old", ""));
      AFD_ASSIGN_OR_RETURN(std::string to, str_arg(line, a, 1, "new", ""));
      AFD_ASSIGN_OR_RETURN(int64_t count, int_arg(line, a, 2, "count", -1));
      return replace(line, s, from, to, count);
    }
    if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
      AFD_ASSIGN_OR_RETURN(std::string sub, str_arg(line, a, 0, "sub", ""));
      if (m == "count") {
        int64_t n = 0;
        if (sub.empty()) n = static_cast<int64_t>(utf8_length(s)) + 1;
        else
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::of(json(n));
      }
      size_t p = (m == "find" || m == "index") ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) {
        if (m == "index" || m == "rindex") return error(line, "substring not found");
        return Value::of(json(int64_t{-1}));
      }
      return Value::of(json(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p)))));
    }
    if (m == "join") {
      const Value* it = a.get(0, "iterable");
      if (!it) return error(line, "join() takes exactly one argument");
      return join(line, *it, s, nullptr);
    }
    if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "islower" || m == "isupper") {
      bool r = !s.empty();
      bool cased = false;
      for (size_t i = 0; i < s.size() && r;) {
        size_t len = 1;
        char32_t c = utf8_decode(s, i, &len);
        i += len;
        if (m == "isspace") r = py_isspace(c);
        else if (m == "isdigit") r = c < 0x80 && std::isdigit(static_cast<int>(c));
        else if (m == "isalpha") r = c >= 0x80 ? is_letter(c) : std::isalpha(static_cast<int>(c)) != 0;
        else if (m == "isalnum")
          r = c >= 0x80 ? (is_letter(c) || is_number(c)) : std::isalnum(static_cast<int>(c)) != 0;
        else if (cp_is_cased(c)) {
          cased = true;
          r = m == "islower" ? !cp_is_upper(c) : !cp_is_lower(c);
        }
      }
      if (m == "islower" || m == "isupper") r = r && cased;
      return Value::of(json(r));
    }
  }
  if (j.is_array() && (m == "count" || m == "index")) {
    const Value* v = a.get(0, "value");
    if (!v) return error(line, m + "() takes exactly one argument");
    AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(j.size())));
    int64_t n = 0;
    for (size_t i = 0; i < j.size(); ++i) {
      if (v->undef() ? !j[i].is_discarded() : !py_equal(j[i], v->j())) continue;
      if (m == "index") return Value::of(json(static_cast<int64_t>(i)));
      ++n;
    }
    if (m == "index") return error(line, "value is not in list");
    return Value::of(json(n));
  }
  if (j.is_object()) {
    if (m == "items" || m == "keys" || m == "values") {
      AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(j.size())));
      json arr = json::array();
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (m == "keys") {
          arr.push_back(it.key());
          continue;
        }
        AFD_RETURN_IF_ERROR(budget_.admit(line, it.value(), m == "items" ? 2 : 1));
        arr.push_back(m == "items" ? json::array({it.key(), it.value()}) : it.value());
      }
      return Value::of(std::move(arr));
    }
    if (m == "get") {
      const Value* k = a.get(0, "key");
      if (!k) return error(line, "get() takes at least 1 argument");
      if (k->j().is_string() && !k->undef()) {
        auto it = j.find(k->j().get_ref<const std::string&>());
        if (it != j.end()) return self.part(*it);
      }
      const Value* d = a.get(1, "default");
      return d ? *d : Value::of(json());
    }
  }
  return error(line, "'" + std::string(type_name(self)) + "' object has no method '" + m + "'");
}

Result<Value> Builtins::replace(int line, const std::string& s, const std::string& from, const std::string& to,
                                int64_t count) {
  std::string r;
  int64_t done = 0;
  auto grow = [&](size_t add) -> Status {
    if (r.size() + add > budget_.limits().max_output_bytes)
      return budget_.too_long(line, "a string would be longer than");
    return Status();
  };
  if (from.empty()) {  // Python inserts `to` around every character
    for (size_t i = 0; i < s.size();) {
      size_t len = 1;
      utf8_decode(s, i, &len);
      if (count < 0 || done < count) {
        AFD_RETURN_IF_ERROR(grow(to.size()));
        r += to;
        ++done;
      }
      AFD_RETURN_IF_ERROR(grow(len));
      r.append(s, i, len);
      i += len;
    }
    if (count < 0 || done < count) {
      AFD_RETURN_IF_ERROR(grow(to.size()));
      r += to;
    }
    return budget_.str_value(line, std::move(r));
  }
  size_t i = 0;
  for (size_t j; (count < 0 || done < count) && (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
    AFD_RETURN_IF_ERROR(grow(j - i + to.size()));
    r.append(s, i, j - i);
    r += to;
    ++done;
  }
  AFD_RETURN_IF_ERROR(grow(s.size() - i));
  r.append(s, i);
  return budget_.str_value(line, std::move(r));
}

// str.join / the join filter: str() of each item (of an attribute of each item when
// `attribute` is given) with `sep` between.
Result<Value> Builtins::join(int line, const Value& seq, const std::string& sep, const std::string* attribute) {
  AFD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(line, seq));
  std::string r;
  bool first = true;
  for (const Value& item : items) {
    Value x = item;
    if (attribute) {
      AFD_ASSIGN_OR_RETURN(x, attr_path(line, item, *attribute));
    }
    if (!first) {
      if (r.size() + sep.size() > budget_.limits().max_output_bytes)
        return budget_.too_long(line, "a string would be longer than");
      r += sep;
    }
    first = false;
    size_t before = r.size();
    if (!x.undef() && !py_str(x.j(), true, budget_.limits().max_output_bytes, &r))
      return budget_.too_long(line, "a string would be longer than");
    AFD_RETURN_IF_ERROR(budget_.alloc(line, r.size() - before));
  }
  return budget_.str_value(line, std::move(r));
}

// jinja2's attribute getter for filters: "a.b.0" looks up a, then b, then index 0.
Result<Value> Builtins::attr_path(int line, const Value& item, const std::string& path) {
  Value v = item;
  size_t b = 0;
  for (;;) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (v.undef()) return undefined_error(line, v);  // jinja2: Undefined[...] raises
    int64_t idx = 0;
    if (!part.empty() &&
        std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
        parse_py_int(part, &idx) && v.j().is_array()) {
      AFD_ASSIGN_OR_RETURN(v, get_item(line, v, Value::of(json(idx))));
    } else if (v.j().is_object()) {
      auto it = v.j().find(part);
      v = it == v.j().end() ? Value::undefined() : v.part(*it);
    } else {
      v = Value::undefined();
    }
    if (e == std::string::npos) return v;
    b = e + 1;
  }
}

}  // namespace afd::serve::jinja
