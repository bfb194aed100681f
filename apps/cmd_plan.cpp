// afd plan cost|sparsity|hardware|ratio: thin CLI over src/plan (afd plan eplb: cmd_plan_eplb.cpp,
// afd sim: cmd_sim.cpp, afd calibrate: cmd_calibrate.cpp). Every number printed comes from the
// plan module's functions of the inputs given here.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "plan/accelerator.h"
#include "plan/cost_model.h"
#include "plan/hardware_fit.h"
#include "plan/hf_model_spec.h"
#include "plan/model_presets.h"
#include "plan/ratio_theory.h"
#include "plan_cli.h"

namespace afd::cli {
namespace {

using nlohmann::json;
using namespace afd::plan;

// ---- shared option groups ---------------------------------------------------------------

struct ModelArgs {
  std::vector<std::string> presets;
  std::vector<std::string> configs;
  double kv_bytes = 1.0;
  CLI::Option* models_opt = nullptr;
};

void add_model_args(CLI::App* cmd, ModelArgs* a, const char* default_models) {
  a->presets = CLI::detail::split(default_models, ',');
  a->models_opt = cmd->add_option("--models,--model", a->presets, "model presets (comma list); 'all' = every Step-3 paper model")
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

// ---- plan cost ----------------------------------------------------------------------------

void register_cost(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("cost", "Per-token decode work and USD per 1M tokens (Step-3 paper §4, Tables 2-6)");
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
  auto* cmd = plan->add_subcommand("sparsity", "Minimum MoE sparsity per accelerator (Step-3 paper §5.4, Table 7)");
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
  auto* cmd = plan->add_subcommand("hardware", "Per-layer budget check and card counts for AFD (Step-3 paper §6)");
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

void register_ratio(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("ratio", "Optimal A/F ratio r* (A/F ratio paper Theorem 4.4)");
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

}  // namespace

void register_plan(CLI::App& app) {
  auto* plan = app.add_subcommand("plan", "Deployment planning: decode cost, MoE sparsity, hardware fit, A/F ratio, expert placement");
  plan->require_subcommand(1);
  register_cost(plan);
  register_sparsity(plan);
  register_hardware(plan);
  register_ratio(plan);
  register_plan_eplb(plan);
}

}  // namespace afd::cli
