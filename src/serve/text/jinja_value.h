// Values of the Jinja interpreter (internal): shared, copy-on-write JSON plus jinja2's
// "undefined", and the Python formatting rules (str(), repr(), json.dumps) that chat
// templates observe when they print values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace afd::serve::jinja {

using json = nlohmann::ordered_json;
struct Node;

// A value during rendering. Defined values point at JSON; a value that is part of another
// (messages[0], ns.attr, a loop item) aliases its owner's storage through shared_ptr's
// aliasing constructor, so naming a large variable costs O(1) rather than a copy. The JSON
// a Value points at is never modified while another Value shares it: writers call
// Evaluator::mutable_json, which copies first unless the writer holds the only reference.
//
// An undefined value stored inside a list or dict (jinja2 keeps Undefined objects there:
// [message.missing], map(attribute=...) of a missing attribute) is JSON's `discarded`
// value; reading it back (part()) gives undefined again.
//
// A Python method fetched without calling it (d.items, d['keys'] when d has no such key,
// s.upper) is a defined, truthy value that is not data: `method` names it, p points at
// its receiver, and j() is null. A macro is a value of the same kind: `macro` is its
// definition and p points at a null placeholder.
struct Value {
  std::shared_ptr<json> p;            // null: undefined
  const std::string* name = nullptr;  // undefined: the name that was looked up (for errors)
  const char* method = nullptr;       // a bound method of *p
  const Node* macro = nullptr;        // a macro

  bool undef() const { return !p; }
  const json& j() const { return p && !method ? *p : null_json(); }
  bool callable() const { return method || macro; }

  static Value of(json v) { return Value{std::make_shared<json>(std::move(v))}; }
  // A value whose storage outlives the render (the context); never written through.
  static Value borrow(const json& v) { return Value{std::shared_ptr<json>(std::shared_ptr<json>(), const_cast<json*>(&v))}; }
  static Value undefined(const std::string* name = nullptr) { return Value{nullptr, name}; }
  // `sub` must lie inside *p.
  Value part(const json& sub) const {
    if (sub.is_discarded()) return undefined();
    return Value{std::shared_ptr<json>(p, const_cast<json*>(&sub))};
  }

  static const json& null_json();
};

// Python's repr(float): the shortest round-trip digits, scientific below 1e-4 and from 1e16.
std::string py_float(double d);

// Whether v holds an undefined value anywhere (jinja2 cannot serialise those).
bool contains_undefined(const json& v);

// Appends Python's str(v) (top = true) or repr(v) to *out; false once *out would exceed
// `limit` bytes (the output is then incomplete). Recursion depth is the data depth.
bool py_str(const json& v, bool top, size_t limit, std::string* out);

struct DumpOptions {
  int indent = -1;  // < 0: one line
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps with the given options (transformers' tojson filter); false once *out
// would exceed `limit` bytes.
bool py_dumps(const json& v, const DumpOptions& o, size_t limit, std::string* out);

// Python's truth value of a JSON value.
bool py_truthy(const json& v);
// Python's truth value of a template value: undefined is false, a method or macro true.
inline bool truthy(const Value& v) { return !v.undef() && (v.callable() || py_truthy(v.j())); }
// Python's ==, where bools are the integers 0 and 1 and ints equal floats of equal value.
bool py_equal(const json& a, const json& b);
// Python's < for numbers, strings and lists; false with *ok = false for other pairs.
bool py_less(const json& a, const json& b, bool* ok);

// Python's numbers over JSON: bools are the integers 0 and 1; as_int is exact for every
// int64 and uint64 (and for sums and products of two of them).
inline bool numeric(const json& v) { return v.is_number() || v.is_boolean(); }
inline bool is_float(const json& v) { return v.is_number_float(); }
inline __int128 as_int(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (v.is_number_unsigned()) return static_cast<__int128>(v.get<uint64_t>());
  return v.get<int64_t>();
}
inline double as_double(const json& v) { return is_float(v) ? v.get<double>() : static_cast<double>(as_int(v)); }

// Python's type name of a template value, for error messages ("NoneType", "str", "Undefined").
const char* type_name(const Value& v);

}  // namespace afd::serve::jinja
