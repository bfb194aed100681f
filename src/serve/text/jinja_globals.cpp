// The global functions of transformers' chat-template environment: raise_exception,
// namespace, dict, range (bounded as in jinja2's sandbox) and strftime_now
// (jinja_builtins.h).
#include <ctime>
#include <string>

#include "serve/text/jinja_builtins.h"

namespace afd::serve::jinja {

Result<Value> Builtins::call_global(int line, const std::string& f, Args a) {
  if (f == "raise_exception") {
    std::string msg = "error";
    if (const Value* m = a.get(0, "message")) {
      AFD_ASSIGN_OR_RETURN(msg, budget_.to_str(line, *m));
    }
    return invalid_argument("chat template raised: " + msg);
  }
  if (f == "namespace" || f == "dict") {
    json o = json::object();
    for (const Value& p : a.pos) {  // namespace({'a': 1}) / dict(other)
      if (!p.j().is_object()) return error(line, f + "() takes mappings and keyword arguments");
      for (auto it = p.j().begin(); it != p.j().end(); ++it) {
        AFD_RETURN_IF_ERROR(budget_.admit(line, it.value(), 1));
        o[it.key()] = it.value();
      }
    }
    for (auto& [k, v] : a.kw) {
      AFD_ASSIGN_OR_RETURN(json x, budget_.take(line, std::move(v), 1));
      o[k] = std::move(x);
    }
    return Value::of(std::move(o));
  }
  if (f == "range") {
    int64_t lo = 0, hi = 0, by = 1;
    for (const Value& x : a.pos)
      if (!x.j().is_number_integer() || x.undef()) return error(line, "range() takes integers");
    if (a.pos.size() == 1) hi = a.pos[0].j().get<int64_t>();
    else if (a.pos.size() >= 2) lo = a.pos[0].j().get<int64_t>(), hi = a.pos[1].j().get<int64_t>();
    if (a.pos.size() == 3) by = a.pos[2].j().get<int64_t>();
    if (a.pos.empty() || a.pos.size() > 3) return error(line, "range() takes 1 to 3 integers");
    if (by == 0) return error(line, "range() arg 3 must not be zero");
    __int128 count = 0;
    if (by > 0 && hi > lo) count = ((__int128)hi - lo + by - 1) / by;
    if (by < 0 && hi < lo) count = ((__int128)lo - hi - by - 1) / -by;
    if (count > budget_.limits().max_range)
      return limit_error(line, "range() has more items than", "max_range", budget_.limits().max_range);
    AFD_RETURN_IF_ERROR(budget_.step(line, static_cast<int64_t>(count)));
    AFD_RETURN_IF_ERROR(budget_.alloc(line, static_cast<size_t>(count) * 32));
    json r = json::array();
    for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) r.push_back(lo + k * by);
    return Value::of(std::move(r));
  }
  if (f == "strftime_now") {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    std::string fmt = "%Y-%m-%d";
    if (const Value* v = a.get(0, "format")) {
      AFD_ASSIGN_OR_RETURN(fmt, budget_.to_str(line, *v));
    }
    if (fmt.size() > 256) return error(line, "strftime_now() format longer than 256 bytes");
    std::string buf(4096, '\0');  // strftime writes at most 4 KiB here
    size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    buf.resize(n);
    return budget_.str_value(line, std::move(buf));
  }
  return error(line, "'" + f + "' is undefined");
}

}  // namespace afd::serve::jinja
