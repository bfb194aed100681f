#include "serve/api/json_limits.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace afd::serve {
namespace {

using json = nlohmann::ordered_json;

// SAX handler (nlohmann's json_sax interface) that builds the document bottom-up. Open
// containers live on an explicit stack of at most max_depth frames; an object's members are
// collected in a vector whose elements move cheaply (pair<string, json>, both nothrow-move)
// and are moved once, in order, into the ordered_map when the object closes, so no insertion
// searches the keys and no reallocation copies a subtree.
class BoundedBuilder {
 public:
  BoundedBuilder(const JsonLimits& lim, std::string_view what) : lim_(lim), what_(what) {}

  bool null() { return scalar(json(nullptr)); }
  bool boolean(bool v) { return scalar(json(v)); }
  bool number_integer(json::number_integer_t v) { return scalar(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return scalar(json(v)); }
  bool string(json::string_t& v) { return scalar(json(std::move(v))); }
  bool binary(json::binary_t& v) { return scalar(json(json::binary_t(std::move(v)))); }

  bool start_object(std::size_t /*n*/) { return open(true); }
  bool start_array(std::size_t /*n*/) { return open(false); }

  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    if (static_cast<int64_t>(f.members.size()) >= lim_.max_object_keys)
      return fail("a JSON object in the " + std::string(what_) + " has more than " +
                  std::to_string(lim_.max_object_keys) + " keys (json_max_object_keys)");
    f.key = std::move(k);
    return true;
  }

  bool end_object() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    return place(close_object(std::move(f.members)));
  }

  bool end_array() {
    json a = std::move(stack_.back().array);
    stack_.pop_back();
    return place(std::move(a));
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const nlohmann::detail::exception& ex) {
    // nlohmann's message quotes the offending input after "; last read" (syntax errors) or
    // " parsing '" (number overflow); everything before is a fixed text with line and column.
    std::string m = ex.what();
    if (size_t p = m.find("] "); m.rfind("[json.exception.", 0) == 0 && p != std::string::npos) m.erase(0, p + 2);
    for (const char* cut : {"; last read", " parsing '"})
      if (size_t p = m.find(cut); p != std::string::npos) m.erase(p);
    if (m.size() > 200) m.resize(200);
    for (char& c : m)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    if (error_.is_ok()) error_ = invalid_argument(std::string(what_) + " is not valid JSON: " + m);
    return false;
  }

  Status take_error() { return error_.is_ok() ? invalid_argument(std::string(what_) + " is not valid JSON") : error_; }
  json take_root() { return std::move(root_); }

 private:
  struct Frame {
    bool is_object = false;
    json array;                                         // when !is_object
    std::vector<std::pair<std::string, json>> members;  // when is_object, in text order
    std::string key;                                    // the key whose value comes next
  };

  bool fail(std::string m) {
    error_ = invalid_argument(std::move(m));
    return false;
  }

  bool count_value() {
    if (++values_ > lim_.max_values)
      return fail(std::string(what_) + " has more than " + std::to_string(lim_.max_values) +
                  " JSON values (json_max_values)");
    return true;
  }

  bool scalar(json v) { return count_value() && place(std::move(v)); }

  bool open(bool is_object) {
    if (!count_value()) return false;
    if (static_cast<int64_t>(stack_.size()) >= lim_.max_depth)
      return fail(std::string(what_) + " nests deeper than " + std::to_string(lim_.max_depth) +
                  " levels (json_max_depth)");
    Frame f;
    f.is_object = is_object;
    if (!is_object) f.array = json::array();
    stack_.push_back(std::move(f));
    return true;
  }

  // Hands a finished value to its parent (or makes it the document).
  bool place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (f.is_object)
      f.members.emplace_back(std::move(f.key), std::move(v));
    else
      f.array.get_ref<json::array_t&>().push_back(std::move(v));
    return true;
  }

  // Builds the ordered object: first position, last value for a repeated key.
  static json close_object(std::vector<std::pair<std::string, json>> members) {
    const size_t n = members.size();
    std::vector<bool> dropped(n, false);
    size_t kept = n;
    auto drop_into = [&](size_t i, size_t first) {
      members[first].second = std::move(members[i].second);
      dropped[i] = true;
      --kept;
    };
    if (n <= 8) {
      for (size_t i = 1; i < n; ++i)
        for (size_t j = 0; j < i; ++j)
          if (!dropped[j] && members[j].first == members[i].first) {
            drop_into(i, j);
            break;
          }
    } else {
      // Sorting (not hashing) finds the repeats: O(n log n) comparisons whatever the keys,
      // so no set of colliding keys can be chosen to make this slow.
      std::vector<uint32_t> order(n);
      for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        int c = members[a].first.compare(members[b].first);
        return c != 0 ? c < 0 : a < b;
      });
      for (size_t g = 0; g < n;) {
        size_t e = g + 1;
        while (e < n && members[order[e]].first == members[order[g]].first) ++e;
        if (e - g > 1) {
          drop_into(order[e - 1], order[g]);  // the last value, at the first position
          for (size_t k = g + 1; k + 1 < e; ++k) {
            dropped[order[k]] = true;
            --kept;
          }
        }
        g = e;
      }
    }
    json obj = json::object();
    auto& vec = static_cast<json::object_t::Container&>(obj.get_ref<json::object_t&>());
    vec.reserve(kept);
    for (size_t i = 0; i < n; ++i)
      if (!dropped[i]) vec.emplace_back(std::move(members[i].first), std::move(members[i].second));
    return obj;
  }

  const JsonLimits& lim_;
  std::string_view what_;
  std::vector<Frame> stack_;
  json root_;
  int64_t values_ = 0;
  Status error_;
};

}  // namespace

Result<json> parse_json_bounded(std::string_view text, const JsonLimits& limits, std::string_view what) {
  BoundedBuilder b(limits, what);
  const bool ok = json::sax_parse(text.begin(), text.end(), &b, json::input_format_t::json, /*strict=*/true);
  if (!ok) return b.take_error();
  return b.take_root();
}

}  // namespace afd::serve
