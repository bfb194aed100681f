#include "plan/autoscale.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

namespace afd::plan {
namespace {

template <class... Args>
std::string format(const char* fmt, Args... args) {
  char buf[320];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

int64_t clamp_count(double v, int64_t lo, int64_t hi) {
  const double r = std::round(v);
  if (!(r >= static_cast<double>(lo))) return lo;  // also NaN
  if (r > static_cast<double>(hi)) return hi;
  return static_cast<int64_t>(r);
}

bool finite_non_negative(double v) { return std::isfinite(v) && v >= 0; }

// Least squares t = α n + β over the samples, β >= 0 (else the line through the origin). One
// sample, or samples at (nearly) one n: β = 0.
std::pair<double, double> fit_ffn(const std::vector<std::pair<double, double>>& s) {
  double sn = 0, st = 0;
  for (const auto& [n, t] : s) sn += n, st += t;
  const double k = static_cast<double>(s.size());
  const double mn = sn / k, mt = st / k;
  double snn = 0, snt = 0;
  for (const auto& [n, t] : s) snn += (n - mn) * (n - mn), snt += (n - mn) * (t - mt);
  if (s.size() >= 2 && snn > 1e-6 * mn * mn * k) {
    const double a = snt / snn, b = mt - a * mn;
    if (a > 0 && b >= 0) return {a, b};
  }
  double nn = 0, nt = 0;  // through the origin
  for (const auto& [n, t] : s) nn += n * n, nt += n * t;
  return {nt / nn, 0.0};
}

}  // namespace

Status AutoscaleBounds::validate() const {
  if (min_attn < 1 || min_attn > max_attn || max_attn > 4096)
    return invalid_argument("autoscale: attention worker bounds need 1 <= min <= max <= 4096");
  if (min_ffn < 1 || min_ffn > max_ffn || max_ffn > 4096)
    return invalid_argument("autoscale: FFN worker bounds need 1 <= min <= max <= 4096");
  return {};
}

Status AutoscaleOptions::validate() const {
  if (Status s = bounds.validate(); !s.ok()) return s;
  if (!(hysteresis >= 0.01 && hysteresis <= 1.0)) return invalid_argument("autoscale: hysteresis must be in [0.01, 1]");
  if (!(refit_tolerance > 0 && refit_tolerance <= 1.0))
    return invalid_argument("autoscale: refit tolerance must be in (0, 1]");
  return {};
}

Result<StageWindow> stage_window(const StageCounters& before, const StageCounters& after, int64_t n_attn,
                                 int64_t n_ffn) {
  if (n_attn < 1 || n_ffn < 1) return invalid_argument("stage window: worker counts must be >= 1");
  const double d[] = {after.attention_s - before.attention_s, after.ffn_s - before.ffn_s,
                      after.ffn_batches - before.ffn_batches, after.ffn_frames - before.ffn_frames,
                      after.ffn_tokens - before.ffn_tokens};
  const char* names[] = {"attention seconds", "FFN seconds", "FFN batches", "FFN frames", "FFN tokens"};
  for (int i = 0; i < 5; ++i) {
    if (!std::isfinite(d[i])) return invalid_argument(std::string("stage window: ") + names[i] + " not finite");
    if (d[i] < 0)
      return invalid_argument(std::string("stage window: ") + names[i] + " went down (a worker restarted)");
  }
  const auto [attn_s, ffn_s, batches, frames, tokens] = std::tuple(d[0], d[1], d[2], d[3], d[4]);
  StageWindow w;
  w.n_attn = n_attn;
  w.n_ffn = n_ffn;
  if (frames <= 0 || batches <= 0) return w;
  const double y = static_cast<double>(n_ffn);
  w.batch = tokens / frames;
  w.attn_time = attn_s / (frames / y);
  w.ffn_time = ffn_s / batches;
  w.ffn_tokens = (frames / batches) * w.batch / y;
  return w;
}

Result<AutoscaleDecision> AutoscaleController::decide(const StageWindow& w) {
  if (Status s = opt_.validate(); !s.ok()) return s;
  const AutoscaleBounds& b = opt_.bounds;
  if (w.n_attn < b.min_attn || w.n_attn > b.max_attn || w.n_ffn < b.min_ffn || w.n_ffn > b.max_ffn)
    return invalid_argument("autoscale: the window's " + std::to_string(w.n_attn) + "A-" + std::to_string(w.n_ffn) +
                            "F is outside the bounds");
  for (double v : {w.attn_time, w.batch, w.comm_time, w.ffn_time, w.ffn_tokens})
    if (!finite_non_negative(v)) return invalid_argument("autoscale: measurements must be finite and >= 0");
  AutoscaleDecision d;
  d.n_attn = w.n_attn;
  d.n_ffn = w.n_ffn;
  d.ratio = static_cast<double>(w.n_attn) / static_cast<double>(w.n_ffn);
  if (w.attn_time <= 0 || w.batch <= 0 || w.ffn_time <= 0 || w.ffn_tokens <= 0) {
    d.reason = "no decision: the window measured no attention or no FFN work";
    return d;
  }
  // Only a fit over two or more n can be contradicted: a single pair's β = 0 is a guess.
  bool refit = false;
  bool fitted = false;
  for (const auto& [n, t] : ffn_samples_)
    fitted |= std::fabs(n - ffn_samples_.front().first) > 0.01 * ffn_samples_.front().first;
  if (fitted) {
    const auto [a, bb] = fit_ffn(ffn_samples_);
    const double predicted = a * w.ffn_tokens + bb;
    refit = std::fabs(w.ffn_time - predicted) > opt_.refit_tolerance * w.ffn_time;
    if (refit) ffn_samples_.clear();
  }
  if (!opt_.fit_ffn_fixed_cost) ffn_samples_.clear();
  ffn_samples_.emplace_back(w.ffn_tokens, w.ffn_time);
  if (ffn_samples_.size() > 16) ffn_samples_.erase(ffn_samples_.begin());
  const auto [alpha, beta] = fit_ffn(ffn_samples_);
  d.ffn_alpha = alpha;
  d.ffn_beta = beta;
  const double denom = alpha * w.batch;
  const double r_attn = (w.attn_time - beta) / denom;
  const double r_comm = w.comm_time > 0 ? (w.comm_time - beta) / denom : 0.0;
  const double r_peak = std::sqrt(beta / denom);
  d.r_star = std::max({r_attn, r_comm, r_peak});
  const char* regime = d.r_star == r_attn ? "attention" : (d.r_star == r_comm ? "comm" : "FFN");
  const std::string measured =
      format("r = %.3f; t_A %.4g, t_C %.4g, B %.4g; t_F = %.4g n + %.4g over %zu window(s)%s; r* = %.3f (%s-bound)",
             d.ratio, w.attn_time, w.comm_time, w.batch, alpha, beta, ffn_samples_.size(),
             refit ? " (t_F changed: refit)" : "", d.r_star, regime);
  if (!(d.r_star > 0) || std::fabs(d.r_star / d.ratio - 1.0) <= opt_.hysteresis) {
    d.reason = measured + format("; within the hysteresis %.2f: no change", opt_.hysteresis);
    return d;
  }
  const int64_t y = clamp_count(static_cast<double>(w.n_attn) / d.r_star, b.min_ffn, b.max_ffn);
  if (y != w.n_ffn) {
    d.change = true;
    d.n_ffn = y;
    d.reason = measured + "; FFN workers " + std::to_string(w.n_ffn) + " -> " + std::to_string(y);
    return d;
  }
  const int64_t x = clamp_count(d.r_star * static_cast<double>(w.n_ffn), b.min_attn, b.max_attn);
  if (x != w.n_attn) {
    d.change = true;
    d.n_attn = x;
    d.reason = measured + "; attention workers " + std::to_string(w.n_attn) + " -> " + std::to_string(x);
    return d;
  }
  d.reason = measured + "; the nearest counts within the bounds are the current ones: no change";
  return d;
}

}  // namespace afd::plan
