#include "plan_cli.h"

#include <cstdio>
#include <fstream>

namespace afd::cli {

void fail(const std::string& msg) {
  std::fprintf(stderr, "afd: %s\n", msg.c_str());
  throw CLI::RuntimeError(1);
}

void check(const Status& s) {
  if (!s.is_ok()) fail(s.to_string());
}

void print_json(const nlohmann::json& j) { std::printf("%s\n", j.dump(2).c_str()); }

void write_text_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(std::string("cannot write ") + what + " '" + path + "'");
  f << text;
  if (!f) fail("write failed: '" + path + "'");
}

void add_workload_args(CLI::App* cmd, WorkloadArgs* w) {
  cmd->add_option("--batch", w->batch, "B: requests per attention micro-batch")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--mu-prefill", w->mu_prefill, "mean prefill length μ_P (tokens)")->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--mu-decode", w->mu_decode, "mean decode length μ_D (tokens)")->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--requests", w->requests, "N: requests per attention instance (0 = N -> infinity for plan ratio)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  cmd->add_option("--profile", w->profile, "latency profile JSON (afd calibrate); default A/F ratio paper Table 2");
}

plan::LatencyProfile load_profile(const WorkloadArgs& w) {
  if (w.profile.empty()) return plan::af_ratio_paper_profile();
  return unwrap(plan::load_profile_file(w.profile));
}

nlohmann::json profile_json(const plan::LatencyProfile& p) { return nlohmann::json::parse(plan::profile_to_json(p)); }

}  // namespace afd::cli
