// Order statistics of measured samples (step times, latencies).
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace afd {

// The q-quantile (q in [0, 1]) of v by linear interpolation between closest ranks (numpy's
// default "linear" method): quantile(v, 0.5) is the median, 0 the minimum, 1 the maximum.
// 0 for an empty v.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// The median: the middle value, or the mean of the two middle values of an even count
// (quantile(v, 0.5)); 0 for an empty v.
inline double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

// Median, p90, p99, min, max and mean of a sample, as benchmarks report them.
struct SampleSummary {
  double median = 0, p90 = 0, p99 = 0, min = 0, max = 0, mean = 0;
  size_t n = 0;
};

inline SampleSummary summarize(const std::vector<double>& v) {
  SampleSummary s;
  s.n = v.size();
  if (v.empty()) return s;
  s.median = median(v);
  s.p90 = quantile(v, 0.9);
  s.p99 = quantile(v, 0.99);
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

}  // namespace afd
