// PromMerger: several Prometheus text expositions (format 0.0.4) merged into one valid one.
// The text format lets a metric family appear once, as its # HELP / # TYPE lines followed by
// all its samples, so concatenating workers' answers is not enough: this parses each
// source, files its samples under their family with a label naming the source, and renders
// every family once. Sources are outside input: what does not parse is dropped and counted,
// never trusted (tests/fuzz/serve/fuzz_prom_merge.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace afd::serve {

class PromMerger {
 public:
  // Adds every sample of `text`, with `label` (`name="value"`, already escaped; empty: none)
  // put first in its label set (a source label of the same name becomes exported_<name>).
  // A line that does not parse (bad syntax, a label twice, a value that is not a number, an
  // unknown TYPE) and a sample whose family has another TYPE than the one already collected
  // are dropped and counted. Returns the number of lines dropped. Invariant: render()'s
  // output added to a fresh PromMerger drops nothing.
  size_t add(std::string_view text, const std::string& label);
  // The families in the order first seen, each as HELP, TYPE and its samples.
  std::string render() const;
  size_t families() const { return order_.size(); }
  // The value of the first sample (in the order added) whose name is exactly `name`,
  // whatever its labels; nullopt if there is none. For reading one counter from a scrape.
  std::optional<double> first_value(std::string_view name) const;

 private:
  struct Family {
    std::string help, type;  // empty where the source gave none
    std::vector<std::pair<std::string, std::string>> samples;  // series (name + labels), "value [timestamp]"
  };
  Family& family(const std::string& name);
  std::map<std::string, Family> by_name_;
  std::vector<std::string> order_;
};

// The sum of the samples of `text` named exactly `name` that carry the label `label`
// (`key="value"` as the exposition writes it; empty: whatever their labels); nullopt if there is
// none. Lines that do not parse are skipped. For reading a worker's counters from its scrape.
std::optional<double> prom_sum(std::string_view text, std::string_view name, std::string_view label = {});

}  // namespace afd::serve
