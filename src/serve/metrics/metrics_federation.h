// Metrics federation: one GET /metrics for a whole bundle. The front end of a multi-process
// deployment (and a service whose FFN workers are child processes) fetches the Prometheus
// text of every worker, tags each sample with where it came from, and renders one valid
// exposition: every metric family once, with its # HELP / # TYPE lines and the samples of
// all targets together (the text format forbids a family appearing twice).
//
// Worker output is outside input: a target that does not answer, answers non-200, sends
// more than kMaxScrapeBytes, or sends lines that do not parse loses only those samples;
// afd_federation_target_up{target=...} and afd_federation_dropped_lines{target=...} say so.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "serve/metrics/prom_merge.h"

namespace afd::serve {

// Where one worker's GET /metrics is, and the label its samples get.
struct MetricsTarget {
  std::string host;
  int port = 0;
  std::string label;  // `name="value"` added to each sample; empty: the samples are unique already
  std::string address() const { return host + ":" + std::to_string(port); }
};

// A target's answer is cut off (and counted as not up) past this many bytes.
constexpr size_t kMaxScrapeBytes = size_t{8} << 20;

// How federation reaches a target: the body of t's GET /metrics answered 200 within
// timeout_ms, at most kMaxScrapeBytes; an error when there is no such answer. Called for every
// target at once, one thread each. Over HTTP: http_scrape_metrics (serve/frontend/proxy_client.h).
using MetricsScrape = std::function<Result<std::string>(const MetricsTarget& t, int timeout_ms)>;

// Fetches every target's GET /metrics at once through scrape (each within timeout_ms) and
// merges them. `own` (may be empty) is added first: its families come first and keep their
// HELP/TYPE. The result ends with the afd_federation_* families describing this scrape.
std::string federate_metrics(const std::string& own, const std::vector<MetricsTarget>& targets, int timeout_ms,
                             const MetricsScrape& scrape);

// "host:port" of a listener -> the address to scrape it at: a wildcard host (0.0.0.0, ::)
// is replaced by `reachable_host` (e.g. the host the worker's data address names).
Result<MetricsTarget> metrics_target_for(const std::string& listen, const std::string& reachable_host,
                                         std::string label);

}  // namespace afd::serve
