// afd sim --autoscale: the A/F-ratio controller (plan/autoscale.h) over the simulator, phase by
// phase (plan/sim_autoscale.h); prints every window's counts, busy fractions, throughput and
// the decision with the numbers that made it.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/sim_autoscale.h"
#include "plan/sim_sweep.h"
#include "plan_cli.h"

namespace afd::cli {

using nlohmann::json;
using namespace afd::plan;

void add_sim_autoscale_args(CLI::App* cmd, SimAutoscaleArgs* a) {
  cmd->add_option("--autoscale", a->phases,
                  "run the A/F-ratio controller from the one --ratio given, over phases: base, attn*F, ffn*F, "
                  "attn*F+ffn*G, each :W windows (e.g. base:4,attn*2:4,ffn*3:4)");
  cmd->add_option("--min-attention", a->opt.bounds.min_attn, "autoscale: fewest attention workers")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--max-attention", a->opt.bounds.max_attn, "autoscale: most attention workers")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--min-ffn", a->opt.bounds.min_ffn, "autoscale: fewest FFN workers")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--max-ffn", a->opt.bounds.max_ffn, "autoscale: most FFN workers")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--hysteresis", a->opt.hysteresis, "autoscale: act when |r'/r - 1| exceeds it")
      ->check(CLI::Range(0.01, 1.0));
}

void run_sim_autoscale(const SimConfig& start, const SimAutoscaleArgs& a, bool as_json) {
  const auto phases = unwrap(parse_autoscale_phases(a.phases));
  const AutoscaleRun run = unwrap(simulate_autoscale(start, phases, a.opt));
  struct PhaseTheory {
    double r_star, r_pipelined;
  };
  std::vector<PhaseTheory> theory;
  for (const AutoscalePhase& ph : phases) {
    SimConfig c = start;
    c.latency = phase_profile(start.latency, ph);
    theory.push_back({optimal_ratio(c.latency, workload_of(c)).r_star, pipelined_optimal_ratio(c)});
  }
  if (as_json) {
    json steps = json::array();
    for (const AutoscaleStep& s : run.steps)
      steps.push_back({{"phase", phases[s.phase].name}, {"window", s.window}, {"n_attn", s.n_attn},
                       {"n_ffn", s.n_ffn}, {"attention_busy", 1.0 - s.sim.eta_attn},
                       {"ffn_busy", 1.0 - s.sim.eta_ffn}, {"throughput_per_instance", s.sim.throughput_per_instance},
                       {"tpot", s.sim.tpot}, {"change", s.decision.change}, {"r_star", s.decision.r_star},
                       {"ffn_alpha", s.decision.ffn_alpha}, {"ffn_beta", s.decision.ffn_beta},
                       {"next_n_attn", s.decision.n_attn}, {"next_n_ffn", s.decision.n_ffn},
                       {"reason", s.decision.reason}});
    json per_phase = json::array();
    for (size_t p = 0; p < phases.size(); ++p)
      per_phase.push_back({{"phase", phases[p].name}, {"changes", run.changes_per_phase[p]},
                           {"r_star", theory[p].r_star}, {"r_pipelined", theory[p].r_pipelined}});
    print_json({{"hysteresis", a.opt.hysteresis}, {"phases", per_phase}, {"windows", steps}});
    return;
  }
  std::printf("A/F-ratio controller over the simulator: hysteresis %.2f, attention workers %lld..%lld, FFN workers "
              "%lld..%lld, B = %lld, %lld requests per attention instance per window\n",
              a.opt.hysteresis, static_cast<long long>(a.opt.bounds.min_attn),
              static_cast<long long>(a.opt.bounds.max_attn), static_cast<long long>(a.opt.bounds.min_ffn),
              static_cast<long long>(a.opt.bounds.max_ffn), static_cast<long long>(start.batch),
              static_cast<long long>(start.requests_per_attn));
  size_t shown = phases.size();
  for (const AutoscaleStep& s : run.steps) {
    if (s.phase != shown) {
      shown = s.phase;
      std::printf("phase %s: theory r* = %.3f, pipelined optimum %.3f; %lld change(s)\n", phases[s.phase].name.c_str(),
                  theory[s.phase].r_star, theory[s.phase].r_pipelined,
                  static_cast<long long>(run.changes_per_phase[s.phase]));
      std::printf("  %-6s %-9s %7s %7s %10s %7s  %s\n", "window", "xA-yF", "busy A", "busy F", "thr", "r*", "decision");
    }
    char name[32];
    std::snprintf(name, sizeof name, "%lldA-%lldF", static_cast<long long>(s.n_attn), static_cast<long long>(s.n_ffn));
    std::printf("  %-6lld %-9s %7.3f %7.3f %10.5g %7.3f  %s\n", static_cast<long long>(s.window), name,
                1.0 - s.sim.eta_attn, 1.0 - s.sim.eta_ffn, s.sim.throughput_per_instance, s.decision.r_star,
                s.decision.reason.c_str());
  }
}

}  // namespace afd::cli
