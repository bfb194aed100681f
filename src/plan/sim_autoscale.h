// The autoscaling controller (plan/autoscale.h) over the simulator, window by window: a window is
// one simulation (plan/simulator.h) of the current xA-yF, the controller reads what it measured
// per step (SimResult::step_*: attention, transfer and FFN times, active requests, FFN tokens),
// and its decision sets the counts of the next window. A load
// change is a phase: the base latency profile with the attention and/or FFN stage made slower
// or faster (α and β of t_A or t_F scaled), for a number of windows. Quasi-static: every window
// runs to its own steady state; how a deployment switches between counts is not simulated.
// Deterministic: same configuration, same bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/autoscale.h"
#include "plan/simulator.h"

namespace afd::plan {

struct AutoscalePhase {
  std::string name;        // as written ("base", "attn*2", "ffn*0.5")
  double attn_scale = 1;   // t_A multiplied by it
  double ffn_scale = 1;    // t_F multiplied by it
  int64_t windows = 5;
};

// The base profile with the phase's stages scaled (α and β of t_A by attn_scale, of t_F by ffn_scale).
LatencyProfile phase_profile(const LatencyProfile& base, const AutoscalePhase& p);

// "base", "attn*F", "ffn*F" or "attn*F+ffn*G", each optionally ":W" (windows, default 5), comma
// separated; F in (0, 100], W in [1, 100]. invalid_argument naming the item otherwise.
Result<std::vector<AutoscalePhase>> parse_autoscale_phases(const std::string& spec);

struct AutoscaleStep {
  size_t phase = 0;
  int64_t window = 0;      // within its phase, from 0
  int64_t n_attn = 1, n_ffn = 1;
  SimResult sim;
  AutoscaleDecision decision;
};

struct AutoscaleRun {
  std::vector<AutoscaleStep> steps;
  // Decisions that changed the counts, per phase.
  std::vector<int64_t> changes_per_phase;
};

// Runs the phases from base's n_attn, n_ffn (within the bounds). Errors: the base configuration's
// or the options' validation, an empty phase list.
Result<AutoscaleRun> simulate_autoscale(const SimConfig& base, const std::vector<AutoscalePhase>& phases,
                                        const AutoscaleOptions& opt);

}  // namespace afd::plan
