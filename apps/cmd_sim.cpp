// afd sim: the discrete-event simulator of an xA-yF bundle (plan/simulator.h) over a sweep of
// A/F ratios, beside the theory's numbers for the same workload; optionally with expert load
// (plan/expert_load.h): a Zipf expert popularity and the contiguous or an EPLB placement.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/thread_pool.h"
#include "plan/ratio_theory.h"
#include "plan/sim_sweep.h"
#include "plan/svg_plot.h"
#include "plan_cli.h"

namespace afd::cli {

using nlohmann::json;
using namespace afd::plan;

namespace {

json experts_json(const ExpertLoadConfig& e) {
  if (!e.enabled()) return {{"n_experts", 0}};
  return {{"n_experts", e.n_experts}, {"top_k", e.top_k}, {"zipf_s", e.zipf_s},
          {"placement", expert_placement_name(e.placement)}, {"redundant", e.redundant},
          {"window_tokens", e.window_tokens}};
}

}  // namespace

void register_sim(CLI::App& app) {
  auto* cmd = app.add_subcommand("sim", "Discrete-event simulator of an xA-yF AFD bundle (A/F ratio paper §5)");
  auto w = std::make_shared<WorkloadArgs>();
  auto ratios = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"1", "2", "4", "8", "16", "24", "32"});
  auto seed = std::make_shared<uint64_t>(1);
  auto prefill_dist = std::make_shared<std::string>("fixed");
  auto decode_dist = std::make_shared<std::string>("geometric");
  auto spread = std::make_shared<double>(1.0);
  auto mbs = std::make_shared<int64_t>(2);
  auto layers = std::make_shared<int64_t>(1);
  auto duplex = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(0);
  auto as_json = std::make_shared<bool>(false);
  auto plot = std::make_shared<std::string>();
  auto experts = std::make_shared<ExpertLoadConfig>();
  auto eplb = std::make_shared<bool>(false);
  add_workload_args(cmd, w.get());
  cmd->add_option("--ratio", *ratios, "A/F ratios: r (8, 3.5 = 7A-2F) or x:y (comma list)")->delimiter(',');
  cmd->add_option("--seed", *seed, "random seed (same seed, same bits)");
  cmd->add_option("--prefill-dist", *prefill_dist, "fixed | uniform | geometric");
  cmd->add_option("--decode-dist", *decode_dist, "geometric | fixed | uniform");
  cmd->add_option("--uniform-spread", *spread, "uniform: lengths in mean*(1 -/+ spread)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--microbatches", *mbs, "micro-batches in flight per attention instance")->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--layers", *layers, "layers per step (latencies split evenly)")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_flag("--full-duplex", *duplex, "A->F and F->A transfers do not share the link");
  cmd->add_option("--threads", *threads, "threads for the sweep (0 = all cores)")->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", *as_json, "JSON output");
  cmd->add_option("--plot", *plot, "write an SVG of throughput and idle ratios vs r");
  cmd->add_option("--experts", experts->n_experts, "routed experts per MoE layer (0 = FFN workers share tokens evenly)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  auto* top_k = cmd->add_option("--top-k", experts->top_k, "distinct experts per token (with --experts)")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  auto* zipf = cmd->add_option("--expert-zipf", experts->zipf_s, "expert popularity 1/rank^s (with --experts)")
                   ->capture_default_str()
                   ->check(CLI::Range(0.0, 8.0));
  auto* eplb_flag = cmd->add_flag("--eplb", *eplb, "EPLB placement instead of the contiguous one (with --experts)");
  auto* redundant = cmd->add_option("--eplb-redundant", experts->redundant,
                                    "redundant expert replicas per layer (with --eplb)")
                        ->capture_default_str()
                        ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  auto* window = cmd->add_option("--eplb-window", experts->window_tokens,
                                 "tokens sampled per layer to plan from (with --eplb)")
                     ->capture_default_str()
                     ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  auto scale = std::make_shared<SimAutoscaleArgs>();
  add_sim_autoscale_args(cmd, scale.get());
  cmd->callback([=] {
    if (w->requests < 1) fail("sim: --requests must be >= 1");
    if (experts->n_experts == 0) {
      for (const auto* o : {top_k, zipf, eplb_flag, redundant, window})
        if (o->count() > 0) fail("sim: " + o->get_name() + " needs --experts");
    } else if (!*eplb) {
      for (const auto* o : {redundant, window})
        if (o->count() > 0) fail("sim: " + o->get_name() + " needs --eplb");
    }
    SimConfig c;
    c.batch = w->batch;
    c.requests_per_attn = w->requests;
    c.n_microbatches = *mbs;
    c.n_layers = *layers;
    c.full_duplex = *duplex;
    c.seed = *seed;
    c.latency = load_profile(*w);
    c.prefill = {unwrap(parse_length_dist(*prefill_dist)), w->mu_prefill, *spread};
    c.decode = {unwrap(parse_length_dist(*decode_dist)), w->mu_decode, *spread};
    c.experts = *experts;
    c.experts.placement = *eplb ? ExpertPlacementKind::eplb : ExpertPlacementKind::contiguous;
    std::vector<RatioSpec> specs;
    for (const auto& r : *ratios) specs.push_back(unwrap(parse_ratio_spec(r)));
    if (specs.empty()) fail("sim: no --ratio");
    for (const RatioSpec& r : specs) {  // y varies over the sweep: the expert options are checked per point
      SimConfig point = c;
      point.n_attn = r.n_attn;
      point.n_ffn = r.n_ffn;
      const std::string name = std::to_string(r.n_attn) + ":" + std::to_string(r.n_ffn);
      check(point.validate().with_context("sim --ratio " + name + " (y = " + std::to_string(r.n_ffn) + ")"));
    }
    if (!scale->phases.empty()) {
      if (specs.size() != 1) fail("sim --autoscale: give the starting counts as one --ratio x:y");
      if (!plot->empty()) fail("sim --autoscale: --plot draws a ratio sweep, not an autoscaling run");
      c.n_attn = specs[0].n_attn;
      c.n_ffn = specs[0].n_ffn;
      run_sim_autoscale(c, *scale, *as_json);
      return;
    }
    ThreadPool pool(*threads);
    const auto pts = unwrap(run_ratio_sweep(c, specs, &pool));
    const RatioResult th = optimal_ratio(c.latency, workload_of(c));
    const double r_pipe = pipelined_optimal_ratio(c);
    size_t best = 0;
    for (size_t i = 0; i < pts.size(); ++i)
      if (pts[i].sim.throughput_per_instance > pts[best].sim.throughput_per_instance) best = i;
    if (!plot->empty()) write_text_file(*plot, ratio_sweep_svg(pts, c, th.r_star), "plot");
    if (*as_json) {
      json arr = json::array();
      for (const auto& p : pts) {
        const SimResult& s = p.sim;
        arr.push_back({{"n_attn", p.spec.n_attn}, {"n_ffn", p.spec.n_ffn}, {"ratio", p.spec.ratio()},
                       {"sim", {{"throughput_per_instance", s.throughput_per_instance},
                                {"generated_throughput_per_instance", s.generated_throughput_per_instance},
                                {"tpot", s.tpot}, {"eta_attn", s.eta_attn}, {"eta_ffn", s.eta_ffn},
                                {"t_stable", s.t_stable}, {"t_end", s.t_end}, {"n_requests", s.n_requests},
                                {"n_stable", s.n_stable}, {"tokens_stable", s.tokens_stable},
                                {"mean_token_load_stable", s.mean_token_load_stable}, {"events", s.events},
                                {"steps", s.steps}, {"ffn_max_over_mean", s.ffn_imbalance_mean},
                                {"ffn_max_over_mean_worst_layer", s.ffn_imbalance_max}}},
                       {"theory", {{"throughput_per_instance", p.theory.throughput_per_instance},
                                   {"pipelined_throughput_per_instance", p.theory.pipelined_throughput},
                                   {"cycle", p.theory.cycle}, {"tpot", p.theory.tpot},
                                   {"eta_attn", p.theory.eta_attn}, {"eta_ffn", p.theory.eta_ffn}}}});
      }
      print_json({{"config", {{"batch", c.batch}, {"mu_prefill", c.prefill.mean}, {"mu_decode", c.decode.mean},
                              {"requests_per_attn", c.requests_per_attn}, {"prefill_dist", length_dist_name(c.prefill.kind)},
                              {"decode_dist", length_dist_name(c.decode.kind)}, {"microbatches", c.n_microbatches},
                              {"layers", c.n_layers}, {"full_duplex", c.full_duplex}, {"seed", c.seed},
                              {"profile", profile_json(c.latency)}, {"experts", experts_json(c.experts)}}},
                  {"theory", {{"r_star", th.r_star}, {"regime", regime_name(th.regime)},
                              {"throughput_star", th.throughput_star}, {"r_pipelined", r_pipe}}},
                  {"best_simulated_ratio", pts[best].spec.ratio()},
                  {"points", arr}});
      return;
    }
    std::printf("AFD bundle simulation: B = %lld, mu_P = %g (%s), mu_D = %g (%s), N = %lld per attention instance, "
                "%lld micro-batches, %lld layer(s), seed %llu, time unit %s\n",
                static_cast<long long>(c.batch), c.prefill.mean, length_dist_name(c.prefill.kind), c.decode.mean,
                length_dist_name(c.decode.kind), static_cast<long long>(c.requests_per_attn),
                static_cast<long long>(c.n_microbatches), static_cast<long long>(c.n_layers),
                static_cast<unsigned long long>(c.seed), c.latency.time_unit.c_str());
    const bool with_experts = c.experts.enabled();
    if (with_experts) {
      std::printf("experts: E = %lld, top-%lld, Zipf s = %g, %s placement", static_cast<long long>(c.experts.n_experts),
                  static_cast<long long>(c.experts.top_k), c.experts.zipf_s,
                  expert_placement_name(c.experts.placement));
      if (c.experts.placement == ExpertPlacementKind::eplb)
        std::printf(" (R = %lld redundant, planned from %lld sampled tokens per layer)",
                    static_cast<long long>(c.experts.redundant), static_cast<long long>(c.experts.window_tokens));
      std::printf("; FFN max/mean: mean and worst over layers (theory columns assume 1)\n");
    }
    std::printf("%-8s %10s %10s %9s %9s %7s %7s %7s %7s %11s", "xA-yF", "thr sim", "thr eq6", "TPOT sim", "TPOT th",
                "etaA s", "etaA th", "etaF s", "etaF th", "events");
    if (with_experts) std::printf(" %8s %8s", "Fmax/mn", "worst");
    std::printf("\n");
    for (const auto& p : pts) {
      char name[32];
      std::snprintf(name, sizeof name, "%lldA-%lldF", static_cast<long long>(p.spec.n_attn), static_cast<long long>(p.spec.n_ffn));
      std::printf("%-8s %10.5g %10.5g %9.5g %9.5g %7.3f %7.3f %7.3f %7.3f %11lld", name,
                  p.sim.throughput_per_instance, p.theory.throughput_per_instance, p.sim.tpot, p.theory.tpot,
                  p.sim.eta_attn, p.theory.eta_attn, p.sim.eta_ffn, p.theory.eta_ffn, static_cast<long long>(p.sim.events));
      if (with_experts) std::printf(" %8.4f %8.4f", p.sim.ffn_imbalance_mean, p.sim.ffn_imbalance_max);
      std::printf("\n");
    }
    std::printf("theory r* = %.3f (%s); pipelined optimum (%lld micro-batches, comm on the loop) = %.3f; "
                "best simulated ratio = %.3g\n",
                th.r_star, regime_name(th.regime), static_cast<long long>(c.n_microbatches), r_pipe,
                pts[best].spec.ratio());
    if (!plot->empty()) std::printf("plot written to %s\n", plot->c_str());
  });
}

}  // namespace afd::cli
