#include "serve/metrics/prom_merge.h"

#include <cstdlib>
#include <unordered_set>

#include "core/prom_text.h"

namespace afd::serve {
namespace {

// The family a sample named `name` belongs to, given the family of the last # HELP/# TYPE.
bool belongs_to(std::string_view name, const std::string& family, const std::string& type) {
  if (family.empty() || name.substr(0, family.size()) != family) return false;
  const std::string_view suffix = name.substr(family.size());
  if (suffix.empty()) return true;
  if (type == "histogram") return suffix == "_bucket" || suffix == "_sum" || suffix == "_count";
  if (type == "summary") return suffix == "_sum" || suffix == "_count";
  return false;
}

}  // namespace

PromMerger::Family& PromMerger::family(const std::string& name) {
  auto [it, fresh] = by_name_.try_emplace(name);
  if (fresh) order_.push_back(name);
  return it->second;
}

size_t PromMerger::add(std::string_view text, const std::string& label) {
  std::string_view extra_name;
  if (!label.empty()) extra_name = std::string_view(label).substr(0, label.find('='));
  size_t dropped = 0;
  std::string current, current_type;  // family of the last # HELP / # TYPE line
  std::unordered_set<std::string> refused;  // families whose TYPE disagrees with the collected one
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    skip_prom_blanks(line, &i);
    if (i == line.size()) continue;
    if (line[i] == '#') {
      ++i;
      skip_prom_blanks(line, &i);
      const bool help = line.substr(i, 4) == "HELP", type = line.substr(i, 4) == "TYPE";
      if (!help && !type) continue;  // other comments carry nothing
      i += 4;
      skip_prom_blanks(line, &i);
      const std::string_view name = take_prom_name(line, &i);
      skip_prom_blanks(line, &i);
      const std::string_view arg = line.substr(i);
      if (name.empty() || (type && arg != "counter" && arg != "gauge" && arg != "histogram" && arg != "summary" &&
                           arg != "untyped")) {
        ++dropped;
        continue;
      }
      if (current != name) current_type.clear();
      current = std::string(name);
      Family& f = family(current);
      if (help && f.help.empty()) f.help = std::string(arg);
      if (type) {
        current_type = std::string(arg);
        if (f.type.empty() && f.samples.empty()) f.type = current_type;
        else if (f.type != current_type) refused.insert(current);
      }
      continue;
    }
    PromSample s;
    if (!parse_prom_sample(line.substr(i), &s)) {
      ++dropped;
      continue;
    }
    std::string type = current_type;
    if (type.empty() && !current.empty()) type = by_name_.at(current).type;
    const std::string fam = belongs_to(s.name, current, type) ? current : std::string(s.name);
    if (refused.count(fam)) {
      ++dropped;
      continue;
    }
    // A source label with our label's name is kept as exported_<name> (as Prometheus does
    // for a target's clashing labels); a sample that also has exported_<name> cannot be.
    bool clash = false, exported_taken = false;
    for (const PromLabel& l : s.labels) {
      clash = clash || (!extra_name.empty() && l.name == extra_name);
      exported_taken = exported_taken || (l.name.substr(0, 9) == "exported_" && l.name.substr(9) == extra_name);
    }
    if (clash && exported_taken) {
      ++dropped;
      continue;
    }
    Family& f = family(fam);
    std::string series(s.name);
    if (!extra_name.empty() || !s.labels.empty()) {
      series += '{';
      bool first = true;
      if (!extra_name.empty()) {
        series += label;
        first = false;
      }
      for (const PromLabel& l : s.labels) {
        if (!first) series += ',';
        first = false;
        if (l.name == extra_name) series += "exported_";
        series.append(l.name).append("=").append(l.quoted_value);
      }
      series += '}';
    }
    f.samples.push_back({std::move(series), std::string(s.rest)});
  }
  return dropped;
}

std::optional<double> PromMerger::first_value(std::string_view name) const {
  for (const std::string& fam : order_) {
    for (const auto& [series, value] : by_name_.at(fam).samples) {
      if (std::string_view(series).substr(0, series.find('{')) != name) continue;
      // add() accepted it: "value [timestamp]" with a number first.
      const std::string_view v = std::string_view(value).substr(0, value.find(' '));
      return std::strtod(std::string(v).c_str(), nullptr);
    }
  }
  return std::nullopt;
}

std::optional<double> prom_sum(std::string_view text, std::string_view name, std::string_view label) {
  const size_t eq = label.find('=');
  const std::string_view key = eq == std::string_view::npos ? label : label.substr(0, eq);
  const std::string_view quoted = eq == std::string_view::npos ? std::string_view() : label.substr(eq + 1);
  std::optional<double> sum;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#' || line.substr(0, name.size()) != name) continue;
    PromSample s;
    if (!parse_prom_sample(line, &s) || s.name != name) continue;
    if (!label.empty()) {
      bool has = false;
      for (const PromLabel& l : s.labels) has = has || (l.name == key && l.quoted_value == quoted);
      if (!has) continue;
    }
    sum = sum.value_or(0) + s.value;
  }
  return sum;
}

std::string PromMerger::render() const {
  std::string o;
  std::unordered_set<std::string_view> seen;  // a series (name + labels) twice is invalid: first wins
  for (const std::string& name : order_) {
    const Family& f = by_name_.at(name);
    if (f.samples.empty()) continue;
    if (!f.help.empty()) o += "# HELP " + name + " " + f.help + "\n";
    if (!f.type.empty()) o += "# TYPE " + name + " " + f.type + "\n";
    for (const auto& [series, value] : f.samples) {
      if (!seen.insert(series).second) continue;
      o.append(series).append(" ").append(value).append("\n");
    }
  }
  return o;
}

}  // namespace afd::serve
