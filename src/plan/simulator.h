// Discrete-event simulator of an xA-yF AFD bundle (the A/F ratio paper, §5.1): x attention instances,
// each holding n_microbatches micro-batches of `batch` request slots, feed y FFN instances
// that work as one group. Per decode step and layer a micro-batch goes
//   attention (its instance, FIFO) -> A->F transfer (its instance's link) -> barrier (the
//   same micro-batch index of every live instance has arrived) -> FFN (FIFO over groups)
//   -> F->A transfer -> next layer, or, after the last layer, the end of the step.
// Latencies come from a LatencyProfile, split evenly over layers: attention t_A(T)/L with T
// the micro-batch's token load (eq. 1), FFN t_F(n/y)/L with n the group's requests, each
// transfer direction t_C(B_active)/(2L). With full_duplex = false both directions share one
// link per instance (the round trip of eq. 4); with true they do not contend (the Step-3 paper, §7.1).
// Continuous batching: at the end of a step, finished requests leave and their slots are
// refilled at once from one global FCFS stream of x * requests_per_attn requests.
// A request has prefill length s and decode length D; it occupies its slot for D steps
// (load s + i at its i-th step) and produces one token per step; D = 0 finishes at
// admission. With an expert model (experts.n_experts > 0, plan/expert_load.h), the FFN of a
// group at layer l takes t_F(imbalance_l * n/y)/L instead: the most-loaded FFN worker sets the
// barrier (layer l uses expert profile l % min(L, 64)). Single-threaded and deterministic: same
// config, same bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "plan/expert_load.h"
#include "plan/latency_profile.h"

namespace afd::plan {

enum class LengthDistKind { fixed, geometric, uniform };
const char* length_dist_name(LengthDistKind k);
Result<LengthDistKind> parse_length_dist(const std::string& name);

struct LengthDist {
  LengthDistKind kind = LengthDistKind::geometric;
  double mean = 0;
  // uniform: integers in [round(mean*(1-spread)), round(mean*(1+spread))], spread in [0,1].
  double spread = 1.0;
};

struct SimConfig {
  int64_t n_attn = 1;             // x
  int64_t n_ffn = 1;              // y
  int64_t batch = 256;            // B: slots per micro-batch
  int64_t n_microbatches = 2;     // micro-batches in flight per attention instance
  int64_t n_layers = 1;           // layers per decode step (latencies are per step, split evenly)
  int64_t requests_per_attn = 10000;  // N per attention instance
  LengthDist prefill{LengthDistKind::fixed, 100, 1.0};
  LengthDist decode{LengthDistKind::geometric, 500, 1.0};
  LatencyProfile latency;
  bool full_duplex = false;
  double stable_fraction = 0.8;   // throughput over the first ceil(f * total) completions (eq. 21)
  uint64_t seed = 1;
  ExpertLoadConfig experts;       // off by default: the FFN instances share tokens evenly
  Status validate() const;
  double ratio() const { return static_cast<double>(n_attn) / static_cast<double>(n_ffn); }
};

struct SimResult {
  int64_t n_requests = 0;        // x * N
  int64_t n_completed = 0;
  int64_t n_stable = 0;          // ceil(stable_fraction * n_requests)
  double t_stable = 0;           // T_80%: time of the n_stable-th completion
  double tokens_stable = 0;      // Σ D_i over the first n_stable completions
  double t_end = 0;              // time of the last completion
  double throughput_per_instance = 0;  // eq. (21)
  double tpot = 0;               // eq. (22), over requests with D >= 1
  double eta_attn = 0;           // eq. (23) over [0, T_80%]
  double eta_ffn = 0;
  double total_tokens = 0;
  double mean_token_load = 0;    // mean T over all attention executions (drain tail included)
  double mean_token_load_stable = 0;  // mean T over executions started before T_80%
  // Tokens actually produced by T_80% (in-flight requests included), and the rate they give:
  // eq. (21) counts only completed requests, which under-counts by the in-flight work.
  double tokens_generated_stable = 0;
  double generated_throughput_per_instance = 0;
  // What a deployment can measure per decode step, means over the executions started before
  // T_80% (the autoscaling controller's inputs, plan/autoscale.h), in the profile's time unit:
  // an attention micro-batch's time t_A(T) and its active requests, an FFN execution's time
  // (the group's, per step) and tokens per FFN instance, a micro-batch's A->F->A transfer time.
  double step_attn_time = 0, step_active = 0;
  double step_ffn_time = 0, step_ffn_tokens = 0;
  double step_comm_time = 0;
  int64_t events = 0;            // timed events processed
  int64_t steps = 0;             // micro-batch decode steps completed
  // FFN max/mean worker load (expert model), mean and max over the layers; 1 when off.
  double ffn_imbalance_mean = 1.0;
  double ffn_imbalance_max = 1.0;
};

Result<SimResult> simulate(const SimConfig& cfg);

}  // namespace afd::plan
