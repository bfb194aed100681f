#include "plan/ratio_theory.h"

#include <algorithm>
#include <cmath>

namespace afd::plan {

double expected_token_load(const RatioWorkload& w, double k) {
  const double b = static_cast<double>(w.batch);
  const double p = w.p();
  return b * w.mu_prefill + b * w.mu_decode * (1.0 - std::pow(1.0 - p, k));
}

double horizon_avg_token_load(const RatioWorkload& w) {
  const double b = static_cast<double>(w.batch);
  const double limit = b * (w.mu_prefill + w.mu_decode);
  if (!w.n_requests) return limit;
  const double p = w.p();
  const double k_steps = static_cast<double>(*w.n_requests) / (b * p);  // K(B) = N / (Bp), eq. (12)
  if (k_steps <= 0) return b * w.mu_prefill;
  // (1/K) Σ_{k<K} (1-p)^k = (1 - (1-p)^K) / (K p)
  return limit - b * w.mu_decode * (1.0 - std::pow(1.0 - p, k_steps)) / (k_steps * p);
}

const char* regime_name(Regime r) {
  switch (r) {
    case Regime::attention_bound: return "attention-bottleneck";
    case Regime::comm_bound: return "communication-bottleneck";
    case Regime::ffn_bound: return "ffn-bottleneck";
  }
  return "?";
}

RatioResult optimal_ratio(const LatencyProfile& lat, const RatioWorkload& w) {
  RatioResult r;
  const double b = static_cast<double>(w.batch);
  r.t_bar = horizon_avg_token_load(w);
  r.t_attn = lat.attention.at(r.t_bar);
  r.t_comm = lat.comm.at(b);
  const double denom = lat.ffn.alpha * b;
  r.r_attn = (r.t_attn - lat.ffn.beta) / denom;
  r.r_comm = (r.t_comm - lat.ffn.beta) / denom;
  r.r_peak = std::sqrt(lat.ffn.beta / denom);
  r.r_star = r.r_attn;
  r.regime = Regime::attention_bound;
  if (r.r_comm > r.r_star) {
    r.r_star = r.r_comm;
    r.regime = Regime::comm_bound;
  }
  if (r.r_peak > r.r_star) {
    r.r_star = r.r_peak;
    r.regime = Regime::ffn_bound;
  }
  r.throughput_star = r.r_star * b / ((r.r_star + 1.0) * (lat.ffn.alpha * r.r_star * b + lat.ffn.beta));
  return r;
}

double cycle_time(const LatencyProfile& lat, const RatioWorkload& w, double r) {
  const double b = static_cast<double>(w.batch);
  return std::max({lat.attention.at(horizon_avg_token_load(w)), lat.comm.at(b), lat.ffn.at(r * b)});
}

double throughput_per_instance(const LatencyProfile& lat, const RatioWorkload& w, double r) {
  const double b = static_cast<double>(w.batch);
  return r * b / ((r + 1.0) * cycle_time(lat, w, r));
}

}  // namespace afd::plan
