#include "serve/metrics/metrics_federation.h"

#include <chrono>
#include <future>
#include <utility>

#include "runtime/topology_file.h"
#include "serve/metrics/metrics.h"

namespace afd::serve {
namespace {

std::string escape_label_value(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

}  // namespace

std::string federate_metrics(const std::string& own, const std::vector<MetricsTarget>& targets, int timeout_ms,
                             const MetricsScrape& scrape) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::future<Result<std::string>>> answers;
  answers.reserve(targets.size());
  for (const MetricsTarget& t : targets)
    answers.push_back(std::async(std::launch::async, [&t, timeout_ms, &scrape] { return scrape(t, timeout_ms); }));
  PromMerger m;
  m.add(own, "");
  std::vector<std::pair<bool, size_t>> outcome;  // up, lines dropped
  for (size_t i = 0; i < targets.size(); ++i) {
    Result<std::string> body = answers[i].get();
    if (!body.ok()) {
      outcome.emplace_back(false, 0);
      continue;
    }
    outcome.emplace_back(true, m.add(*body, targets[i].label));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // This scrape's own families go through the merger too, so a target that exports the
  // same names (a front end federating another) still yields each family once.
  std::string o;
  auto target = [&](size_t i) { return "{target=\"" + escape_label_value(targets[i].address()) + "\"} "; };
  prom_header(&o, "afd_federation_target_up", "gauge",
              "1 if the worker answered this scrape's GET /metrics with 200 in time; its samples are above.");
  for (size_t i = 0; i < targets.size(); ++i)
    o += "afd_federation_target_up" + target(i) + (outcome[i].first ? "1" : "0") + "\n";
  prom_header(&o, "afd_federation_dropped_lines", "gauge",
              "Lines of the worker's answer left out of this scrape (unparseable, or a family whose type clashes).");
  for (size_t i = 0; i < targets.size(); ++i)
    o += "afd_federation_dropped_lines" + target(i) + std::to_string(outcome[i].second) + "\n";
  prom_header(&o, "afd_federation_scrape_seconds", "gauge", "Time this scrape waited for its workers.");
  o += "afd_federation_scrape_seconds " + prom_num(seconds) + "\n";
  m.add(o, "");
  return m.render();
}

Result<MetricsTarget> metrics_target_for(const std::string& listen, const std::string& reachable_host,
                                         std::string label) {
  MetricsTarget t;
  if (Status s = split_host_port(listen, &t.host, &t.port); !s.is_ok()) return s;
  if (t.host.empty() || t.host == "0.0.0.0" || t.host == "::") t.host = reachable_host;
  t.label = std::move(label);
  return t;
}

}  // namespace afd::serve
