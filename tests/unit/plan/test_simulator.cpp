// Simulator: exact on hand-computable cases, bit-for-bit reproducible, and its optimum
// within 10% of the theory (the A/F ratio paper, §5.3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "plan/expert_load.h"
#include "plan/ratio_theory.h"
#include "plan/rng.h"
#include "plan/sim_sweep.h"
#include "plan/simulator.h"

namespace afd::plan::test_simulator {
namespace {

LatencyProfile profile(double aa, double ba, double af, double bf, double ac, double bc) {
  LatencyProfile p;
  p.attention = {aa, ba, std::nullopt};
  p.ffn = {af, bf, std::nullopt};
  p.comm = {ac, bc, std::nullopt};
  return p;
}

// Hand-computable runs: every prefill and decode length fixed, one attention and one FFN instance.
SimConfig fixed_lengths(int64_t batch, int64_t n_microbatches, int64_t requests, double prefill, double decode,
                        const LatencyProfile& latency) {
  SimConfig c;
  c.batch = batch;
  c.n_microbatches = n_microbatches;
  c.requests_per_attn = requests;
  c.prefill = {LengthDistKind::fixed, prefill, 0};
  c.decode = {LengthDistKind::fixed, decode, 0};
  c.latency = latency;
  return c;
}

// r = 1, one micro-batch of 4 slots, fixed prefill 10 and decode 5, 8 requests: two rounds
// of 5 steps. Step k: T = 4(10+k), t_A = 0.5 T + 3 = 23 + 2k, t_C(4) = 4 + 4 = 8 (both
// directions), t_F(4) = 2*4 + 7 = 15 -> step time 46 + 2k, a round 250, the run 500.
SimConfig single_microbatch() {
  return fixed_lengths(/*batch=*/4, /*n_microbatches=*/1, /*requests=*/8, /*prefill=*/10, /*decode=*/5,
                       profile(0.5, 3, 2, 7, 1, 4));
}

TEST(Simulator, ExactSingleMicroBatch) {
  auto r = simulate(single_microbatch());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->n_completed, 8);
  EXPECT_EQ(r->n_stable, 7);               // ceil(0.8 * 8)
  EXPECT_DOUBLE_EQ(r->t_end, 500.0);
  EXPECT_DOUBLE_EQ(r->t_stable, 500.0);    // the 7th completion is in the second round
  EXPECT_DOUBLE_EQ(r->tokens_stable, 35.0);
  EXPECT_DOUBLE_EQ(r->throughput_per_instance, 35.0 / 500.0 / 2.0);
  EXPECT_DOUBLE_EQ(r->tpot, 250.0 / 5.0);
  EXPECT_DOUBLE_EQ(r->eta_attn, 1.0 - 270.0 / 500.0);  // attention busy 2 * Σ(23 + 2k)
  EXPECT_DOUBLE_EQ(r->eta_ffn, 1.0 - 150.0 / 500.0);   // FFN busy 10 * 15
  EXPECT_EQ(r->steps, 10);
  EXPECT_EQ(r->events, 40);  // per step: attention, A->F, FFN, F->A
}

// Two micro-batches of one slot, t_A = 10, t_F = 3, one-way transfer 1, decode 2, 4 requests.
// The attention instance is never idle after t = 0 (10 >= 1 + 3 + 1): it runs 8 executions
// back to back (0..80), and the last micro-batch finishes its transfers and FFN at 85.
// Completions at 35, 45, 75, 85; TPOT = mean(35/2, 45/2, 40/2, 40/2) = 20.
TEST(Simulator, ExactTwoMicroBatchPipeline) {
  for (bool duplex : {false, true}) {
    SCOPED_TRACE(duplex ? "full duplex" : "shared link");
    SimConfig c = fixed_lengths(/*batch=*/1, /*n_microbatches=*/2, /*requests=*/4, /*prefill=*/0, /*decode=*/2,
                                profile(0, 10, 1, 2, 0, 2));
    c.full_duplex = duplex;
    auto r = simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_DOUBLE_EQ(r->t_end, 85.0);
    EXPECT_DOUBLE_EQ(r->t_stable, 85.0);
    EXPECT_DOUBLE_EQ(r->throughput_per_instance, 8.0 / 85.0 / 2.0);
    EXPECT_DOUBLE_EQ(r->tpot, 20.0);
    EXPECT_DOUBLE_EQ(r->eta_attn, 5.0 / 85.0);
    EXPECT_DOUBLE_EQ(r->eta_ffn, 1.0 - 24.0 / 85.0);
  }
}

// r = 3 with identical fixed loads behaves like r = 1 with the FFN batch tripled; and
// 6A-2F equals 3A-1F.
TEST(Simulator, ExactBarrierAndXaYf) {
  SimConfig c = fixed_lengths(/*batch=*/2, /*n_microbatches=*/1, /*requests=*/6, /*prefill=*/4, /*decode=*/3,
                              profile(0.25, 1, 0.5, 2, 0.5, 1));
  c.n_attn = 3;
  auto r3 = simulate(c);
  ASSERT_TRUE(r3.ok());
  // Step k: T = 2(4+k): t_A = 0.5(4+k) + 1 = 3 + 0.5k; t_C(2) = 2; t_F(6) = 5 -> 10 + 0.5k.
  // 3 steps per round (Σ = 31.5), 3 rounds.
  EXPECT_DOUBLE_EQ(r3->t_end, 3 * 31.5);
  c.n_attn = 6;
  c.n_ffn = 2;
  auto r62 = simulate(c);
  ASSERT_TRUE(r62.ok());
  EXPECT_DOUBLE_EQ(r62->t_end, r3->t_end);
  // 15th of 18 (29th of 36) completions fall in the third round: T_80% = t_end.
  EXPECT_DOUBLE_EQ(r3->throughput_per_instance, 15 * 3 / r3->t_end / 4);
  EXPECT_DOUBLE_EQ(r62->throughput_per_instance, 29 * 3 / r62->t_end / 8);
}

// Layers split each step's latencies evenly: with one micro-batch the step time is unchanged.
TEST(Simulator, LayersPreserveStepTime) {
  SimConfig c = single_microbatch();
  c.n_layers = 4;
  auto r = simulate(c);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->t_end, 500.0);
  EXPECT_EQ(r->events, 160);
}

SimConfig stochastic_config(uint64_t seed) {
  SimConfig c;
  c.n_attn = 4;
  c.batch = 64;
  c.requests_per_attn = 2000;
  c.prefill = {LengthDistKind::uniform, 100, 1.0};
  c.decode = {LengthDistKind::geometric, 200, 1.0};
  c.latency = af_ratio_paper_profile();
  c.seed = seed;
  return c;
}

TEST(Simulator, SeededRunsAreBitForBitReproducible) {
  auto a = simulate(stochastic_config(42));
  auto b = simulate(stochastic_config(42));
  auto d = simulate(stochastic_config(43));
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  EXPECT_EQ(std::memcmp(&*a, &*b, sizeof(SimResult)), 0);
  EXPECT_NE(a->t_end, d->t_end);
  // The sweep gives the same bits with and without a thread pool.
  ThreadPool pool(2);
  const std::vector<RatioSpec> ratios = {{1, 1}, {3, 1}, {5, 2}};
  auto s1 = run_ratio_sweep(stochastic_config(7), ratios, nullptr);
  auto s2 = run_ratio_sweep(stochastic_config(7), ratios, &pool);
  ASSERT_TRUE(s1.ok() && s2.ok());
  for (size_t i = 0; i < ratios.size(); ++i) EXPECT_EQ(std::memcmp(&(*s1)[i].sim, &(*s2)[i].sim, sizeof(SimResult)), 0);
}

TEST(Simulator, RngGeometricMean) {
  Rng rng(1);
  const double p = 1.0 / 501.0;
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(rng.geometric(p));
  EXPECT_NEAR(sum / n, 500.0, 500.0 * 0.01);  // σ/√n ≈ 1.1
}

SimConfig baseline(uint64_t seed) {
  SimConfig c;
  c.batch = 256;
  c.requests_per_attn = 10000;
  c.prefill = {LengthDistKind::fixed, 100, 0};
  c.decode = {LengthDistKind::geometric, 500, 0};
  c.latency = af_ratio_paper_profile();
  c.seed = seed;
  return c;
}

// The attention load the simulator sees over the stable window matches the horizon-average
// token load (eq. 13; each of the 2 micro-batches of an instance serves N/2 requests).
TEST(Simulator, MeanTokenLoadMatchesTheory) {
  const SimConfig c = baseline(1);
  auto r = simulate(c);
  ASSERT_TRUE(r.ok());
  RatioWorkload w = workload_of(c);
  w.n_requests = c.requests_per_attn / c.n_microbatches;
  EXPECT_NEAR(r->mean_token_load_stable, horizon_avg_token_load(w), 0.03 * horizon_avg_token_load(w));
  // eq. (21) counts completed requests only, so it is below the rate of produced tokens.
  EXPECT_LT(r->throughput_per_instance, r->generated_throughput_per_instance);
}

size_t argmax_throughput(const std::vector<std::vector<SweepPoint>>& runs) {
  size_t best = 0;
  double best_v = -1;
  for (size_t i = 0; i < runs[0].size(); ++i) {
    double v = 0;
    for (const auto& run : runs) v += run[i].sim.throughput_per_instance;
    if (v > best_v) best_v = v, best = i;
  }
  return best;
}

// A/F ratio paper, §5.3: "the theoretical optimal A/F ratio matches the simulation-optimal within
// 10%" (baseline B = 256, μ_P = 100, μ_D = 500, N = 10,000, r* ≈ 9.3). The theory assumes
// communication is hidden (§5.2); we validate it under that assumption (t_C = 0), with the
// simulated throughput averaged over 3 seeds on a 0.5 grid of xA-2F bundles.
TEST(Simulator, SimulatedOptimumWithin10PercentOfTheory) {
  ThreadPool pool(2);
  std::vector<RatioSpec> ratios;
  for (int64_t x = 14; x <= 24; ++x) ratios.push_back({x, 2});  // r = 7 .. 12
  std::vector<std::vector<SweepPoint>> runs;
  SimConfig c = baseline(0);
  c.latency.comm = {0, 0, std::nullopt};
  for (uint64_t seed : {11, 12, 13}) {
    c.seed = seed;
    auto pts = run_ratio_sweep(c, ratios, &pool);
    ASSERT_TRUE(pts.ok()) << pts.status().to_string();
    runs.push_back(*pts);
  }
  const double r_sim = ratios[argmax_throughput(runs)].ratio();
  const double r_theory = optimal_ratio(c.latency, workload_of(c)).r_star;
  EXPECT_NEAR(r_theory, 9.32, 0.01);
  EXPECT_LE(std::fabs(r_sim - r_theory) / r_theory, 0.10) << "sim optimum " << r_sim << ", theory " << r_theory;
  // The simulated throughput stays within 15% of eq. (6) over the sweep (the A/F ratio paper, Fig. 4).
  for (const auto& p : runs[0])
    EXPECT_NEAR(p.sim.throughput_per_instance, p.theory.throughput_per_instance, 0.15 * p.theory.throughput_per_instance)
        << "r = " << p.spec.ratio();
}

// With Table 2's communication on the loop of each of the 2 micro-batches, the balanced
// point is not fully overlapped: the simulated optimum follows the pipelined optimum
// (≈ 8.1), not r* (≈ 9.3).
TEST(Simulator, OptimumWithCommunicationFollowsPipelinedTheory) {
  ThreadPool pool(2);
  std::vector<RatioSpec> ratios;
  for (int64_t r = 5; r <= 14; ++r) ratios.push_back({r, 1});
  const SimConfig c = baseline(2026);
  auto pts = run_ratio_sweep(c, ratios, &pool);
  ASSERT_TRUE(pts.ok());
  const double r_sim = ratios[argmax_throughput({*pts})].ratio();
  const double r_pipe = pipelined_optimal_ratio(c);
  EXPECT_LT(r_pipe, optimal_ratio(c.latency, workload_of(c)).r_star);
  EXPECT_LE(std::fabs(r_sim - r_pipe) / r_pipe, 0.10) << "sim optimum " << r_sim << ", pipelined theory " << r_pipe;
}

TEST(Simulator, RejectsBadConfig) {
  SimConfig c;
  c.batch = 0;
  EXPECT_FALSE(simulate(c).ok());
  c = SimConfig{};
  c.latency.ffn.alpha = 0;
  EXPECT_FALSE(simulate(c).ok());
  c = SimConfig{};
  c.stable_fraction = 0;
  EXPECT_FALSE(simulate(c).ok());
}

// A/F ratio paper, Figure 5 on the paper's sweep: FFN idles at r = 1 (theory 1 - t_F/t_A = 0.59;
// the paper reports > 60%), attention idles > 60% at r = 32, and η_A, η_F cross between
// r = 8 and r = 10 ("at around r = 8").
TEST(Simulator, Figure5IdleRatios) {
  ThreadPool pool(2);
  const std::vector<RatioSpec> ratios = {{1, 1}, {8, 1}, {9, 1}, {10, 1}, {32, 1}};
  auto pts = run_ratio_sweep(baseline(5), ratios, &pool);
  ASSERT_TRUE(pts.ok());
  const auto& p = *pts;
  EXPECT_NEAR(p[0].sim.eta_ffn, p[0].theory.eta_ffn, 0.02);
  EXPECT_GT(p[0].sim.eta_ffn, 0.55);
  EXPECT_GT(p[4].sim.eta_attn, 0.60);
  EXPECT_LT(p[1].sim.eta_attn, p[1].sim.eta_ffn);  // r = 8: FFN still idles more
  EXPECT_GT(p[3].sim.eta_attn, p[3].sim.eta_ffn);  // r = 10: attention idles more
}

// Zero-length decodes finish at admission: no step runs, no time passes, rates are 0 (not NaN).
TEST(Simulator, AllZeroDecodeLengths) {
  SimConfig c;
  c.batch = 8;
  c.requests_per_attn = 20;
  c.decode = {LengthDistKind::fixed, 0, 0};
  c.latency = af_ratio_paper_profile();
  auto r = simulate(c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->n_completed, 20);
  EXPECT_EQ(r->events, 0);
  EXPECT_EQ(r->throughput_per_instance, 0.0);
  EXPECT_EQ(r->tpot, 0.0);
}

// The expert model's fields are ignored while n_experts = 0: the old bits, imbalance 1.
TEST(Simulator, ExpertModelOffKeepsTheOldBits) {
  SimConfig off = stochastic_config(42);
  off.n_ffn = 2;
  off.experts.top_k = 3;
  off.experts.zipf_s = 2.5;
  off.experts.placement = ExpertPlacementKind::eplb;
  off.experts.redundant = 5;
  off.experts.window_tokens = 7;
  SimConfig plain = stochastic_config(42);
  plain.n_ffn = 2;
  auto a = simulate(off);
  auto b = simulate(plain);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string();
  EXPECT_EQ(std::memcmp(&*a, &*b, sizeof(SimResult)), 0);
  EXPECT_EQ(a->ffn_imbalance_mean, 1.0);
  EXPECT_EQ(a->ffn_imbalance_max, 1.0);
  SimConfig exact = single_microbatch();
  exact.experts = off.experts;
  auto e = simulate(exact);
  ASSERT_TRUE(e.ok());
  EXPECT_DOUBLE_EQ(e->t_end, 500.0);
}

// single_microbatch on 2 FFN workers: per_ffn = 2 * imbalance_l, t_F = 4 imbalance_l + 7 per
// step, split over L layers: a step takes 38 + 2k + (4/L) Σ_l imbalance_l, a round
// 210 + 20 mean_l, the run 420 + 40 mean_l (mean over the L layers, profiles cycling past 64).
TEST(Simulator, ExpertImbalanceScalesEachLayersFfnBatch) {
  for (int64_t layers : {1, 4, 100}) {
    SCOPED_TRACE(std::to_string(layers) + " layers");
    SimConfig c = single_microbatch();
    c.n_ffn = 2;
    c.n_layers = layers;
    c.experts.n_experts = 8;
    c.experts.top_k = 2;
    c.experts.zipf_s = 1.5;
    auto r = simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto imb = expert_imbalance(c.experts, 2, layers, c.seed);
    ASSERT_TRUE(imb.ok());
    EXPECT_EQ(r->ffn_imbalance_mean, imb->mean);
    EXPECT_EQ(r->ffn_imbalance_max, imb->max);
    EXPECT_GT(r->ffn_imbalance_mean, 1.05);
    EXPECT_NEAR(r->t_end, 420.0 + 40.0 * r->ffn_imbalance_mean, 1e-9 * r->t_end);
  }
}

// Issue 41: 32 attention and 64 FFN instances, 256 experts, top-8, Zipf 1.0 over 8 layers.
// The contiguous placement leaves the hottest worker >= 1.5x the mean; EPLB with 64 redundant
// replicas (25%) brings it under 1.10, and the bundle's throughput per instance rises.
TEST(Simulator, EplbRaisesThroughputAt32A64F) {
  SimConfig c = baseline(3);
  c.n_attn = 32;
  c.n_ffn = 64;
  c.n_layers = 8;
  c.requests_per_attn = 500;
  c.experts.n_experts = 256;
  c.experts.top_k = 8;
  c.experts.zipf_s = 1.0;
  auto contiguous = simulate(c);
  c.experts.placement = ExpertPlacementKind::eplb;
  c.experts.redundant = 64;
  auto eplb = simulate(c);
  ASSERT_TRUE(contiguous.ok() && eplb.ok()) << eplb.status().to_string();
  EXPECT_GE(contiguous->ffn_imbalance_mean, 1.5);
  EXPECT_LT(eplb->ffn_imbalance_mean, 1.10);
  EXPECT_LT(eplb->ffn_imbalance_max, 1.10);
  EXPECT_GT(eplb->throughput_per_instance, contiguous->throughput_per_instance)
      << "contiguous max/mean " << contiguous->ffn_imbalance_mean << ", EPLB " << eplb->ffn_imbalance_mean;
  EXPECT_LT(eplb->tpot, contiguous->tpot);
}

// Bad expert options are refused by simulate, and a sweep names the ratio whose y they do not fit.
TEST(Simulator, RejectsBadExpertConfig) {
  SimConfig c = stochastic_config(1);
  c.experts.n_experts = 256;
  c.experts.top_k = 300;
  auto r = simulate(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sim expert load: top_k = 300"), std::string::npos) << r.status().message();
  c.experts.top_k = 8;
  c.experts.placement = ExpertPlacementKind::eplb;
  c.experts.redundant = 64;
  auto sweep = run_ratio_sweep(c, {{32, 64}, {32, 60}}, nullptr);
  ASSERT_FALSE(sweep.ok());
  EXPECT_NE(sweep.status().message().find("ratio 32:60"), std::string::npos) << sweep.status().message();
  EXPECT_NE(sweep.status().message().find("do not divide over 60 workers"), std::string::npos);
}

TEST(Simulator, ParseRatioSpec) {
  EXPECT_EQ(parse_ratio_spec("8")->n_attn, 8);
  EXPECT_EQ(parse_ratio_spec("3.5")->n_attn, 7);
  EXPECT_EQ(parse_ratio_spec("3.5")->n_ffn, 2);
  EXPECT_EQ(parse_ratio_spec("7:3")->n_ffn, 3);
  EXPECT_FALSE(parse_ratio_spec("0").ok());
  EXPECT_FALSE(parse_ratio_spec("x").ok());
  EXPECT_FALSE(parse_ratio_spec("3:").ok());
}

}  // namespace
}  // namespace afd::plan::test_simulator
