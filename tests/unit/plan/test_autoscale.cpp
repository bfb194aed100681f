// The A/F-ratio controller (plan/autoscale.h) and its run over the simulator
// (plan/sim_autoscale.h): decisions from busy fractions, hysteresis, bounds, and convergence to
// the simulator's best ratio when the attention or the FFN stage is made slower.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "plan/sim_autoscale.h"
#include "plan/sim_sweep.h"

namespace afd::plan::test_autoscale {
namespace {

// A window of xA-yF under t_A = 100, t_C = 20 at B = 64, and t_F(n) = alpha n + beta with
// n = (x / y) B.
StageWindow window(int64_t x, int64_t y, double alpha = 0.5, double beta = 0) {
  const double n = static_cast<double>(x) / static_cast<double>(y) * 64.0;
  return {.n_attn = x, .n_ffn = y, .attn_time = 100, .batch = 64, .comm_time = 20,
          .ffn_time = alpha * n + beta, .ffn_tokens = n};
}

AutoscaleDecision decide(AutoscaleController& c, const StageWindow& w) {
  auto d = c.decide(w);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return d.ok() ? *d : AutoscaleDecision{};
}

TEST(Autoscale, ProportionalFfnMovesStraightToTheBalancedRatio) {
  // t_F = 0.5 n: r_A = 100 / (0.5 * 64) = 3.125; from 4A-4F (r = 1) the FFN count goes to
  // round(4 / 3.125) = 1.
  AutoscaleController c({});
  const AutoscaleDecision d = decide(c, window(4, 4));
  EXPECT_TRUE(d.change) << d.reason;
  EXPECT_NEAR(d.r_star, 3.125, 1e-12);
  EXPECT_EQ(d.n_attn, 4);
  EXPECT_EQ(d.n_ffn, 1);
  EXPECT_NE(d.reason.find("FFN workers 4 -> 1"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("attention-bound"), std::string::npos) << d.reason;
  // At 4A-1F (r = 4, 28% off 3.125) the next count would be round(4 / 3.125) = 1 again, so
  // the attention side moves: round(3.125 * 1) = 3.
  const AutoscaleDecision e = decide(c, window(4, 1));
  EXPECT_TRUE(e.change) << e.reason;
  EXPECT_EQ(e.n_attn, 3);
  EXPECT_EQ(e.n_ffn, 1);
  const AutoscaleDecision f = decide(c, window(3, 1));  // r = 3, 4% off: settled
  EXPECT_FALSE(f.change) << f.reason;
  EXPECT_NE(f.reason.find("within the hysteresis 0.15"), std::string::npos) << f.reason;
}

TEST(Autoscale, TwoWindowsFitTheFfnFixedCost) {
  // t_F = 0.1 n + 60: r_A = (100 - 60) / 6.4 = 6.25, r_peak = sqrt(60 / 6.4) = 3.06. The first
  // window sees one n and assumes beta = 0; the second fits both exactly.
  AutoscaleOptions o;
  o.bounds.max_attn = 64;
  AutoscaleController c(o);
  const AutoscaleDecision d1 = decide(c, window(16, 16, 0.1, 60));
  EXPECT_TRUE(d1.change);
  EXPECT_EQ(d1.ffn_beta, 0.0);
  const AutoscaleDecision d2 = decide(c, window(d1.n_attn, d1.n_ffn, 0.1, 60));
  EXPECT_NEAR(d2.ffn_alpha, 0.1, 1e-9);
  EXPECT_NEAR(d2.ffn_beta, 60, 1e-6);
  EXPECT_NEAR(d2.r_star, 6.25, 1e-6);
  // From 16A-11F the integer counts get within the hysteresis of 6.25 in one or two more moves
  // (16A-3F is 5.33, 15% off: the attention side then moves to 19), then stay.
  int64_t x = d2.n_attn, y = d2.n_ffn, moves = 2;
  for (int i = 0; i < 4; ++i) {
    const AutoscaleDecision d = decide(c, window(x, y, 0.1, 60));
    if (!d.change) break;
    ++moves;
    x = d.n_attn;
    y = d.n_ffn;
  }
  EXPECT_LE(moves, 3);
  EXPECT_NEAR(static_cast<double>(x) / static_cast<double>(y), 6.25, 6.25 * 0.15) << x << "A-" << y << "F";
  EXPECT_FALSE(decide(c, window(x, y, 0.1, 60)).change);
}

TEST(Autoscale, AFasterFfnStartsTheFitOver) {
  AutoscaleController c({});
  decide(c, window(4, 2, 0.1, 60));
  decide(c, window(4, 1, 0.1, 60));
  // The FFN becomes 3x slower: its time is far off the fit, which starts over from this window.
  const AutoscaleDecision d = decide(c, window(4, 1, 0.3, 180));
  EXPECT_NE(d.reason.find("refit"), std::string::npos) << d.reason;
  EXPECT_EQ(d.ffn_beta, 0.0);
}

TEST(Autoscale, BoundsAndIdleWindowsAndBadInput) {
  AutoscaleOptions o;
  o.bounds.min_ffn = 2;
  o.bounds.max_ffn = 2;
  o.bounds.max_attn = 4;
  AutoscaleController c(o);
  // r* = 3.125 wants 6A-2F; the attention bound 4 is already reached: nothing can move.
  const AutoscaleDecision d = decide(c, window(4, 2));
  EXPECT_FALSE(d.change);
  EXPECT_NE(d.reason.find("nearest counts within the bounds are the current ones"), std::string::npos) << d.reason;
  StageWindow idle = window(4, 2);
  idle.ffn_time = 0;
  const AutoscaleDecision e = decide(c, idle);
  EXPECT_FALSE(e.change);
  EXPECT_NE(e.reason.find("no attention or no FFN work"), std::string::npos);
  StageWindow bad = window(4, 2);
  bad.attn_time = NAN;
  EXPECT_FALSE(c.decide(bad).ok());
  bad = window(4, 2);
  bad.comm_time = -1;
  EXPECT_FALSE(c.decide(bad).ok());
  EXPECT_FALSE(c.decide(window(8, 2)).ok());  // outside the bounds
  AutoscaleOptions inverted;
  inverted.bounds.min_ffn = 5;
  inverted.bounds.max_ffn = 4;
  EXPECT_FALSE(AutoscaleController(inverted).decide(window(2, 5)).ok());
  AutoscaleOptions h0;
  h0.hysteresis = 0;
  EXPECT_FALSE(AutoscaleController(h0).decide(window(2, 2)).ok());
}

TEST(Autoscale, PhasesParse) {
  auto p = parse_autoscale_phases("base,attn*2:3,ffn*0.5+attn*1.5:7");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].windows, 5);
  EXPECT_EQ((*p)[1].attn_scale, 2.0);
  EXPECT_EQ((*p)[1].windows, 3);
  EXPECT_EQ((*p)[2].ffn_scale, 0.5);
  EXPECT_EQ((*p)[2].attn_scale, 1.5);
  EXPECT_EQ((*p)[2].windows, 7);
  for (const char* bad : {"", "base,", "attn", "attn*0", "gpu*2", "base:0", "base:2.5", "attn*x", "ffn*101"}) {
    auto q = parse_autoscale_phases(bad);
    EXPECT_FALSE(q.ok()) << bad;
  }
}

// The A/F ratio paper's Table 2 profile at a small scale; each window one simulation.
SimConfig small_bundle(int64_t x, int64_t y) {
  SimConfig c;
  c.n_attn = x;
  c.n_ffn = y;
  c.batch = 64;
  c.requests_per_attn = 600;
  c.decode = {LengthDistKind::geometric, 200, 1.0};
  c.prefill = {LengthDistKind::fixed, 100, 1.0};
  c.latency = af_ratio_paper_profile();
  return c;
}

// The throughput of the simulator's best y for x attention instances (the reference the
// controller should reach) and that y.
std::pair<int64_t, double> best_ffn_count(SimConfig c, int64_t max_ffn) {
  int64_t best = 1;
  double thr = 0;
  for (int64_t y = 1; y <= max_ffn; ++y) {
    c.n_ffn = y;
    auto r = simulate(c);
    EXPECT_TRUE(r.ok());
    if (r.ok() && r->throughput_per_instance > thr) thr = r->throughput_per_instance, best = y;
  }
  return {best, thr};
}

TEST(Autoscale, ConvergesInThreeDecisionsWhenAStageSlowsDown) {
  AutoscaleOptions o;
  o.bounds.max_attn = 16;
  o.bounds.max_ffn = 16;
  const auto phases = parse_autoscale_phases("base:5,attn*3:5,ffn*4:5");
  ASSERT_TRUE(phases.ok());
  const SimConfig start = small_bundle(16, 16);  // far from the optimum: r = 1
  auto run = simulate_autoscale(start, *phases, o);
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  ASSERT_EQ(run->steps.size(), 15u);
  for (size_t p = 0; p < phases->size(); ++p) {
    SCOPED_TRACE("phase " + (*phases)[p].name);
    EXPECT_GE(run->changes_per_phase[p], 1);
    EXPECT_LE(run->changes_per_phase[p], 3);
    // No oscillation: the phase's last two windows change nothing.
    const AutoscaleStep& last = run->steps[p * 5 + 4];
    const AutoscaleStep& before = run->steps[p * 5 + 3];
    EXPECT_FALSE(last.decision.change) << last.decision.reason;
    EXPECT_FALSE(before.decision.change) << before.decision.reason;
    // Where it settled is within 10% of the throughput of the best FFN count for that x.
    SimConfig c = start;
    c.n_attn = last.n_attn;
    c.latency = phase_profile(start.latency, (*phases)[p]);
    const auto [best_y, best_thr] = best_ffn_count(c, o.bounds.max_ffn);
    EXPECT_GE(last.sim.throughput_per_instance, 0.9 * best_thr)
        << last.n_attn << "A-" << last.n_ffn << "F vs best " << best_y << " FFN: " << last.decision.reason;
  }
}

// A 2A-2F deployment over a window: each attention worker ran 100 micro-batch-layers of 4
// tokens, 1 ms of attention each; each FFN worker got all 200 frames, aggregated two per batch
// (100 batches of 8 tokens), 0.5 ms each.
TEST(Autoscale, StageWindowFromCounters) {
  StageCounters a;
  a.attention_s = 3;
  a.ffn_s = 1;
  a.ffn_batches = 10;
  a.ffn_frames = 20;
  a.ffn_tokens = 80;
  StageCounters b = a;
  b.attention_s += 2 * 100 * 1e-3;
  b.ffn_s += 2 * 100 * 0.5e-3;
  b.ffn_batches += 2 * 100;
  b.ffn_frames += 2 * 200;
  b.ffn_tokens += 2 * 200 * 4;
  auto w = stage_window(a, b, 2, 2);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->n_attn, 2);
  EXPECT_EQ(w->n_ffn, 2);
  EXPECT_NEAR(w->attn_time, 1e-3, 1e-12);
  EXPECT_NEAR(w->batch, 4, 1e-12);
  EXPECT_NEAR(w->ffn_time, 0.5e-3, 1e-12);
  EXPECT_NEAR(w->ffn_tokens, 4, 1e-12);  // 8 tokens a batch, half the expert work each: r·B = 1·4
  EXPECT_EQ(w->comm_time, 0);
  // The theory's optimum for this window: t_F = α n with α = 0.5e-3 / 4, r* = t_A / (α B) = 2.
  AutoscaleOptions o;
  o.bounds.max_attn = 8;
  o.bounds.max_ffn = 8;
  AutoscaleController c(o);
  auto d = c.decide(*w);
  ASSERT_TRUE(d.ok());
  EXPECT_NEAR(d->r_star, 2, 1e-9);
  EXPECT_TRUE(d->change);
  EXPECT_EQ(d->n_attn, 2);
  EXPECT_EQ(d->n_ffn, 1);

  // No frames: an idle window, no decision.
  auto idle = stage_window(a, a, 2, 2);
  ASSERT_TRUE(idle.ok());
  EXPECT_EQ(idle->attn_time, 0);
  EXPECT_EQ(idle->ffn_time, 0);
  auto d2 = c.decide(*idle);
  ASSERT_TRUE(d2.ok());
  EXPECT_FALSE(d2->change);

  // A counter that went down (a worker restarted), a non-finite one, or no workers: refused.
  StageCounters down = b;
  down.ffn_frames = 0;
  EXPECT_FALSE(stage_window(a, down, 2, 2).ok());
  StageCounters nan = b;
  nan.attention_s = std::nan("");
  EXPECT_FALSE(stage_window(a, nan, 2, 2).ok());
  EXPECT_FALSE(stage_window(a, b, 0, 2).ok());
  EXPECT_FALSE(stage_window(a, b, 2, 0).ok());
}

// Without the intercept fit, each window stands alone: α_F = t_F / n of that window and r* is
// the ratio of per-token costs, t_A / B over t_F / n, even where t_F has a fixed part.
TEST(Autoscale, ProportionalModelReadsEachWindowAlone) {
  AutoscaleOptions o;
  o.bounds.max_attn = 64;
  o.bounds.max_ffn = 64;
  o.fit_ffn_fixed_cost = false;
  AutoscaleController c(o);
  const AutoscaleDecision d1 = decide(c, window(16, 16, 0.5, 20));  // n = 64: t_F = 52
  EXPECT_EQ(d1.ffn_beta, 0);
  EXPECT_NEAR(d1.ffn_alpha, 52.0 / 64, 1e-12);
  EXPECT_NEAR(d1.r_star, 100.0 / (52.0 / 64 * 64), 1e-9);
  const AutoscaleDecision d2 = decide(c, window(16, 8, 0.5, 20));  // n = 128: t_F = 84
  EXPECT_EQ(d2.ffn_beta, 0);
  EXPECT_NEAR(d2.ffn_alpha, 84.0 / 128, 1e-12);
  EXPECT_NEAR(d2.r_star, 100.0 / (84.0 / 128 * 64), 1e-9);
  EXPECT_EQ(d2.reason.find("refit"), std::string::npos) << d2.reason;
}

}  // namespace
}  // namespace afd::plan::test_autoscale
