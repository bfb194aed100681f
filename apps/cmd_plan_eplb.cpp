// afd plan eplb: an expert placement with redundant replicas from counted expert loads
// (plan/eplb.h), beside afd's static contiguous placement, with the max/mean per-worker load
// each predicts.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "plan/eplb.h"
#include "plan/hf_model_spec.h"
#include "plan/svg_plot.h"
#include "plan/text_file.h"
#include "plan_cli.h"

namespace afd::cli {
namespace {

using nlohmann::json;
using namespace afd::plan;

struct EplbArgs {
  std::string counts;
  int workers = 0;
  int64_t redundant = 0;
  std::string model_config;
  double weight_bytes = 2.0;
  double worker_memory_gib = 0;
  std::string out;
  std::string plot;
  bool as_json = false;
};

struct Summary {
  double mean = 0, max = 0;  // of the per-layer max/mean
};

Summary summarize(const PlacementPlan& p) {
  Summary s;
  for (const auto& l : p.layers) {
    s.mean += l.max_over_mean();
    s.max = std::max(s.max, l.max_over_mean());
  }
  if (!p.layers.empty()) s.mean /= static_cast<double>(p.layers.size());
  return s;
}

// Per-worker load of the layer the static placement balances worst, before and after, and
// every layer's max/mean before and after.
std::string load_svg(const PlacementPlan& before, const PlacementPlan& after) {
  size_t worst = 0;
  for (size_t l = 0; l < before.layers.size(); ++l)
    if (before.layers[l].max_over_mean() > before.layers[worst].max_over_mean()) worst = l;
  PlotPanel workers{"Per-worker load, layer " + std::to_string(before.layer_ids[worst]) + " (tokens / mean)",
                    "FFN worker", "load / mean load", {}, {}};
  PlotSeries b{"contiguous", "#d62728", {}, {}, true, false, true};
  PlotSeries a{"EPLB", "#1f77b4", {}, {}, true, false, true};
  const double mean = before.layers[worst].mean_load();
  for (size_t w = 0; w < before.layers[worst].worker_load.size(); ++w) {
    b.x.push_back(static_cast<double>(w));
    a.x.push_back(static_cast<double>(w));
    b.y.push_back(mean > 0 ? before.layers[worst].worker_load[w] / mean : 1.0);
    a.y.push_back(mean > 0 ? after.layers[worst].worker_load[w] / mean : 1.0);
  }
  workers.series = {b, a};
  PlotPanel layers{"Max / mean worker load per layer", "layer", "max / mean", {}, {}};
  PlotSeries lb{"contiguous", "#d62728", {}, {}, true, false, true};
  PlotSeries la{"EPLB", "#1f77b4", {}, {}, true, false, true};
  for (size_t l = 0; l < before.layers.size(); ++l) {
    lb.x.push_back(static_cast<double>(before.layer_ids[l]));
    la.x.push_back(static_cast<double>(before.layer_ids[l]));
    lb.y.push_back(before.layers[l].max_over_mean());
    la.y.push_back(after.layers[l].max_over_mean());
  }
  layers.series = {lb, la};
  return render_svg({workers, layers});
}

void run_eplb(const EplbArgs& a) {
  const ExpertCounts counts = unwrap(load_expert_counts(a.counts));
  const EplbOptions opt{a.workers, a.redundant};
  check(check_eplb_options(counts.n_experts, opt));
  double expert_bytes = 0;
  if (!a.model_config.empty()) {
    HfSpecOptions so;
    so.weight_bytes = a.weight_bytes;
    const ModelSpec spec = unwrap(load_hf_model_spec(a.model_config, so));
    const FfnGroup* moe = spec.first_moe_group();
    if (moe == nullptr) fail("plan eplb: the model in '" + a.model_config + "' has no MoE layers");
    std::filesystem::path cfg(a.model_config);
    std::error_code ec;
    if (std::filesystem::is_directory(cfg, ec)) cfg /= "config.json";
    const std::string text = unwrap(read_text_file(cfg.string(), "model config"));
    const ModelConfig mc = unwrap(parse_model_config(text, cfg.string()));
    check(check_counts_cover_model(counts, mc).with_context("plan eplb"));
    expert_bytes = moe->expert_params * spec.weight_bytes;
    if (a.worker_memory_gib > 0)
      check(check_replica_memory(counts.n_experts, opt, moe->n_layers, expert_bytes,
                                 a.worker_memory_gib * 1024.0 * 1024 * 1024));
  } else if (a.worker_memory_gib > 0) {
    fail("plan eplb: --worker-memory needs --model-config (the bytes of one expert)");
  }
  const PlacementPlan before = plan_contiguous(counts, a.workers);
  const PlacementPlan after = unwrap(plan_eplb(counts, opt));
  const Summary sb = summarize(before), sa = summarize(after);
  if (!a.out.empty()) write_text_file(a.out, placement_to_json(after, a.workers, a.redundant) + "\n", "placement");
  if (!a.plot.empty()) write_text_file(a.plot, load_svg(before, after), "plot");
  const int64_t per_worker = (counts.n_experts + a.redundant) / a.workers;
  if (a.as_json) {
    json layers = json::array();
    for (size_t l = 0; l < after.layers.size(); ++l)
      layers.push_back({{"layer", after.layer_ids[l]},
                        {"contiguous_max_over_mean", before.layers[l].max_over_mean()},
                        {"eplb_max_over_mean", after.layers[l].max_over_mean()},
                        {"workers", after.layers[l].worker_experts},
                        {"load", after.layers[l].worker_load}});
    json j = {{"n_experts", counts.n_experts}, {"n_workers", a.workers}, {"redundant", a.redundant},
              {"replicas_per_worker", per_worker},
              {"contiguous", {{"mean_max_over_mean", sb.mean}, {"max_max_over_mean", sb.max}}},
              {"eplb", {{"mean_max_over_mean", sa.mean}, {"max_max_over_mean", sa.max}}},
              {"layers", layers}};
    if (expert_bytes > 0) j["expert_bytes"] = expert_bytes;
    print_json(j);
    return;
  }
  std::printf("EPLB: %lld experts + %lld redundant on %d FFN workers (%lld replicas each), %zu MoE layers from %s\n",
              static_cast<long long>(counts.n_experts), static_cast<long long>(a.redundant), a.workers,
              static_cast<long long>(per_worker), counts.counts.size(), a.counts.c_str());
  std::printf("%-7s %12s %12s  %s\n", "layer", "contiguous", "EPLB", "replicated experts (copies)");
  for (size_t l = 0; l < after.layers.size(); ++l) {
    std::string rep;
    const auto& ew = after.layers[l].expert_workers;
    for (size_t e = 0; e < ew.size(); ++e)
      if (ew[e].size() > 1) rep += (rep.empty() ? "" : " ") + std::to_string(e) + "x" + std::to_string(ew[e].size());
    std::printf("%-7lld %12.3f %12.3f  %s\n", static_cast<long long>(after.layer_ids[l]),
                before.layers[l].max_over_mean(), after.layers[l].max_over_mean(), rep.empty() ? "-" : rep.c_str());
  }
  std::printf("max/mean worker load: contiguous mean %.3f max %.3f; EPLB mean %.3f max %.3f\n", sb.mean, sb.max,
              sa.mean, sa.max);
  if (expert_bytes > 0)
    std::printf("expert memory per worker: %lld replicas x %.4g MiB per MoE layer\n", static_cast<long long>(per_worker),
                expert_bytes / (1024.0 * 1024));
  if (!a.out.empty()) std::printf("placement written to %s\n", a.out.c_str());
  if (!a.plot.empty()) std::printf("plot written to %s\n", a.plot.c_str());
}

}  // namespace

void register_plan_eplb(CLI::App* plan) {
  auto* cmd = plan->add_subcommand(
      "eplb", "Expert placement with redundant replicas from counted expert loads (DeepSeek's EPLB method)");
  auto a = std::make_shared<EplbArgs>();
  cmd->add_option("--counts", a->counts,
                  "tokens per (layer, expert): JSON, or Prometheus text with afd_ffn_expert_tokens_total (/metrics)")
      ->required();
  cmd->add_option("--ffn-workers", a->workers, "FFN workers (y)")->required()->check(CLI::Range(1, 4096));
  cmd->add_option("--redundant", a->redundant, "extra expert replicas per layer (R); (E + R) divisible by y")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--model-config", a->model_config, "config.json (file or directory): expert bytes for the memory check");
  cmd->add_option("--weight-bytes", a->weight_bytes, "bytes per expert weight with --model-config (2 = bf16, 1 = FP8)")
      ->check(CLI::Range(0.125, 8.0));
  cmd->add_option("--worker-memory", a->worker_memory_gib, "GiB an FFN worker has for expert weights (refuse more)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--out", a->out, "write the placement as JSON");
  cmd->add_option("--plot", a->plot, "write an SVG of per-worker load before and after");
  cmd->add_flag("--json", a->as_json, "JSON output");
  cmd->callback([a] { run_eplb(*a); });
}

}  // namespace afd::cli
