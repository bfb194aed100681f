// afd bench: decode throughput of the engine over batch x context, with bytes and FLOPs
// per step and the achieved fractions of this machine's limits measured in the same run.
#include <sys/resource.h>

#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/timer.h"
#include "engine_flags.h"
#include "kernels/cpu/machine_limits.h"
#include "model/weights.h"
#include "runtime/pipeline_engine.h"

namespace afd::cli {

namespace {

struct BenchFlags {
  EngineFlags engine;
  std::string batches = "1,8,32,128";
  std::string contexts = "512,4096";
  int steps = 5;
  bool json = false;
  bool skip_limits = false;
};

// Bytes of one FfnWeights (gate + up + down).
size_t ffn_bytes(const FfnWeights& f) { return f.gate.nbytes() + f.up.nbytes() + f.down.nbytes(); }
int64_t ffn_params(const FfnWeights& f) {
  return f.gate.rows * f.gate.cols + f.up.rows * f.up.cols + f.down.rows * f.down.cols;
}

struct StepCost {
  double bytes = 0;        // weights + KV read in one decode step
  double flops = 0;        // all matrix products + attention core
  double expert_flops = 0; // routed + shared expert products
};

// Cost of one decode step of `batch` sequences at context `ctx`, given how many expert
// weight sets the step actually read (expert_reads, from the engine's routing).
StepCost step_cost(const ModelWeights& w, int64_t batch, int64_t ctx, int64_t expert_reads, size_t kv_bytes_per_token) {
  const ModelConfig& c = w.config;
  StepCost s;
  for (const LayerWeights& L : w.layers) {
    const AttentionWeights& a = L.attn;
    double attn_bytes = a.q.nbytes() + a.k.nbytes() + a.v.nbytes() + a.o.nbytes();
    double attn_params = a.q.rows * a.q.cols + a.k.rows * a.k.cols + a.v.rows * a.v.cols + a.o.rows * a.o.cols;
    s.bytes += attn_bytes;
    s.flops += 2.0 * batch * attn_params;
    s.flops += 2.0 * 2.0 * batch * ctx * c.n_heads * c.head_dim;  // q.k and p.v
    if (L.is_moe) {
      s.bytes += L.moe.router.nbytes();
      s.flops += 2.0 * batch * L.moe.router.rows * L.moe.router.cols;
      const FfnWeights& e0 = L.moe.experts[0];
      s.expert_flops += 2.0 * batch * c.n_experts_per_tok * ffn_params(e0);
      if (!L.moe.shared.empty()) {
        s.bytes += ffn_bytes(L.moe.shared);
        s.expert_flops += 2.0 * batch * ffn_params(L.moe.shared);
      }
    } else {
      s.bytes += ffn_bytes(L.dense);
      s.expert_flops += 2.0 * batch * ffn_params(L.dense);
    }
  }
  // Routed experts actually read (same size for every expert and layer).
  for (const LayerWeights& L : w.layers) {
    if (L.is_moe) { s.bytes += static_cast<double>(expert_reads) * ffn_bytes(L.moe.experts[0]); break; }
  }
  s.flops += s.expert_flops;
  s.bytes += w.lm_head.nbytes();
  s.flops += 2.0 * batch * w.lm_head.rows * w.lm_head.cols;
  s.bytes += static_cast<double>(batch) * ctx * kv_bytes_per_token;
  return s;
}

double peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024.0;
}

void run_bench(const BenchFlags& f) {
  auto opt = f.engine.to_options();
  if (!opt.ok()) fail("bench", opt.status());
  auto batches = parse_int_list(f.batches, "--batch");
  if (!batches.ok()) fail("bench", batches.status());
  auto contexts = parse_int_list(f.contexts, "--context");
  if (!contexts.ok()) fail("bench", contexts.status());
  for (int64_t b : *batches) if (b <= 0) fail("bench", invalid_argument("--batch values must be positive"));
  for (int64_t c : *contexts) if (c <= 0) fail("bench", invalid_argument("--context values must be positive"));

  auto weights = load_model(opt->model_dir);
  if (!weights.ok()) fail("bench", weights.status());
  const ModelConfig& mc = (*weights)->config;
  int64_t max_b = 0, max_c = 0;
  for (int64_t b : *batches) max_b = std::max(max_b, b);
  for (int64_t c : *contexts) max_c = std::max(max_c, c);
  if (mc.max_position_embeddings > 0 && max_c + f.steps + 2 > mc.max_position_embeddings)
    fail("bench", out_of_range("--context " + std::to_string(max_c) + " exceeds max_position_embeddings " +
                               std::to_string(mc.max_position_embeddings)));

  // Machine limits, measured now on the same threads.
  double bw = 0, gemm = 0;
  {
    ThreadPool pool(opt->n_threads);
    if (!f.skip_limits) {
      bw = kernels::measure_read_bandwidth(pool);
      gemm = kernels::measure_gemm_flops(pool, opt->precision == Precision::fast ? DType::bf16 : DType::f32);
    }
  }

  nlohmann::json rows = nlohmann::json::array();
  if (!f.json) {
    std::printf("model %s: %lld layers, hidden %lld, %lld experts top-%lld, weights %.2f GB; precision %s, kv %s\n",
                opt->model_dir.c_str(), (long long)mc.n_layers, (long long)mc.hidden_size, (long long)mc.n_experts,
                (long long)mc.n_experts_per_tok, (*weights)->matrix_bytes() / 1e9, f.engine.precision.c_str(),
                f.engine.kv_dtype.c_str());
    std::printf("machine: read bandwidth %.1f GB/s, library GEMM %.1f GFLOP/s (measured now)\n", bw / 1e9, gemm / 1e9);
    std::printf("%6s %7s %10s %10s %10s %10s %8s %9s %8s %9s\n", "batch", "context", "tok/s", "step_ms",
                "MB/step", "GFLOP/st", "bw_frac", "flop_frac", "ffn_ms", "ffn_frac");
  }
  for (int64_t ctx : *contexts) {
    for (int64_t batch : *batches) {
      EngineOptions o = *opt;
      o.max_seqs = batch;
      const int64_t blk = o.kv_block_size;
      o.kv_capacity_tokens = batch * ((ctx + f.steps + 2 + blk - 1) / blk * blk);
      auto eng = make_engine(o, *weights);
      if (!eng.ok()) fail("bench", eng.status());
      auto* pe = dynamic_cast<PipelineEngine*>(eng->get());
      std::vector<int64_t> seqs;
      std::vector<int32_t> last(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) {
        auto id = pe->create_sequence();
        if (!id.ok()) fail("bench", id.status());
        Status s = pe->fill_synthetic_context(*id, ctx);
        if (!s.is_ok()) fail("bench", s);
        seqs.push_back(*id);
        last[i] = static_cast<int32_t>((i * 7919 + 13) % mc.vocab_size);
      }
      std::vector<BatchItem> items(static_cast<size_t>(batch));
      std::vector<float> logits;
      double best = 1e30, ffn_s = 0, flops = 0, bytes = 0, expert_flops = 0;
      for (int step = 0; step <= f.steps; ++step) {  // step 0 warms up
        for (int64_t i = 0; i < batch; ++i) items[i] = BatchItem{seqs[i], std::span<const int32_t>(&last[i], 1), false};
        const int64_t t0 = now_ns();
        Status s = pe->forward(items, &logits);
        const double dt = (now_ns() - t0) * 1e-9;
        if (!s.is_ok()) fail("bench", s);
        for (int64_t i = 0; i < batch; ++i) last[i] = static_cast<int32_t>((last[i] * 31 + 7) % mc.vocab_size);
        if (step > 0 && dt < best) {
          best = dt;
          ffn_s = pe->last_stage_times().ffn_s;
          StepCost sc = step_cost(**weights, batch, ctx + step, pe->last_expert_reads(),
                                  pe->kv_cache().bytes_per_token());
          flops = sc.flops;
          bytes = sc.bytes;
          expert_flops = sc.expert_flops;
        }
      }
      const double tps = batch / best;
      nlohmann::json r = {{"batch", batch},           {"context", ctx},
                          {"tokens_per_s", tps},      {"step_ms", best * 1e3},
                          {"bytes_per_step", bytes},  {"flops_per_step", flops},
                          {"bandwidth_Bps", bytes / best},
                          {"bandwidth_fraction", bw > 0 ? bytes / best / bw : 0.0},
                          {"flop_rate", flops / best},
                          {"flop_fraction", gemm > 0 ? flops / best / gemm : 0.0},
                          {"ffn_ms", ffn_s * 1e3},
                          {"ffn_flop_fraction", gemm > 0 && ffn_s > 0 ? expert_flops / ffn_s / gemm : 0.0}};
      rows.push_back(r);
      if (!f.json) {
        std::printf("%6lld %7lld %10.1f %10.2f %10.1f %10.2f %8.3f %9.3f %8.2f %9.3f\n", (long long)batch,
                    (long long)ctx, tps, best * 1e3, bytes / 1e6, flops / 1e9, r["bandwidth_fraction"].get<double>(),
                    r["flop_fraction"].get<double>(), ffn_s * 1e3, r["ffn_flop_fraction"].get<double>());
        std::fflush(stdout);
      }
    }
  }
  const double rss = peak_rss_bytes();
  if (f.json) {
    nlohmann::json out = {{"model", opt->model_dir},
                          {"precision", f.engine.precision},
                          {"kv_dtype", f.engine.kv_dtype},
                          {"weights_bytes", (*weights)->matrix_bytes()},
                          {"read_bandwidth_Bps", bw},
                          {"gemm_flops", gemm},
                          {"peak_rss_bytes", rss},
                          {"rows", rows}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("peak RSS %.2f GB (weights %.2f GB)\n", rss / 1e9, (*weights)->matrix_bytes() / 1e9);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  auto* cmd = app.add_subcommand("bench", "Decode throughput over batch x context vs this machine's limits");
  f->engine.add_to(cmd);
  cmd->add_option("--batch", f->batches, "Comma-separated batch sizes");
  cmd->add_option("--context", f->contexts, "Comma-separated context lengths");
  cmd->add_option("--steps", f->steps, "Timed decode steps per point (best is reported)");
  cmd->add_flag("--json", f->json, "Print JSON");
  cmd->add_flag("--skip-limits", f->skip_limits, "Do not measure bandwidth / GEMM rate (fractions print 0)");
  cmd->callback([f] { run_bench(*f); });
}

}  // namespace afd::cli
