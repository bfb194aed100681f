#include "core/prom_text.h"

#include <cctype>
#include <cstdlib>

namespace afd {
namespace {

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool name_char(char c) { return name_start(c) || std::isdigit(static_cast<unsigned char>(c)); }

// `{name="value",...}` at s[*i] (with optional blanks and a trailing comma).
bool take_labels(std::string_view s, size_t* i, std::vector<PromLabel>* out) {
  ++*i;  // '{'
  for (;;) {
    skip_prom_blanks(s, i);
    if (*i < s.size() && s[*i] == '}') {
      ++*i;
      return true;
    }
    PromLabel l;
    l.name = take_prom_name(s, i);
    if (l.name.empty()) return false;
    skip_prom_blanks(s, i);
    if (*i >= s.size() || s[*i] != '=') return false;
    ++*i;
    skip_prom_blanks(s, i);
    if (*i >= s.size() || s[*i] != '"') return false;
    const size_t b = (*i)++;
    while (*i < s.size() && s[*i] != '"') {
      if (s[*i] == '\\') {
        if (*i + 1 >= s.size() || (s[*i + 1] != '\\' && s[*i + 1] != '"' && s[*i + 1] != 'n')) return false;
        ++*i;
      }
      ++*i;
    }
    if (*i >= s.size()) return false;
    l.quoted_value = s.substr(b, ++*i - b);
    for (const PromLabel& seen : *out)
      if (seen.name == l.name) return false;  // a label twice is invalid
    out->push_back(l);
    skip_prom_blanks(s, i);
    if (*i < s.size() && s[*i] == ',') ++*i;
    else if (*i >= s.size() || s[*i] != '}') return false;
  }
}

bool is_number(std::string_view t, bool integer, double* value) {
  if (t.empty() || t.size() > 64) return false;
  const std::string z(t);
  char* end = nullptr;
  if (integer) (void)std::strtoll(z.c_str(), &end, 10);
  else *value = std::strtod(z.c_str(), &end);
  return end == z.c_str() + z.size();
}

}  // namespace

void skip_prom_blanks(std::string_view s, size_t* i) {
  while (*i < s.size() && (s[*i] == ' ' || s[*i] == '\t')) ++*i;
}

std::string_view take_prom_name(std::string_view s, size_t* i) {
  const size_t b = *i;
  if (b >= s.size() || !name_start(s[b])) return {};
  size_t e = b + 1;
  while (e < s.size() && name_char(s[e])) ++e;
  *i = e;
  return s.substr(b, e - b);
}

bool parse_prom_sample(std::string_view line, PromSample* out) {
  out->labels.clear();
  size_t i = 0;
  out->name = take_prom_name(line, &i);
  if (out->name.empty()) return false;
  skip_prom_blanks(line, &i);
  if (i < line.size() && line[i] == '{' && !take_labels(line, &i, &out->labels)) return false;
  skip_prom_blanks(line, &i);
  out->rest = line.substr(i);
  while (!out->rest.empty() && (out->rest.back() == ' ' || out->rest.back() == '\t' || out->rest.back() == '\r'))
    out->rest.remove_suffix(1);
  const size_t sp = out->rest.find_first_of(" \t");
  if (sp == std::string_view::npos) return is_number(out->rest, false, &out->value);
  std::string_view ts = out->rest.substr(sp);
  while (!ts.empty() && (ts.front() == ' ' || ts.front() == '\t')) ts.remove_prefix(1);
  double unused = 0;
  return is_number(out->rest.substr(0, sp), false, &out->value) && is_number(ts, true, &unused);
}

std::optional<std::string> prom_label(const PromSample& s, std::string_view name) {
  for (const PromLabel& l : s.labels) {
    if (l.name != name) continue;
    std::string v;
    const std::string_view q = l.quoted_value.substr(1, l.quoted_value.size() - 2);
    for (size_t k = 0; k < q.size(); ++k) {
      if (q[k] == '\\' && k + 1 < q.size()) {
        ++k;
        v.push_back(q[k] == 'n' ? '\n' : q[k]);
      } else {
        v.push_back(q[k]);
      }
    }
    return v;
  }
  return std::nullopt;
}

}  // namespace afd
