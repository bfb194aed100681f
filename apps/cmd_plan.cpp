// afd plan cost|sparsity|hardware|ratio, afd sim, afd calibrate: thin CLI over src/plan.
// Every number printed comes from the plan module's functions of the inputs given here.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "engine_flags.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "plan/accelerator.h"
#include "plan/calibrate.h"
#include "plan/cost_model.h"
#include "plan/hardware_fit.h"
#include "plan/hf_model_spec.h"
#include "plan/model_presets.h"
#include "plan/ratio_theory.h"
#include "plan/sim_sweep.h"
#include "plan/svg_plot.h"

namespace afd::cli {
namespace {

using nlohmann::json;
using namespace afd::plan;

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "afd: %s\n", msg.c_str());
  throw CLI::RuntimeError(1);
}

template <class T>
T unwrap(Result<T> r) {
  if (!r.ok()) fail(r.status().to_string());
  return std::move(r).value();
}

void check(const Status& s) {
  if (!s.is_ok()) fail(s.to_string());
}

// ---- shared option groups ---------------------------------------------------------------

struct ModelArgs {
  std::vector<std::string> presets;
  std::vector<std::string> configs;
  double kv_bytes = 1.0;
  CLI::Option* models_opt = nullptr;
};

void add_model_args(CLI::App* cmd, ModelArgs* a, const char* default_models) {
  a->presets = CLI::detail::split(default_models, ',');
  a->models_opt = cmd->add_option("--models,--model", a->presets, "model presets (comma list); 'all' = every seeds/001 model")
      ->delimiter(',');
  cmd->add_option("--model-config", a->configs, "Hugging Face config.json (file or directory); repeatable");
  cmd->add_option("--kv-bytes", a->kv_bytes, "KV element bytes for --model-config models (1 = FP8)")
      ->check(CLI::Range(0.125, 8.0));
}

std::vector<ModelSpec> resolve_models(const ModelArgs& a) {
  std::vector<ModelSpec> out;
  // --model-config without --models replaces the default preset list.
  const bool use_presets = a.configs.empty() || (a.models_opt != nullptr && a.models_opt->count() > 0);
  for (const auto& name : use_presets ? a.presets : std::vector<std::string>{}) {
    if (name == "all") {
      for (auto& m : model_presets()) out.push_back(m);
      continue;
    }
    out.push_back(unwrap(find_model_preset(name)));
  }
  HfSpecOptions opt;
  opt.kv_elem_bytes = a.kv_bytes;
  for (const auto& p : a.configs) out.push_back(unwrap(load_hf_model_spec(p, opt)));
  if (out.empty()) fail("no model given (--models or --model-config)");
  return out;
}

struct HwArgs {
  std::vector<std::string> names;
  std::vector<std::string> prices;  // id=usd
};

void add_hw_args(CLI::App* cmd, HwArgs* a, const char* defaults) {
  a->names = CLI::detail::split(defaults, ',');
  cmd->add_option("--hardware", a->names, "accelerator presets (h800,h20,a800,910b,h100,h200,l20,l4) or JSON files")
      ->delimiter(',');
  cmd->add_option("--price", a->prices, "override a price: ID=USD_PER_CARD_HOUR (repeatable)");
}

std::vector<Accelerator> resolve_hw(const HwArgs& a) {
  auto accs = unwrap(resolve_accelerators(a.names));
  for (const auto& p : a.prices) {
    const auto eq = p.find('=');
    if (eq == std::string::npos) fail("--price expects ID=USD, got '" + p + "'");
    const std::string id = p.substr(0, eq);
    char* end = nullptr;
    const double usd = std::strtod(p.c_str() + eq + 1, &end);
    if (*end != '\0' || !(usd > 0) || !std::isfinite(usd)) fail("--price: bad price in '" + p + "'");
    bool found = false;
    for (auto& acc : accs)
      if (acc.id == id) acc.usd_per_hour = usd, found = true;
    if (!found) fail("--price: accelerator '" + id + "' is not in --hardware");
  }
  return accs;
}

// Options of the subcommands that check one pipeline: models, accelerators, TPOT target and stages.
struct PipelineArgs {
  ModelArgs models;
  HwArgs hw;
  double tpot_ms = 50.0;
  int stages = 3;
  bool as_json = false;
};

struct Pipeline {
  std::vector<ModelSpec> models;
  std::vector<Accelerator> accs;
  PipelineSpec spec;
};

Pipeline resolve_pipeline(const PipelineArgs& a) {
  return {resolve_models(a.models), resolve_hw(a.hw), PipelineSpec{a.tpot_ms / 1000.0, a.stages}};
}

void add_pipeline_args(CLI::App* cmd, PipelineArgs* a, const char* default_hw, const char* stages_help) {
  add_model_args(cmd, &a->models, "step3");
  add_hw_args(cmd, &a->hw, default_hw);
  cmd->add_option("--tpot-ms", a->tpot_ms, "TPOT target (ms)")->check(CLI::Range(0.01, 1e6));
  cmd->add_option("--stages", a->stages, stages_help)->check(CLI::Range(1, 16));
}

std::string sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}
std::string usd(const std::optional<double>& v) {
  if (!v) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, *v >= 0.001 || *v == 0 ? "%.3f" : "%.2e", *v);
  return b;
}
json opt_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

void print_json(const json& j) { std::printf("%s\n", j.dump(2).c_str()); }

// ---- plan cost ----------------------------------------------------------------------------

void register_cost(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("cost", "Per-token decode work and USD per 1M tokens (seeds/001 §4, Tables 2-6)");
  auto models = std::make_shared<ModelArgs>();
  auto hw = std::make_shared<HwArgs>();
  auto contexts = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{8192, 32768});
  auto as_json = std::make_shared<bool>(false);
  add_model_args(cmd, models.get(), "step3,deepseek-v3,qwen3-235b-a22b");
  add_hw_args(cmd, hw.get(), "h800,h20,a800,910b");
  cmd->add_option("--context", *contexts, "context lengths in tokens (comma list)")->delimiter(',')->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_flag("--json", *as_json, "JSON output");
  cmd->callback([=] {
    const auto ms = resolve_models(*models);
    const auto accs = resolve_hw(*hw);
    json out = json::array();
    for (int64_t ctx : *contexts) {
      if (!*as_json) {
        std::printf("== context %lld tokens: work per decoded token ==\n", static_cast<long long>(ctx));
        std::printf("%-22s %12s %12s %12s %12s %10s\n", "model", "KV bytes", "attn FLOPs", "linear FLOPs",
                    "FFN FLOPs", "attn AI");
      }
      std::vector<CostRow> rows;
      for (const auto& m : ms) rows.push_back(cost_row(m, ctx, accs));
      for (const auto& r : rows) {
        const TokenCost& t = r.token;
        if (!*as_json)
          std::printf("%-22s %12s %12s %12s %12s %10.1f\n", r.display.c_str(), sci(t.kv_bytes).c_str(),
                      sci(t.attn_flops).c_str(), sci(t.linear_flops).c_str(), sci(t.ffn_flops).c_str(),
                      t.attn_intensity());
      }
      if (!*as_json) {
        std::printf("\nUSD per 1M decoded tokens (attention | FFN):\n%-22s", "model");
        for (const auto& a : accs) std::printf(" %8s", a.id.c_str());
        std::printf(" |");
        for (const auto& a : accs) std::printf(" %8s", a.id.c_str());
        std::printf("   cheapest AFD (A+F)           cheapest single\n");
      }
      for (const auto& r : rows) {
        if (*as_json) {
          json per = json::object();
          for (size_t i = 0; i < accs.size(); ++i)
            per[accs[i].id] = {{"attention_usd_per_1m", opt_json(r.attn_usd_per_m[i])},
                               {"ffn_usd_per_1m", opt_json(r.ffn_usd_per_m[i])}};
          out.push_back({{"model", r.model},
                         {"display", r.display},
                         {"context", ctx},
                         {"kv_bytes", r.token.kv_bytes},
                         {"attention_flops", r.token.attn_flops},
                         {"linear_flops", r.token.linear_flops},
                         {"ffn_flops", r.token.ffn_flops},
                         {"attention_intensity", r.token.attn_intensity()},
                         {"cost", per},
                         {"afd", {{"attention", r.afd_attn}, {"ffn", r.afd_ffn}, {"usd_per_1m", opt_json(r.afd_usd_per_m)}}},
                         {"single", {{"accelerator", r.single}, {"usd_per_1m", opt_json(r.single_usd_per_m)}}}});
          continue;
        }
        std::printf("%-22s", r.display.c_str());
        for (size_t i = 0; i < accs.size(); ++i) std::printf(" %8s", usd(r.attn_usd_per_m[i]).c_str());
        std::printf(" |");
        for (size_t i = 0; i < accs.size(); ++i) std::printf(" %8s", usd(r.ffn_usd_per_m[i]).c_str());
        if (r.afd_usd_per_m)
          std::printf("   %s (%s + %s)%*s %s (%s)\n", usd(r.afd_usd_per_m).c_str(), r.afd_attn.c_str(), r.afd_ffn.c_str(),
                      static_cast<int>(std::max<size_t>(1, 18 - r.afd_attn.size() - r.afd_ffn.size())), "",
                      usd(r.single_usd_per_m).c_str(), r.single.c_str());
        else
          std::printf("   n/a (no priced accelerator)\n");
      }
      if (!*as_json) std::printf("\n");
    }
    if (*as_json) print_json(out);
  });
}

// ---- plan sparsity ------------------------------------------------------------------------

void register_sparsity(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("sparsity", "Minimum MoE sparsity per accelerator (seeds/001 §5.4, Table 7)");
  auto args = std::make_shared<PipelineArgs>();
  auto nic_eff = std::make_shared<double>(1.0);
  add_pipeline_args(cmd, args.get(), "h800,h20,a800,910b", "pipeline stages (3 or 4)");
  cmd->add_option("--nic-efficiency", *nic_eff, "achieved / nominal NIC bandwidth (0.8 = 40 of 50 GB/s)")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_flag("--json", args->as_json, "JSON output");
  cmd->callback([=] {
    const auto [ms, accs, p] = resolve_pipeline(*args);
    json out = json::array();
    for (const auto& m : ms) {
      if (!args->as_json)
        std::printf("%s (H = %lld, L = %lld, sparsity %.4f): S >= H*FLOPs*L / (Net*BW*%.2f ms)\n", m.display.c_str(),
                    static_cast<long long>(m.hidden), static_cast<long long>(m.n_layers), m.moe_sparsity(),
                    p.stage_s() * 2.0 / 3.0 * 1e3);
      if (!args->as_json)
        std::printf("  %-8s %14s %12s %14s %8s\n", "card", "server NIC GB/s", "min S", "top-k needed", "meets");
      for (const auto& a : accs) {
        const SparsityResult s = min_moe_sparsity(a, m, p, *nic_eff);
        if (args->as_json) {
          out.push_back({{"model", m.id}, {"accelerator", a.id}, {"net_bw_server", s.net_bw_server},
                         {"comm_budget_s", s.comm_budget_s}, {"min_sparsity", s.min_sparsity},
                         {"model_sparsity", s.model_sparsity}, {"min_routed_top_k", s.min_routed_top_k},
                         {"model_ok", s.model_ok}});
        } else {
          std::printf("  %-8s %14.0f %12.4f %14.1f %8s\n", a.id.c_str(), s.net_bw_server / 1e9, s.min_sparsity,
                      std::max(0.0, s.min_routed_top_k), s.model_ok ? "yes" : "no");
        }
      }
    }
    if (args->as_json) print_json(out);
  });
}

// ---- plan hardware ------------------------------------------------------------------------

void register_hardware(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("hardware", "Per-layer budget check and card counts for AFD (seeds/001 §6)");
  auto args = std::make_shared<PipelineArgs>();
  auto tp = std::make_shared<int>(8);
  auto avg_ctx = std::make_shared<int64_t>(8192);
  auto util = std::make_shared<double>(0.5);
  auto batch = std::make_shared<int64_t>(0);
  add_pipeline_args(cmd, args.get(), "l20,l4", "pipeline stages: 3 (A/comm/F) or 4 (A/comm/F/comm)");
  cmd->add_option("--o-proj-tp", *tp, "tensor parallelism of o_proj on attention cards (others replicated)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--avg-context", *avg_ctx, "average context per request (tokens)")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--ffn-mem-util", *util, "fraction of memory bandwidth the FFN spends on weights")->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--batch", *batch, "total concurrent requests: also report attention cards needed")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_flag("--json", args->as_json, "JSON output");
  cmd->callback([=] {
    const auto [ms, accs, p] = resolve_pipeline(*args);
    json out = json::array();
    for (const auto& m : ms) {
      for (const auto& a : accs) {
        const AttentionFit af = attention_fit(a, m, p, *tp, *avg_ctx,
                                              *batch > 0 ? std::optional<int64_t>(*batch) : std::nullopt);
        const FfnFit ff = ffn_fit(a, m, p, *util);
        if (args->as_json) {
          json j = {{"model", m.id}, {"accelerator", a.id}, {"tpot_s", p.tpot_s}, {"stages", p.n_stages},
                    {"attention", {{"layer_budget_s", af.layer_budget_s}, {"bytes_in_budget", af.bytes_in_budget},
                                   {"linear_bytes_per_card", af.linear_bytes_per_card},
                                   {"linear_time_fraction", af.linear_time_fraction},
                                   {"kv_bytes_budget", af.kv_bytes_budget}, {"kv_bytes_per_token", af.kv_bytes_per_token},
                                   {"max_context_tokens", af.max_context_tokens}, {"max_batch", af.max_batch},
                                   {"feasible", af.feasible}}},
                    {"ffn", {{"bytes_per_layer_card", ff.bytes_per_layer_card}, {"bytes_per_card", ff.bytes_per_card},
                             {"bytes_per_server", ff.bytes_per_server}, {"ffn_weight_bytes", ff.ffn_weight_bytes},
                             {"cards_exact", ff.cards_exact}, {"servers", ff.servers}, {"cards", ff.cards},
                             {"fits_memory", ff.fits_memory}}}};
          if (af.cards_for_batch) j["attention"]["cards_for_batch"] = *af.cards_for_batch;
          out.push_back(j);
          continue;
        }
        std::printf("%s on %s: %d-stage pipeline at %.1f ms TPOT -> %.1f us per layer per stage\n", m.display.c_str(),
                    a.display.c_str(), p.n_stages, p.tpot_s * 1e3, af.layer_budget_s * 1e6);
        std::printf("  attention: %.0f MB readable per layer; projections %.1f MB (%.0f%% of the budget); KV budget %.1f MB\n",
                    af.bytes_in_budget / 1e6, af.linear_bytes_per_card / 1e6, af.linear_time_fraction * 100,
                    af.kv_bytes_budget / 1e6);
        if (af.feasible) {
          std::printf("             KV %.0f B/token/layer -> at most %.0fK context tokens per card, batch <= %.1f at %lld-token context\n",
                      af.kv_bytes_per_token, af.max_context_tokens / 1e3, af.max_batch, static_cast<long long>(*avg_ctx));
          if (af.cards_for_batch)
            std::printf("             %lld concurrent requests need %lld attention cards\n", static_cast<long long>(*batch),
                        static_cast<long long>(*af.cards_for_batch));
        } else {
          std::printf("             NOT feasible: not even one %lld-token request fits the per-layer budget\n",
                      static_cast<long long>(*avg_ctx));
        }
        std::printf("  FFN: %.0f MB weights per layer per card at %.0f%% bandwidth, %.2f GB per card, %.1f GB per %d-card server\n",
                    ff.bytes_per_layer_card / 1e6, *util * 100, ff.bytes_per_card / 1e9, ff.bytes_per_server / 1e9,
                    a.cards_per_server);
        std::printf("       %.0f GB of FFN weights -> %.1f cards exact, %lld servers = %lld cards%s\n\n",
                    ff.ffn_weight_bytes / 1e9, ff.cards_exact, static_cast<long long>(ff.servers),
                    static_cast<long long>(ff.cards), ff.fits_memory ? "" : " (weights exceed card memory!)");
      }
    }
    if (args->as_json) print_json(out);
  });
}

// ---- plan ratio / sim shared workload args --------------------------------------------------

struct WorkloadArgs {
  int64_t batch = 256;
  double mu_prefill = 100, mu_decode = 500;
  int64_t requests = 10000;
  std::string profile;
};

void add_workload_args(CLI::App* cmd, WorkloadArgs* w) {
  cmd->add_option("--batch", w->batch, "B: requests per attention micro-batch")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--mu-prefill", w->mu_prefill, "mean prefill length μ_P (tokens)")->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--mu-decode", w->mu_decode, "mean decode length μ_D (tokens)")->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--requests", w->requests, "N: requests per attention instance (0 = N -> infinity for plan ratio)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  cmd->add_option("--profile", w->profile, "latency profile JSON (afd calibrate); default seeds/003 Table 2");
}

LatencyProfile load_profile(const WorkloadArgs& w) {
  if (w.profile.empty()) return seeds003_profile();
  return unwrap(load_profile_file(w.profile));
}

json profile_json(const LatencyProfile& p) { return json::parse(profile_to_json(p)); }

void register_ratio(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("ratio", "Optimal A/F ratio r* (seeds/003 Theorem 4.4)");
  auto w = std::make_shared<WorkloadArgs>();
  auto as_json = std::make_shared<bool>(false);
  add_workload_args(cmd, w.get());
  cmd->add_flag("--json", *as_json, "JSON output");
  cmd->callback([=] {
    const LatencyProfile lat = load_profile(*w);
    RatioWorkload wl{w->batch, w->mu_prefill, w->mu_decode, std::nullopt};
    if (w->requests > 0) wl.n_requests = w->requests;
    const RatioResult r = optimal_ratio(lat, wl);
    if (*as_json) {
      print_json({{"batch", wl.batch}, {"mu_prefill", wl.mu_prefill}, {"mu_decode", wl.mu_decode},
                  {"requests", w->requests > 0 ? json(w->requests) : json(nullptr)}, {"p", wl.p()},
                  {"t_bar", r.t_bar}, {"t_bar_limit", static_cast<double>(wl.batch) * (wl.mu_prefill + wl.mu_decode)},
                  {"t_attention", r.t_attn}, {"t_comm", r.t_comm}, {"r_attention", r.r_attn}, {"r_comm", r.r_comm},
                  {"r_peak", r.r_peak}, {"r_star", r.r_star}, {"regime", regime_name(r.regime)},
                  {"throughput_per_instance", r.throughput_star}, {"profile", profile_json(lat)}});
      return;
    }
    std::printf("profile: %s (time unit: %s)\n", lat.source.c_str(), lat.time_unit.c_str());
    std::printf("  t_A = %.6g T + %.6g   t_F = %.6g n + %.6g   t_C = %.6g B + %.6g\n", lat.attention.alpha,
                lat.attention.beta, lat.ffn.alpha, lat.ffn.beta, lat.comm.alpha, lat.comm.beta);
    std::printf("workload: B = %lld, mu_P = %g, mu_D = %g (p = %.6g), N = %s\n", static_cast<long long>(wl.batch),
                wl.mu_prefill, wl.mu_decode, wl.p(), w->requests > 0 ? std::to_string(w->requests).c_str() : "inf");
    std::printf("horizon-average token load T_bar = %.1f (N -> inf: %.1f)\n", r.t_bar,
                static_cast<double>(wl.batch) * (wl.mu_prefill + wl.mu_decode));
    std::printf("t_A(T_bar) = %.4g, t_C(B) = %.4g\n", r.t_attn, r.t_comm);
    std::printf("r_A = %.3f  r_C = %.3f  r_peak = %.3f\n", r.r_attn, r.r_comm, r.r_peak);
    std::printf("r* = %.3f (%s), throughput per instance %.5g tokens per %s\n", r.r_star, regime_name(r.regime),
                r.throughput_star, lat.time_unit.c_str());
  });
}

// ---- sim ------------------------------------------------------------------------------------

void register_sim(CLI::App& app) {
  auto* cmd = app.add_subcommand("sim", "Discrete-event simulator of an xA-yF AFD bundle (seeds/003 §5)");
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
  cmd->callback([=] {
    if (w->requests < 1) fail("sim: --requests must be >= 1");
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
    std::vector<RatioSpec> specs;
    for (const auto& r : *ratios) specs.push_back(unwrap(parse_ratio_spec(r)));
    if (specs.empty()) fail("sim: no --ratio");
    check(c.validate());
    ThreadPool pool(*threads);
    const auto pts = unwrap(run_ratio_sweep(c, specs, &pool));
    const RatioResult th = optimal_ratio(c.latency, workload_of(c));
    const double r_pipe = pipelined_optimal_ratio(c);
    size_t best = 0;
    for (size_t i = 0; i < pts.size(); ++i)
      if (pts[i].sim.throughput_per_instance > pts[best].sim.throughput_per_instance) best = i;
    if (!plot->empty()) {
      std::ofstream f(*plot, std::ios::binary | std::ios::trunc);
      if (!f) fail("cannot write plot '" + *plot + "'");
      f << ratio_sweep_svg(pts, c, th.r_star);
      if (!f) fail("write failed: '" + *plot + "'");
    }
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
                                {"steps", s.steps}}},
                       {"theory", {{"throughput_per_instance", p.theory.throughput_per_instance},
                                   {"pipelined_throughput_per_instance", p.theory.pipelined_throughput},
                                   {"cycle", p.theory.cycle}, {"tpot", p.theory.tpot},
                                   {"eta_attn", p.theory.eta_attn}, {"eta_ffn", p.theory.eta_ffn}}}});
      }
      print_json({{"config", {{"batch", c.batch}, {"mu_prefill", c.prefill.mean}, {"mu_decode", c.decode.mean},
                              {"requests_per_attn", c.requests_per_attn}, {"prefill_dist", length_dist_name(c.prefill.kind)},
                              {"decode_dist", length_dist_name(c.decode.kind)}, {"microbatches", c.n_microbatches},
                              {"layers", c.n_layers}, {"full_duplex", c.full_duplex}, {"seed", c.seed},
                              {"profile", profile_json(c.latency)}}},
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
    std::printf("%-8s %10s %10s %9s %9s %7s %7s %7s %7s %11s\n", "xA-yF", "thr sim", "thr eq6", "TPOT sim", "TPOT th",
                "etaA s", "etaA th", "etaF s", "etaF th", "events");
    for (const auto& p : pts) {
      char name[32];
      std::snprintf(name, sizeof name, "%lldA-%lldF", static_cast<long long>(p.spec.n_attn), static_cast<long long>(p.spec.n_ffn));
      std::printf("%-8s %10.5g %10.5g %9.5g %9.5g %7.3f %7.3f %7.3f %7.3f %11lld\n", name,
                  p.sim.throughput_per_instance, p.theory.throughput_per_instance, p.sim.tpot, p.theory.tpot,
                  p.sim.eta_attn, p.theory.eta_attn, p.sim.eta_ffn, p.theory.eta_ffn, static_cast<long long>(p.sim.events));
    }
    std::printf("theory r* = %.3f (%s); pipelined optimum (%lld micro-batches, comm on the loop) = %.3f; "
                "best simulated ratio = %.3g\n",
                th.r_star, regime_name(th.regime), static_cast<long long>(c.n_microbatches), r_pipe,
                pts[best].spec.ratio());
    if (!plot->empty()) std::printf("plot written to %s\n", plot->c_str());
  });
}

// ---- calibrate ------------------------------------------------------------------------------

// Engine-backed StageSampler: one engine per (batch, context) point built on shared weights;
// each sequence gets `context` tokens of synthetic KV (Engine::fill_synthetic_context,
// no prefill compute) and every call times one decode step of the whole batch, after one
// untimed warm-up step. Stage times come from Engine::last_stage_times().
class EngineStageSampler {
 public:
  EngineStageSampler(EngineOptions opt, std::shared_ptr<const ModelWeights> w) : opt_(std::move(opt)), w_(std::move(w)) {}

  Result<StageSample> sample(int64_t batch, int64_t token_load) {
    const int64_t ctx = std::max<int64_t>(1, token_load / batch);
    if (!engine_ || batch != batch_ || ctx != ctx_) AFD_RETURN_IF_ERROR(rebuild(batch, ctx));
    Engine* pe = engine_.get();
    int64_t load = 0;
    for (int64_t id : seqs_) {
      if (!pe->can_append(id, 1)) return resource_exhausted("calibrate: KV full at batch " + std::to_string(batch));
      load += pe->sequence_length(id) + 1;
    }
    AFD_RETURN_IF_ERROR(step());
    const StageTimes t = pe->last_stage_times();
    StageSample s;
    s.batch = batch;
    s.token_load = load;
    s.ffn_tokens = batch;
    s.attention_s = t.attention_s;
    s.a2f_s = t.a2f_s;
    s.ffn_s = t.ffn_s;
    s.f2a_s = t.f2a_s;
    return s;
  }

 private:
  Status rebuild(int64_t batch, int64_t ctx) {
    engine_.reset();
    seqs_.clear();
    const ModelConfig& mc = w_->config;
    if (mc.max_position_embeddings > 0 && ctx + 64 > mc.max_position_embeddings)
      return out_of_range("calibrate: context " + std::to_string(ctx) + " exceeds max_position_embeddings " +
                          std::to_string(mc.max_position_embeddings));
    EngineOptions o = opt_;
    o.kv.max_seqs = batch;
    const int64_t blk = std::max<int64_t>(1, o.kv.block_size);
    o.kv.capacity_tokens = batch * ((ctx + 64 + blk - 1) / blk * blk);
    AFD_ASSIGN_OR_RETURN(engine_, make_engine(o, w_));
    Engine* pe = engine_.get();  // fill_synthetic_context: not_supported where an engine cannot
    for (int64_t i = 0; i < batch; ++i) {
      AFD_ASSIGN_OR_RETURN(int64_t id, pe->create_sequence());
      AFD_RETURN_IF_ERROR(pe->fill_synthetic_context(id, ctx));
      seqs_.push_back(id);
    }
    last_.assign(static_cast<size_t>(batch), 0);
    for (int64_t i = 0; i < batch; ++i) last_[i] = static_cast<int32_t>((i * 7919 + 13) % mc.vocab_size);
    batch_ = batch;
    ctx_ = ctx;
    return step();  // warm-up
  }

  Status step() {
    std::vector<BatchItem> items(seqs_.size());
    for (size_t i = 0; i < seqs_.size(); ++i) items[i] = BatchItem{seqs_[i], std::span<const int32_t>(&last_[i], 1), false};
    AFD_RETURN_IF_ERROR(engine_->forward(items, &logits_));
    for (auto& t : last_) t = static_cast<int32_t>((t * 31 + 7) % w_->config.vocab_size);
    return Status::ok();
  }

  EngineOptions opt_;
  std::shared_ptr<const ModelWeights> w_;
  std::unique_ptr<Engine> engine_;
  std::vector<int64_t> seqs_;
  std::vector<int32_t> last_;
  std::vector<float> logits_;
  int64_t batch_ = 0, ctx_ = 0;
};

struct CalibrateFlags {
  std::string samples, out, samples_out;
  std::vector<int64_t> batches{1, 4, 16, 64};
  std::vector<int64_t> contexts{256, 1024, 4096};
  int repeats = 3;
  bool json = false;
  EngineFlags engine;
};

void write_samples_csv(const std::vector<StageSample>& s, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("cannot write samples '" + path + "'");
  f << "batch,token_load,ffn_tokens,attention_s,a2f_s,ffn_s,f2a_s\n";
  char line[256];
  for (const auto& x : s) {
    std::snprintf(line, sizeof line, "%lld,%lld,%lld,%.9g,%.9g,%.9g,%.9g\n", static_cast<long long>(x.batch),
                  static_cast<long long>(x.token_load), static_cast<long long>(x.ffn_tokens), x.attention_s, x.a2f_s,
                  x.ffn_s, x.f2a_s);
    f << line;
  }
  if (!f) fail("write failed: '" + path + "'");
}

void register_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Fit the α/β latency models (seeds/003 App. B) to measured stage times; write a profile");
  auto f = std::make_shared<CalibrateFlags>();
  cmd->add_option("--samples", f->samples,
                  "CSV of measured steps: batch,token_load,attention_s,a2f_s,ffn_s,f2a_s[,ffn_tokens] "
                  "(instead of measuring with --model)");
  f->engine.add_to(cmd, /*model_required=*/false);
  cmd->add_option("--batches", f->batches, "with --model: batch sizes to sweep")->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--contexts", f->contexts, "with --model: per-request context lengths to sweep")->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--repeats", f->repeats, "with --model: timed steps per point")->check(CLI::Range(1, 1000));
  cmd->add_option("--samples-out", f->samples_out, "with --model: also write the measured samples as CSV");
  cmd->add_option("--out", f->out, "write the profile JSON here (for plan ratio / sim --profile)");
  cmd->add_flag("--json", f->json, "print the profile and residuals as JSON");
  cmd->callback([f] {
    std::vector<StageSample> s;
    std::string source;
    if (!f->samples.empty() && !f->engine.options.model_dir.empty())
      fail("calibrate: give --samples or --model, not both");
    if (!f->samples.empty()) {
      s = unwrap(load_samples_csv(f->samples));
      source = "afd calibrate --samples " + f->samples;
    } else if (!f->engine.options.model_dir.empty()) {
      const EngineOptions opt = unwrap(f->engine.to_options());
      auto weights = unwrap(load_model(opt.model_dir));
      auto sampler_obj = std::make_shared<EngineStageSampler>(opt, weights);
      StageSampler sampler = [sampler_obj](int64_t b, int64_t t) { return sampler_obj->sample(b, t); };
      SweepSpec spec;
      spec.batches = f->batches;
      spec.contexts = f->contexts;
      spec.repeats = f->repeats;
      s = unwrap(run_calibration_sweep(sampler, spec));
      source = "afd calibrate --model " + opt.model_dir + " --topology " + f->engine.topology;
      if (!f->samples_out.empty()) write_samples_csv(s, f->samples_out);
    } else {
      fail("calibrate: give --samples FILE or --model DIR");
    }
    const auto fit = unwrap(fit_profile(s, source));
    if (!f->out.empty()) check(save_profile_file(fit.profile, f->out));
    if (f->json) {
      print_json({{"profile", profile_json(fit.profile)}, {"residuals", {{"attention", fit.attention_residuals},
                                                                         {"ffn", fit.ffn_residuals},
                                                                         {"comm", fit.comm_residuals}}}});
      return;
    }
    std::printf("%zu samples (%s)\n", s.size(), source.c_str());
    std::printf("%-10s %14s %14s %9s %12s %12s  %s\n", "stage", "alpha (s/unit)", "beta (s)", "R^2", "RMSE (s)",
                "max |res|", "x");
    auto row = [](const char* n, const LinearModel& m, const char* x) {
      std::printf("%-10s %14.6g %14.6g %9.5f %12.4g %12.4g  %s\n", n, m.alpha, m.beta, m.fit->r2, m.fit->rmse,
                  m.fit->max_abs_residual, x);
    };
    row("attention", fit.profile.attention, "token load T");
    row("ffn", fit.profile.ffn, "FFN batch tokens");
    row("comm", fit.profile.comm, "batch B (A->F + F->A)");
    if (!f->out.empty()) std::printf("profile written to %s\n", f->out.c_str());
  });
}

}  // namespace

void register_plan(CLI::App& app) {
  auto* plan = app.add_subcommand("plan", "Deployment planning: decode cost, MoE sparsity, hardware fit, A/F ratio");
  plan->require_subcommand(1);
  register_cost(plan);
  register_sparsity(plan);
  register_hardware(plan);
  register_ratio(plan);
  register_sim(app);
  register_calibrate(app);
}

}  // namespace afd::cli
