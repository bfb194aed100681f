// afd calibrate: the alpha/beta latency models (plan/calibrate.h) fitted to stage times, read
// from a CSV or measured on this machine's engine; writes a profile for plan ratio / sim.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine_flags.h"
#include "model/weights.h"
#include "plan/calibrate.h"
#include "plan_cli.h"
#include "runtime/engine.h"
#include "runtime/engine_factory.h"

namespace afd::cli {
namespace {

using nlohmann::json;
using namespace afd::plan;

// Engine-backed StageSampler: one engine per (batch, context) point built on shared weights;
// each sequence gets `context` tokens of synthetic KV (BenchmarkHooks::fill_synthetic_context,
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
    Engine* pe = engine_.get();
    BenchmarkHooks* hooks = pe->benchmark_hooks();
    if (hooks == nullptr) return not_supported("calibrate: this engine cannot fill a synthetic context");
    for (int64_t i = 0; i < batch; ++i) {
      AFD_ASSIGN_OR_RETURN(int64_t id, pe->create_sequence());
      AFD_RETURN_IF_ERROR(hooks->fill_synthetic_context(id, ctx));
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
    return Status();
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

}  // namespace

void register_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate", "Fit the α/β latency models (A/F ratio paper App. B) to measured stage times; write a profile");
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
    if (!f->samples.empty() && !f->engine.options.model_dir.empty()) fail("calibrate: give --samples or --model, not both");
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

}  // namespace afd::cli
