#include "plan/sim_autoscale.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace afd::plan {
namespace {

// A positive number in (0, max] from `s`, all of it; false otherwise.
bool parse_positive(const std::string& s, double max, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !(v > 0 && v <= max)) return false;
  *out = v;
  return true;
}

Status parse_term(const std::string& term, const std::string& item, AutoscalePhase* p) {
  if (term == "base") return {};
  const size_t star = term.find('*');
  const std::string stage = term.substr(0, star);
  double f = 0;
  if (star == std::string::npos || (stage != "attn" && stage != "ffn") || !parse_positive(term.substr(star + 1), 100, &f))
    return invalid_argument("autoscale phase '" + item + "': expected base, attn*F or ffn*F (F in (0, 100])");
  (stage == "attn" ? p->attn_scale : p->ffn_scale) = f;
  return {};
}

}  // namespace

LatencyProfile phase_profile(const LatencyProfile& base, const AutoscalePhase& p) {
  LatencyProfile l = base;
  l.attention.alpha *= p.attn_scale;
  l.attention.beta *= p.attn_scale;
  l.ffn.alpha *= p.ffn_scale;
  l.ffn.beta *= p.ffn_scale;
  return l;
}

Result<std::vector<AutoscalePhase>> parse_autoscale_phases(const std::string& spec) {
  std::vector<AutoscalePhase> out;
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) return invalid_argument("autoscale phases: an empty item in '" + spec + "'");
    AutoscalePhase p;
    p.name = item;
    std::string terms = item;
    if (const size_t colon = item.find(':'); colon != std::string::npos) {
      double w = 0;
      if (!parse_positive(item.substr(colon + 1), 100, &w) || w != std::floor(w))
        return invalid_argument("autoscale phase '" + item + "': windows after ':' must be an integer in [1, 100]");
      p.windows = static_cast<int64_t>(w);
      terms = item.substr(0, colon);
    }
    size_t t0 = 0;
    while (t0 <= terms.size()) {
      const size_t plus = std::min(terms.find('+', t0), terms.size());
      if (Status s = parse_term(terms.substr(t0, plus - t0), item, &p); !s.ok()) return s;
      t0 = plus + 1;
    }
    out.push_back(p);
    if (out.size() > 100) return invalid_argument("autoscale phases: more than 100");
  }
  return out;
}

Result<AutoscaleRun> simulate_autoscale(const SimConfig& base, const std::vector<AutoscalePhase>& phases,
                                        const AutoscaleOptions& opt) {
  if (phases.empty()) return invalid_argument("autoscale: no phases");
  if (Status s = opt.validate(); !s.ok()) return s;
  if (Status s = base.validate(); !s.ok()) return s;
  const AutoscaleBounds& b = opt.bounds;
  if (base.n_attn < b.min_attn || base.n_attn > b.max_attn || base.n_ffn < b.min_ffn || base.n_ffn > b.max_ffn)
    return invalid_argument("autoscale: the starting " + std::to_string(base.n_attn) + "A-" +
                            std::to_string(base.n_ffn) + "F is outside the bounds");
  AutoscaleRun run;
  AutoscaleController controller(opt);
  int64_t x = base.n_attn, y = base.n_ffn;
  for (size_t ph = 0; ph < phases.size(); ++ph) {
    int64_t changes = 0;
    for (int64_t win = 0; win < phases[ph].windows; ++win) {
      SimConfig c = base;
      c.n_attn = x;
      c.n_ffn = y;
      c.latency = phase_profile(base.latency, phases[ph]);
      auto sim = simulate(c);
      if (!sim.ok())
        return sim.status().with_context("autoscale phase '" + phases[ph].name + "' at " + std::to_string(x) + "A-" +
                                         std::to_string(y) + "F");
      const StageWindow w{.n_attn = x,
                          .n_ffn = y,
                          .attn_time = sim->step_attn_time,
                          .batch = sim->step_active,
                          .comm_time = sim->step_comm_time,
                          .ffn_time = sim->step_ffn_time,
                          .ffn_tokens = sim->step_ffn_tokens};
      auto d = controller.decide(w);
      if (!d.ok()) return d.status();
      run.steps.push_back({ph, win, x, y, *sim, *d});
      if (d->change) {
        ++changes;
        x = d->n_attn;
        y = d->n_ffn;
      }
    }
    run.changes_per_phase.push_back(changes);
  }
  return run;
}

}  // namespace afd::plan
