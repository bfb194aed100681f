// afd bench: decode throughput of the engine over batch x context, with bytes and FLOPs
// per step and the achieved fractions of this machine's limits measured in the same run.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <tuple>

#include <nlohmann/json.hpp>

#include "bench_e2e.h"
#include "commands.h"
#include "core/log.h"
#include "core/stats.h"
#include "core/timer.h"
#include "engine_flags.h"
#include "kernels/cpu/machine_limits.h"
#include "local_ffn.h"
#include "model/weights.h"
#include "plan/hf_model_spec.h"
#include "plan/step_cost.h"
#include "runtime/afd/ffn_worker.h"
#include "runtime/engine_factory.h"
#include "serve/frontend/proxy_client.h"
#include "trace_output.h"

namespace afd::cli {

namespace {

struct BenchFlags {
  EngineFlags engine;
  std::string batches = "1,8,32,128";
  std::string contexts = "512,4096";
  int steps = 20;
  int64_t query_tokens = 1;  // --query-tokens: tokens per sequence per step (1 + drafts verified)
  bool e2e = false;          // --e2e: the real generate loop instead of synthetic steps
  int64_t e2e_tokens = 64;
  int64_t e2e_prompt = 128;
  float e2e_temperature = 0.0f;
  int e2e_warmup = 0;
  std::string e2e_prompt_file;  // --prompt-ids-file
  bool json = false;
  bool per_layer = false;
  bool per_worker = false;
  bool skip_limits = false;
  std::string mode = "mono";
  std::string delay = "0";
  int rounds = 1;
  bool topology_given = false;  // --topology on the command line (else the default, mono)
  bool mode_given = false;      // --mode on the command line (else afd for an xAyF / EPn --topology)
};

// Per row key (wiring, micro-batches, delay, batch, context): the ratios of every round.
struct RoundRatios {
  std::vector<double> vs_mono, vs_no_delay;
};

// Bytes of one FfnWeights (gate + up + down).
size_t ffn_bytes(const FfnWeights& f) { return f.gate.nbytes() + f.up.nbytes() + f.down.nbytes(); }

// The loaded weights a decode step reads (plan/step_cost.h): every matrix but the routed
// experts, and one routed expert (the same size in every MoE layer).
plan::StepWeightReads weight_reads(const ModelWeights& w) {
  plan::StepWeightReads r;
  for (const LayerWeights& L : w.layers) {
    const AttentionWeights& a = L.attn;
    for (const Matrix* m : {&a.q_a, &a.q, &a.k, &a.v, &a.kv_a, &a.kv_b, &a.o}) r.fixed_bytes += m->nbytes();
    if (L.is_moe) {
      r.fixed_bytes += L.moe.router.nbytes();
      if (!L.moe.shared.empty()) r.fixed_bytes += ffn_bytes(L.moe.shared);
      r.routed_expert_bytes = ffn_bytes(L.moe.experts[0]);
    } else {
      r.fixed_bytes += ffn_bytes(L.dense);
    }
  }
  r.fixed_bytes += w.lm_head.nbytes();
  return r;
}

double peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024.0;
}

struct Point {
  // step_s is the median timed step; stage times, costs and per-worker counts are those of
  // that step. steps_s holds every timed step, in order.
  double step_s = 0, ffn_s = 0, attn_s = 0, comm_s = 0, bytes = 0, flops = 0, expert_flops = 0;
  double weight_bytes = 0, attention_flops = 0;
  std::vector<double> steps_s;
  std::vector<LayerStageTimes> layers;  // of the median step
  // Of the median step (empty without a bundle): tokens each attention engine ran; per FFN
  // worker (in-process, or --spawn-ffn processes through their /health), the tokens it
  // computed per layer (averaged over the layers; a token reaches every worker holding one
  // of its top-k experts, and every TP rank of a group) and its (token, expert) pairs per
  // MoE layer (its share of the expert load).
  std::vector<double> attention_tokens, ffn_tokens, ffn_expert_rows;
};

// Tokens and (token, expert) pairs computed so far by each FFN worker (FfnWorkerStats tokens
// and expert_rows, counted before each reply is sent, so a read after a step includes all of
// it): the in-process ones (BenchmarkHooks::ffn_stats), or the --spawn-ffn processes at
// `remote` (the same counters in their GET /health JSON). Empty when there are none, or when
// a worker did not answer.
struct FfnCounts {
  std::vector<int64_t> tokens, rows;
};
FfnCounts ffn_counts(const BenchmarkHooks& hooks, const std::vector<serve::MetricsTarget>& remote) {
  FfnCounts c;
  for (const serve::MetricsTarget& t : remote) {
    auto body = serve::http_get_body(t.host, t.port, "/health", 2000, size_t{64} << 10);
    const nlohmann::json j = body.ok() ? nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false) : nullptr;
    const bool counted = j.is_object() && j.contains("tokens") && j["tokens"].is_number_integer() &&
                         j.contains("expert_rows") && j["expert_rows"].is_number_integer();
    if (!counted) {
      spdlog::warn("bench: no per-worker counts from the FFN worker at {}: {}", t.address(),
                   body.ok() ? "its /health lacks the token counters" : body.status().to_string());
      return FfnCounts{};
    }
    c.tokens.push_back(j["tokens"].get<int64_t>());
    c.rows.push_back(j["expert_rows"].get<int64_t>());
  }
  if (remote.empty())
    for (const FfnWorkerStats* s : hooks.ffn_stats()) {
      c.tokens.push_back(s->tokens.load());
      c.rows.push_back(s->expert_rows.load());
    }
  return c;
}

// Bytes of one cached K/V value: the KV dtype, f32 in reference precision.
double kv_elem_bytes(const EngineOptions& o) {
  return o.precision == Precision::reference ? 4.0 : static_cast<double>(dtype_size(o.kv.dtype));
}

// Decode steps of `batch` sequences at context `ctx`: one warm-up step, then `steps` timed
// ones; the Point describes the median step and carries every step's time.
// remote_ffn: the status servers of --spawn-ffn workers, for their per-worker counts.
// query_tokens q > 1: speculative verification steps: each sequence forwards its last token
// and q - 1 drafts (all logits), and every draft is rejected (Engine::settle_drafts(0)), so the
// context grows by one token per step as in plain decode.
Point measure(const EngineOptions& o, std::shared_ptr<const ModelWeights> w, int64_t batch, int64_t ctx, int steps,
              const std::vector<serve::MetricsTarget>& remote_ffn = {}, int64_t query_tokens = 1) {
  const ModelConfig& mc = w->config;
  const plan::ModelSpec spec = plan::model_spec_from_config(mc, {.kv_elem_bytes = kv_elem_bytes(o)});
  plan::StepWeightReads reads = weight_reads(*w);
  auto eng = make_engine(o, w);
  if (!eng.ok()) fail("bench", eng.status());
  Engine& e = **eng;
  BenchmarkHooks* hooks = e.benchmark_hooks();
  if (hooks == nullptr) fail("bench", not_supported("this engine has no benchmark hooks (synthetic context)"));
  std::vector<int64_t> seqs;
  std::vector<int32_t> last(static_cast<size_t>(batch * query_tokens));  // per sequence: last token, drafts
  for (int64_t i = 0; i < batch; ++i) {
    auto id = e.create_sequence();
    if (!id.ok()) fail("bench", id.status());
    Status s = hooks->fill_synthetic_context(*id, ctx);
    if (!s.is_ok()) fail("bench", s);
    seqs.push_back(*id);
    for (int64_t j = 0; j < query_tokens; ++j)
      last[i * query_tokens + j] = static_cast<int32_t>((i * 7919 + j * 131 + 13) % mc.vocab_size);
  }
  std::vector<BatchItem> items(static_cast<size_t>(batch));
  std::vector<float> logits;
  int64_t n_moe = 0;  // layers with routed experts
  for (const LayerWeights& L : w->layers) n_moe += L.moe.experts.empty() ? 0 : 1;
  std::vector<Point> timed;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    for (int64_t i = 0; i < batch; ++i)
      items[i] = BatchItem{seqs[i], std::span<const int32_t>(&last[i * query_tokens], static_cast<size_t>(query_tokens)),
                           query_tokens > 1, query_tokens - 1};
    const FfnCounts ffn0 = ffn_counts(*hooks, remote_ffn);
    const int64_t t0 = now_ns();
    Status s = e.forward(items, &logits);
    const double dt = (now_ns() - t0) * 1e-9;
    if (!s.is_ok()) fail("bench", s);
    if (query_tokens > 1)
      for (int64_t i = 0; i < batch; ++i)
        if (Status st = e.settle_drafts(seqs[i], 0); !st.is_ok()) fail("bench", st);
    const FfnCounts ffn1 = ffn_counts(*hooks, remote_ffn);
    std::vector<double> ffn_tokens, ffn_rows;
    for (size_t j = 0; j < ffn1.tokens.size() && ffn0.tokens.size() == ffn1.tokens.size(); ++j) {
      ffn_tokens.push_back(static_cast<double>(ffn1.tokens[j] - ffn0.tokens[j]) / static_cast<double>(mc.n_layers));
      ffn_rows.push_back(static_cast<double>(ffn1.rows[j] - ffn0.rows[j]) /
                         static_cast<double>(std::max<int64_t>(1, n_moe)));
    }
    for (int32_t& t : last) t = static_cast<int32_t>((t * 31 + 7) % mc.vocab_size);
    if (step == 0) continue;
    StageTimes st = e.last_stage_times();
    reads.expert_reads = hooks->last_expert_reads();
    const plan::StepCost sc = plan::decode_step_cost(spec, batch, ctx + step, reads);
    Point p{dt, st.ffn_s, st.attention_s, st.a2f_s, sc.bytes, sc.flops, sc.expert_flops, 0, 0, {}, st.layers, {},
            ffn_tokens, ffn_rows};
    p.weight_bytes = sc.weight_bytes;
    p.attention_flops = sc.attention_flops;
    for (int64_t n : hooks->last_engine_tokens()) p.attention_tokens.push_back(static_cast<double>(n));
    timed.push_back(std::move(p));
  }
  std::vector<double> steps_s;
  for (const Point& p : timed) steps_s.push_back(p.step_s);
  // The median step (the lower one of an even count) describes the point.
  std::vector<size_t> order(timed.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return timed[a].step_s < timed[b].step_s; });
  Point med = timed[order[(order.size() - 1) / 2]];
  med.step_s = median(steps_s);
  med.steps_s = std::move(steps_s);
  return med;
}

// Touches every weight page (FP8 scales included) once so the first timed steps do not pay page
// faults.
void prefault(const ModelWeights& w) {
  volatile uint8_t sink = 0;
  auto touch = [&](const void* data, size_t bytes) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; i += 4096) sink = sink ^ p[i];
  };
  w.for_each_matrix([&](const Matrix& m) {
    touch(m.data, m.nbytes());
    touch(m.scale, m.scale_bytes());
  });
}

void run_bench(BenchFlags f) {  // by value: the defaults that depend on other flags are filled in
  EngineFlags no_list = f.engine;
  no_list.microbatches.clear();  // a micro-batch list is fine here: parsed below
  auto opt = no_list.to_options();
  if (!opt.ok()) fail("bench", opt.status());
  auto batches = parse_int_list(f.batches, "--batch");
  if (!batches.ok()) fail("bench", batches.status());
  auto contexts = parse_int_list(f.contexts, "--context");
  if (!contexts.ok()) fail("bench", contexts.status());
  if (!f.mode_given && opt->topology.wiring != Wiring::mono) f.mode = "afd";  // --topology 1A2F alone
  if (f.mode == "afd" && opt->topology.wiring == Wiring::mono) {
    if (f.topology_given)
      fail("bench", invalid_argument("--mode afd with --topology mono: mono has no FFN workers (use --mode mono, or an "
                                     "xAyF / EPn topology)"));
    opt->topology = *parse_topology("1A1F");  // --mode afd alone: the simplest AFD wiring
  }
  // No list: the wiring's default count (EngineOptions::pipeline_microbatches).
  auto mbs = f.engine.microbatches.empty()
                 ? Result<std::vector<int64_t>>(std::vector<int64_t>{opt->pipeline_microbatches()})
                 : parse_int_list(f.engine.microbatches, "--microbatches");
  if (!mbs.ok()) fail("bench", mbs.status());
  for (int64_t b : *batches) if (b <= 0) fail("bench", invalid_argument("--batch values must be positive"));
  for (int64_t c : *contexts) if (c <= 0) fail("bench", invalid_argument("--context values must be positive"));
  for (int64_t m : *mbs) if (m < 1 || m > 4) fail("bench", invalid_argument("--microbatches values must be in 1..4"));
  if (f.mode != "mono" && f.mode != "afd") fail("bench", invalid_argument("--mode must be mono or afd"));
  if (f.mode == "mono" && opt->topology.wiring != Wiring::mono)
    fail("bench", invalid_argument("--mode mono with --topology " + opt->topology.to_string() + ": use --mode afd"));
  int64_t delay_us = 0;
  const bool delay_auto = f.delay == "auto";
  if (!delay_auto) {
    auto d = parse_int_list(f.delay, "--delay-us");
    if (!d.ok() || d->size() != 1 || (*d)[0] < 0)
      fail("bench", invalid_argument("--delay-us: a non-negative integer or 'auto'"));
    delay_us = (*d)[0];
  }
  if (f.mode == "mono" && (delay_auto || delay_us > 0))
    fail("bench", invalid_argument("--delay-us needs --mode afd (mono sends no messages)"));
  if (f.mode == "mono" && f.engine.spawn_ffn)
    fail("bench", invalid_argument("--spawn-ffn needs --mode afd (mono has no FFN workers)"));
  // --spawn-ffn: the afd rows' FFN workers are child processes over UCX (started once, kept
  // for every row; each afd engine connects and hands its micro-batch count in the handshake).
  LocalFfnProcesses ffn_procs;
  // Each with a status server: the per-worker rates of the afd rows read their counters.
  if (Status s = ffn_procs.start(f.engine, &*opt, /*with_metrics=*/true); !s.is_ok()) fail("bench", s);

  auto weights = load_model(opt->model_dir);
  if (!weights.ok()) fail("bench", weights.status());
  const ModelConfig& mc = (*weights)->config;
  int64_t max_c = 0;
  for (int64_t c : *contexts) max_c = std::max(max_c, c);
  if (!f.e2e && mc.max_position_embeddings > 0 && max_c + f.steps + 2 > mc.max_position_embeddings)
    fail("bench", out_of_range("--context " + std::to_string(max_c) + " exceeds max_position_embeddings " +
                               std::to_string(mc.max_position_embeddings)));
  prefault(**weights);
  if (f.e2e) {
    E2eSpec spec{*batches, f.e2e_tokens, f.e2e_prompt, f.e2e_temperature, f.rounds, f.json, f.e2e_warmup, {}};
    if (!f.e2e_prompt_file.empty()) {
      std::ifstream in(f.e2e_prompt_file);
      if (!in) fail("bench", io_error("--prompt-ids-file: cannot read " + f.e2e_prompt_file));
      std::string line;
      for (int64_t n = 1; std::getline(in, line); ++n) {
        if (line.empty()) continue;
        auto ids = parse_id_list(line);
        if (!ids.ok()) fail("bench", ids.status().with_context(f.e2e_prompt_file + ":" + std::to_string(n)));
        spec.prompts.push_back(std::move(*ids));
      }
      if (spec.prompts.empty()) fail("bench", invalid_argument("--prompt-ids-file: " + f.e2e_prompt_file + " has no prompt"));
    }
    run_bench_e2e(*opt, *weights, spec);
    return;
  }

  // Machine limits, measured now on the same threads.
  double bw = 0, gemm = 0;
  {
    ThreadPool pool(opt->n_threads);
    if (!f.skip_limits) {
      bw = kernels::measure_read_bandwidth(pool);
      gemm = kernels::measure_gemm_flops(pool, opt->precision == Precision::fast ? DType::bf16 : DType::f32);
    }
  }

  // The attention layer's cost as plan/step_cost.h counts it: in bytes of the KV dtype, in values.
  const plan::AttnGroup ag = plan::model_spec_from_config(mc, {.kv_elem_bytes = kv_elem_bytes(*opt)}).attn[0];
  const plan::AttnGroup ag_values = plan::model_spec_from_config(mc, {.kv_elem_bytes = 1.0}).attn[0];
  nlohmann::json rows = nlohmann::json::array();
  if (!f.json) {
    std::printf("model %s: %lld layers, hidden %lld, %lld experts top-%lld, weights %.2f GB; precision %s, kv %s\n",
                opt->model_dir.c_str(), (long long)mc.n_layers, (long long)mc.hidden_size, (long long)mc.n_experts,
                (long long)mc.n_experts_per_tok, (*weights)->matrix_bytes() / 1e9, f.engine.precision.c_str(),
                f.engine.kv_dtype.c_str());
    std::printf("attention %s: KV %.0f B per token per layer, %.0f FLOP per context token per layer, %.3f M "
                "projection weights per layer (plan/model_builders.h)\n",
                mc.attention == AttentionKind::mla ? "mla" : (mc.q_lora_rank > 0 ? "mfa" : "gqa"),
                ag.kv_bytes_per_token, ag.flops_per_ctx_token, ag.linear_params() / 1e6);
    std::printf("machine: read bandwidth %.1f GB/s, library GEMM %.1f GFLOP/s (measured now)\n", bw / 1e9, gemm / 1e9);
    std::printf("steps: the median of %d timed steps per row (tok/s = batch / median step), with p90 and p99\n",
                f.steps);
    std::printf("%-6s %3s %7s %6s %7s %9s %9s %8s %8s %8s %8s %8s %8s %9s %8s %9s %6s %6s\n", "wiring", "mb", "delay",
                "batch", "context", "tok/s", "step_ms", "p90_ms", "p99_ms", "vs_mono", "vs_d0", "MB/step", "bw_frac",
                "flop_frac", "ffn_ms", "ffn_frac", "eta_A", "eta_F");
  }
  using RowKey = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>;
  std::map<RowKey, RoundRatios> by_row;
  std::map<std::pair<int64_t, int64_t>, int64_t> auto_delay;
  std::vector<RowKey> row_order;
  auto emit = [&](const std::string& wiring, int64_t mb, int64_t dly, int64_t batch, int64_t ctx, const Point& p,
                  double mono_tps, double nodelay_tps) {
    const double tps = batch / p.step_s;
    RowKey key{wiring, mb, dly, batch, ctx};
    if (!by_row.count(key)) row_order.push_back(key);
    RoundRatios& rr = by_row[key];
    if (mono_tps > 0) rr.vs_mono.push_back(tps / mono_tps);
    if (nodelay_tps > 0) rr.vs_no_delay.push_back(tps / nodelay_tps);
    nlohmann::json r = {{"wiring", wiring},
                        {"microbatches", mb},
                        {"delay_us", dly},
                        {"batch", batch},
                        {"context", ctx},
                        {"tokens_per_s", tps},
                        {"step_ms", p.step_s * 1e3},
                        {"step_ms_p90", quantile(p.steps_s, 0.9) * 1e3},
                        {"step_ms_p99", quantile(p.steps_s, 0.99) * 1e3},
                        {"step_ms_min", quantile(p.steps_s, 0.0) * 1e3},
                        {"step_ms_mean", summarize(p.steps_s).mean * 1e3},
                        {"vs_mono", mono_tps > 0 ? tps / mono_tps : 0.0},
                        {"vs_no_delay", nodelay_tps > 0 ? tps / nodelay_tps : 0.0},
                        {"bytes_per_step", p.bytes},
                        {"weight_bytes_per_step", p.weight_bytes},
                        {"flops_per_step", p.flops},
                        {"attention_flops_per_step", p.attention_flops},
                        {"bandwidth_fraction", bw > 0 ? p.bytes / p.step_s / bw : 0.0},
                        {"flop_fraction", gemm > 0 ? p.flops / p.step_s / gemm : 0.0},
                        {"attention_ms", p.attn_s * 1e3},
                        {"ffn_ms", p.ffn_s * 1e3},
                        {"eta_attention", p.step_s > 0 && wiring != "mono" ? 1.0 - p.attn_s / p.step_s : 0.0},
                        {"eta_ffn", p.step_s > 0 && wiring != "mono" ? 1.0 - p.ffn_s / p.step_s : 0.0},
                        {"ffn_flop_fraction", gemm > 0 && p.ffn_s > 0 ? p.expert_flops / p.ffn_s / gemm : 0.0}};
    nlohmann::json layers = nlohmann::json::array();
    for (const LayerStageTimes& l : p.layers)
      layers.push_back({{"attention_ms", l.attention_s * 1e3},
                        {"a2f_ms", l.a2f_s * 1e3},
                        {"ffn_ms", l.ffn_s * 1e3},
                        {"f2a_ms", l.f2a_s * 1e3}});
    r["layers"] = layers;
    nlohmann::json all_steps = nlohmann::json::array();
    for (double t : p.steps_s) all_steps.push_back(t * 1e3);
    r["step_times_ms"] = all_steps;
    // Tokens/s per worker (in-process bundles and --spawn-ffn workers): each attention
    // engine's share of the step; each FFN worker's tokens per layer (with top-k > 1 a token
    // reaches several workers, so they can sum past tok/s) and (token, expert) pairs per MoE
    // layer, whose spread across FFN workers is the expert-parallel load imbalance.
    auto per_s = [&](const std::vector<double>& n) {
      nlohmann::json a = nlohmann::json::array();
      for (double v : n) a.push_back(v / p.step_s);
      return a;
    };
    r["attention_tokens_per_s"] = per_s(p.attention_tokens);
    r["ffn_tokens_per_s"] = per_s(p.ffn_tokens);
    r["ffn_expert_rows_per_s"] = per_s(p.ffn_expert_rows);
    rows.push_back(r);
    if (!f.json) {
      std::printf(
          "%-6s %3lld %7lld %6lld %7lld %9.1f %9.2f %8.2f %8.2f %8.3f %8.3f %8.1f %8.3f %9.3f %8.2f %9.3f %6.2f %6.2f\n",
                  wiring.c_str(), (long long)mb, (long long)dly, (long long)batch, (long long)ctx, tps, p.step_s * 1e3,
                  r["step_ms_p90"].get<double>(), r["step_ms_p99"].get<double>(), r["vs_mono"].get<double>(), r["vs_no_delay"].get<double>(), p.bytes / 1e6,
                  r["bandwidth_fraction"].get<double>(), r["flop_fraction"].get<double>(), p.ffn_s * 1e3,
                  r["ffn_flop_fraction"].get<double>(), r["eta_attention"].get<double>(), r["eta_ffn"].get<double>());
      if (f.per_worker && !p.attention_tokens.empty()) {
        auto list = [&](const std::vector<double>& n) {
          std::string o;
          for (double v : n) o += (o.empty() ? "" : " ") + std::to_string(static_cast<int64_t>(v / p.step_s + 0.5));
          return o;
        };
        std::printf("  per worker: attention tok/s [%s]  ffn tok/s [%s]  ffn (token, expert) pairs/s [%s]\n",
                    list(p.attention_tokens).c_str(), list(p.ffn_tokens).c_str(), list(p.ffn_expert_rows).c_str());
      }
      if (f.per_layer) {
        // Per-layer stage times of the median step (docs/ARCHITECTURE.md "Observability").
        std::printf("  %5s %12s %9s %9s %9s\n", "layer", "attention_ms", "a2f_ms", "ffn_ms", "f2a_ms");
        for (size_t l = 0; l < p.layers.size(); ++l)
          std::printf("  %5zu %12.3f %9.3f %9.3f %9.3f\n", l, p.layers[l].attention_s * 1e3, p.layers[l].a2f_s * 1e3,
                      p.layers[l].ffn_s * 1e3, p.layers[l].f2a_s * 1e3);
      }
      std::fflush(stdout);
    }
  };

  // Rounds repeat every point, mono baseline included, one after the other: on a noisy
  // machine the per-round ratios spread, and their median is what to quote.
  for (int round = 0; round < f.rounds; ++round)
  for (int64_t ctx : *contexts) {
    for (int64_t batch : *batches) {
      EngineOptions o = *opt;
      o.kv.max_seqs = batch;
      const int64_t blk = o.kv.block_size;
      // A step appends up to query_tokens positions before settling the drafts back to one.
      o.kv.capacity_tokens = batch * ((ctx + f.steps + f.query_tokens + 1 + blk - 1) / blk * blk);
      o.emulation.inject_delay_us = 0;
      // Monolithic baseline of this point (mono mode: one row per micro-batch count).
      EngineOptions m = o;
      m.topology = Topology{};
      m.afd.ffn_addresses.clear();  // the baseline runs here, whatever FFN workers the afd rows use
      double mono_tps = 0;
      for (int64_t mb : *mbs) {
        if (f.mode == "afd" && mb != (*mbs)[0]) break;
        m.microbatches = f.mode == "mono" ? static_cast<int>(mb) : 1;
        Point p = measure(m, *weights, batch, ctx, f.steps, {}, f.query_tokens);
        if (mono_tps == 0) mono_tps = batch / p.step_s;
        emit("mono", m.microbatches, 0, batch, ctx, p, mono_tps, 0);
      }
      if (f.mode == "mono") continue;
      // Half the per-layer attention time of the whole batch, from the first micro-batch count
      // of the first round (later rounds reuse it, so their rows line up).
      int64_t& d_auto = auto_delay[{batch, ctx}];
      for (int64_t mb : *mbs) {
        o.microbatches = static_cast<int>(mb);
        o.emulation.inject_delay_us = 0;
        Point p0 = measure(o, *weights, batch, ctx, f.steps, ffn_procs.metrics_targets(), f.query_tokens);
        const double tps0 = batch / p0.step_s;
        emit(o.topology.to_string(), mb, 0, batch, ctx, p0, mono_tps, tps0);
        if (d_auto == 0) d_auto = std::max<int64_t>(1, static_cast<int64_t>(p0.attn_s / mc.n_layers / 2 * 1e6));
        const int64_t d = delay_auto ? d_auto : delay_us;
        if (d > 0) {
          o.emulation.inject_delay_us = d;
          Point pd = measure(o, *weights, batch, ctx, f.steps, ffn_procs.metrics_targets(), f.query_tokens);
          emit(o.topology.to_string(), mb, d, batch, ctx, pd, mono_tps, tps0);
        }
      }
    }
  }
  if (opt->observability.trace) {
    if (Status ts = write_trace("bench", *opt->observability.trace, f.engine.trace); !ts.is_ok()) fail("bench", ts);
    if (Status ts = ffn_procs.merge_traces("bench", f.engine.trace); !ts.is_ok()) fail("bench", ts);
  }
  nlohmann::json summary = nlohmann::json::array();
  if (f.rounds > 1) {
    if (!f.json) {
      std::printf("over %d rounds: median [min, max] of each round's ratio\n", f.rounds);
      std::printf("%-6s %3s %7s %6s %7s %26s %26s\n", "wiring", "mb", "delay", "batch", "context", "vs_mono",
                  "vs_d0");
    }
    for (const RowKey& k : row_order) {
      const RoundRatios& rr = by_row[k];
      auto stats = [](const std::vector<double>& v) {
        if (v.empty()) return nlohmann::json(nullptr);
        return nlohmann::json{{"median", median(v)},
                              {"min", *std::min_element(v.begin(), v.end())},
                              {"max", *std::max_element(v.begin(), v.end())},
                              {"rounds", v}};
      };
      const nlohmann::json vs_mono = stats(rr.vs_mono), vs_d0 = stats(rr.vs_no_delay);
      summary.push_back({{"wiring", std::get<0>(k)},
                         {"microbatches", std::get<1>(k)},
                         {"delay_us", std::get<2>(k)},
                         {"batch", std::get<3>(k)},
                         {"context", std::get<4>(k)},
                         {"vs_mono", vs_mono},
                         {"vs_no_delay", vs_d0}});
      if (!f.json) {
        auto cell = [](const nlohmann::json& s) {
          char b[64];
          if (s.is_null()) return std::string("");
          std::snprintf(b, sizeof b, "%.3f [%.3f, %.3f]", s["median"].get<double>(), s["min"].get<double>(),
                        s["max"].get<double>());
          return std::string(b);
        };
        std::printf("%-6s %3lld %7lld %6lld %7lld %26s %26s\n", std::get<0>(k).c_str(), (long long)std::get<1>(k),
                    (long long)std::get<2>(k), (long long)std::get<3>(k), (long long)std::get<4>(k),
                    cell(vs_mono).c_str(), cell(vs_d0).c_str());
      }
    }
  }
  const double rss = peak_rss_bytes();
  if (f.json) {
    nlohmann::json out = {{"model", opt->model_dir},
                          {"precision", f.engine.precision},
                          {"kv_dtype", f.engine.kv_dtype},
                          {"weights_bytes", (*weights)->matrix_bytes()},
                          {"attention",
                           {{"kv_values_per_token_per_layer", ag_values.kv_bytes_per_token},
                            {"kv_bytes_per_token_per_layer", ag.kv_bytes_per_token},
                            {"core_flops_per_context_token_per_layer", ag.flops_per_ctx_token},
                            {"projection_params_per_layer", ag.linear_params()}}},
                          {"read_bandwidth_Bps", bw},
                          {"gemm_flops", gemm},
                          {"peak_rss_bytes", rss},
                          {"rows", rows},
                          {"rounds", f.rounds},
                          {"summary", summary}};
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
  cmd->add_option("--steps", f->steps,
                  "Timed decode steps per point (the median is reported, with p90 and p99; --e2e: unused)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--query-tokens", f->query_tokens,
                  "Tokens per sequence per step: 1 = decode; q > 1 = speculative verification of q - 1 drafts "
                  "(all rejected, so the context grows as in decode)")
      ->check(CLI::Range(1, 9));
  cmd->add_flag("--e2e", f->e2e,
                "End to end: the real generate loop (prefill, sampling, KV growth) for --tokens new tokens per "
                "sequence, each --batch value a batch of --prompt-len-token prompts; reports decode step median/p90/p99 "
                "and mean tokens/s");
  cmd->add_option("--tokens", f->e2e_tokens, "--e2e: new tokens per sequence")->check(CLI::Range(2, 1000000));
  cmd->add_option("--prompt-len", f->e2e_prompt, "--e2e: prompt tokens per sequence")->check(CLI::Range(1, 1000000));
  cmd->add_option("--prompt-ids-file", f->e2e_prompt_file,
                  "--e2e: prompts as comma-separated token ids, one per line (sequence i takes line i mod lines) "
                  "instead of --prompt-len synthetic ids");
  cmd->add_option("--warmup", f->e2e_warmup,
                  "--e2e: untimed generate calls (other prompts) on each round's engine before the timed one")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--temperature", f->e2e_temperature, "--e2e: sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 2.0));
  cmd->add_flag("--json", f->json, "Print JSON (rows always carry per-layer stage times)");
  cmd->add_flag("--per-layer", f->per_layer,
                "Print each row's per-layer stage times (attention, A->F post, FFN, F->A wait)");
  cmd->add_flag("--per-worker", f->per_worker,
                "Print each row's tokens/s per attention engine and per FFN worker (in-process bundles; --json "
                "rows always carry them)");
  CLI::Option* mode = cmd->add_option(
      "--mode", f->mode,
      "mono | afd (afd rows are compared with a mono baseline of the same run); default: afd with an xAyF / EPn "
      "--topology, else mono");
  cmd->add_option("--delay-us", f->delay,
                  "One-way delay injected into every A<->F message (afd): microseconds, or 'auto' = half the "
                  "per-layer attention time measured without delay");
  cmd->add_option("--rounds", f->rounds,
                  "Repeat the whole sweep this many times and print the median [min, max] of each row's ratios")
      ->check(CLI::Range(1, 100));
  cmd->add_flag("--skip-limits", f->skip_limits, "Do not measure bandwidth / GEMM rate (fractions print 0)");
  CLI::Option* topology = cmd->get_option("--topology");
  cmd->callback([f, topology, mode] {
    f->topology_given = topology->count() > 0;
    f->mode_given = mode->count() > 0;
    run_bench(*f);
  });
}

}  // namespace afd::cli
