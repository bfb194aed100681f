#include "plan/sim_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace afd::plan {

Result<RatioSpec> parse_ratio_spec(const std::string& s) {
  auto bad = [&] { return invalid_argument("bad ratio '" + s + "' (expected r, e.g. 8 or 3.5, or x:y, e.g. 7:2)"); };
  if (s.empty()) return bad();
  const auto colon = s.find(':');
  char* end = nullptr;
  if (colon != std::string::npos) {
    const std::string a = s.substr(0, colon), b = s.substr(colon + 1);
    const long long x = std::strtoll(a.c_str(), &end, 10);
    if (a.empty() || *end != '\0') return bad();
    const long long y = std::strtoll(b.c_str(), &end, 10);
    if (b.empty() || *end != '\0') return bad();
    if (x < 1 || y < 1 || x > 100000 || y > 100000) return bad();
    return RatioSpec{x, y};
  }
  const double r = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(r) || r <= 0 || r > 100000) return bad();
  for (int64_t y = 1; y <= 64; ++y) {
    const double x = r * static_cast<double>(y);
    if (std::fabs(x - std::round(x)) < 1e-9 && std::round(x) >= 1) return RatioSpec{static_cast<int64_t>(std::round(x)), y};
  }
  return invalid_argument("ratio '" + s + "' is not x/y with y <= 64; use x:y");
}

RatioWorkload workload_of(const SimConfig& c) {
  RatioWorkload w;
  w.batch = c.batch;
  w.mu_prefill = c.prefill.mean;
  w.mu_decode = c.decode.mean;
  w.n_requests = c.requests_per_attn;
  return w;
}

TheoryPoint theory_point(const SimConfig& c, double ratio) {
  const RatioWorkload w = workload_of(c);
  const LatencyProfile& lat = c.latency;
  const double b = static_cast<double>(c.batch);
  const double ta = lat.attention.at(horizon_avg_token_load(w));
  const double tc = lat.comm.at(b);
  const double tf = lat.ffn.at(ratio * b);
  TheoryPoint p;
  p.ratio = ratio;
  p.cycle = std::max({ta, tc, tf});
  p.throughput_per_instance = ratio * b / ((ratio + 1.0) * p.cycle);
  p.eta_attn = 1.0 - ta / p.cycle;
  p.eta_ffn = 1.0 - tf / p.cycle;
  const double m = static_cast<double>(c.n_microbatches);
  p.pipelined_cycle = std::max(p.cycle, (ta + tc + tf) / m);
  p.pipelined_throughput = ratio * b / ((ratio + 1.0) * p.pipelined_cycle);
  p.tpot = m * p.pipelined_cycle;
  return p;
}

double pipelined_optimal_ratio(const SimConfig& c) {
  const double r_max = 4.0 * optimal_ratio(c.latency, workload_of(c)).r_star + 4.0;
  double best_r = 1e-3, best = -1;
  const int64_t n = static_cast<int64_t>(r_max * 1000.0);
  for (int64_t i = 1; i <= n; ++i) {
    const double r = static_cast<double>(i) * 1e-3;
    const double t = theory_point(c, r).pipelined_throughput;
    if (t > best) {
      best = t;
      best_r = r;
    }
  }
  return best_r;
}

Result<std::vector<SweepPoint>> run_ratio_sweep(const SimConfig& base, const std::vector<RatioSpec>& ratios,
                                                ThreadPool* pool) {
  std::vector<SweepPoint> pts(ratios.size());
  std::vector<Status> errs(ratios.size());
  auto one = [&](int i, int) {
    SimConfig c = base;
    c.n_attn = ratios[i].n_attn;
    c.n_ffn = ratios[i].n_ffn;
    pts[i].spec = ratios[i];
    pts[i].theory = theory_point(c, ratios[i].ratio());
    auto r = simulate(c);
    if (!r.ok()) {
      errs[i] = r.status();
      return;
    }
    pts[i].sim = *r;
  };
  if (pool != nullptr) {
    pool->run(static_cast<int>(ratios.size()), one);
  } else {
    for (size_t i = 0; i < ratios.size(); ++i) one(static_cast<int>(i), 0);
  }
  for (size_t i = 0; i < ratios.size(); ++i)
    if (!errs[i].is_ok()) return errs[i].with_context("ratio " + std::to_string(ratios[i].n_attn) + ":" + std::to_string(ratios[i].n_ffn));
  return pts;
}

}  // namespace afd::plan
