// What afd plan, afd sim and afd calibrate share: failing with a message (exit status 1),
// printing JSON, and the workload options and latency profile of plan ratio and sim.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "plan/autoscale.h"
#include "plan/latency_profile.h"
#include "plan/simulator.h"

namespace afd::cli {

// Prints "afd: <msg>" to stderr and ends the command with exit status 1.
[[noreturn]] void fail(const std::string& msg);

template <class T>
T unwrap(Result<T> r) {
  if (!r.ok()) fail(r.status().to_string());
  return std::move(r).value();
}

void check(const Status& s);
void print_json(const nlohmann::json& j);
// Writes `text` to `path` (replacing it); fails with "cannot write <what> '<path>'" or
// "write failed: '<path>'".
void write_text_file(const std::string& path, const std::string& text, const char* what);

// plan ratio's and sim's workload: batch, mean prefill / decode lengths, requests, profile file.
struct WorkloadArgs {
  int64_t batch = 256;
  double mu_prefill = 100, mu_decode = 500;
  int64_t requests = 10000;
  std::string profile;
};
void add_workload_args(CLI::App* cmd, WorkloadArgs* w);
// The --profile file, or A/F ratio paper Table 2's profile when none is given.
plan::LatencyProfile load_profile(const WorkloadArgs& w);
nlohmann::json profile_json(const plan::LatencyProfile& p);

// afd plan eplb (cmd_plan_eplb.cpp), a subcommand of afd plan.
void register_plan_eplb(CLI::App* plan);

// afd sim --autoscale (cmd_sim_autoscale.cpp): the controller's options, and its run from the
// start configuration (the one --ratio).
struct SimAutoscaleArgs {
  std::string phases;  // empty: no autoscaling
  plan::AutoscaleOptions opt;
};
void add_sim_autoscale_args(CLI::App* cmd, SimAutoscaleArgs* a);
void run_sim_autoscale(const plan::SimConfig& start, const SimAutoscaleArgs& a, bool as_json);

}  // namespace afd::cli
