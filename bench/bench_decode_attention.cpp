// Decode attention at batch x context on the whole pool, against the machine's FLOP rate
// measured in the same run (issue 26's compute-bound target):
//   * absorbed MLA (kernels/cpu/mla_attention.h): n_heads heads (DeepSeek-V3: 128) over a
//     K-only latent cache of kv_lora 512 + rope 64 per token; FLOPs per step =
//     batch * heads * ctx * 2 * (576 + 512);
//   * MFA (Step-3): gqa_attend_one (the engine's GQA path) with 1 KV head of head_dim 256 and
//     64 query heads over a K+V cache, and the same step through mqa_decode_attend (separate
//     value rows); FLOPs per step = batch * 64 * ctx * 4 * 256.
// One "step" = the attention of every sequence of the batch (one decode token each), tasks
// spread over the pool as the engine does (MLA: token x 32-head groups when the batch is
// smaller than the pool). Reported: median and p90 over `steps` steps (after one warm-up),
// the FLOP rate of the median step, and the reference rates measured here: linear() GEMMs of
// the step's own two products per sequence (RefGemm; bf16 for MLA, bf16 and f32 for MFA),
// OpenBLAS sgemm (measure_gemm_flops) and the register-only peaks (measure_peak_flops).
// The reference GEMMs run interleaved with the attention steps (one round before each step),
// so load from other processes on a shared machine affects both alike.
// Usage: bench_decode_attention [batch 32] [ctx 4096] [mla_heads 128] [steps 10] [threads 0 = all]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/stats.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/machine_limits.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "kv/paged_kv_cache.h"
#include "model/gqa_attention.h"

namespace {

using namespace afd;

// Wall seconds of a region, kept unless it is the warm-up.
struct Times {
  std::vector<double> wall;
  template <class F>
  void time(bool keep, F&& f) {
    const int64_t w0 = now_ns();
    f();
    if (keep) wall.push_back((now_ns() - w0) * 1e-9);
  }
};

int64_t arg(int argc, char** argv, int i, int64_t fallback, int64_t lo, int64_t hi) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(argv[i], &end, 10);
  return end != argv[i] && *end == 0 && v >= lo && v <= hi ? v : -1;
}

// The reference GEMMs of a decode step, through linear() with W in wdt: per sequence (one pool
// task each, single-threaded), the two products of its attention as plain GEMMs,
// y1[m, ctx] = x1[m, k] . W1[ctx, k]^T (scores) and y2[m, v] = x2[m, ctx] . W2[v, ctx]^T (P.V),
// so a round does the FLOPs of one attention step in the same threading.
struct RefGemm {
  RefGemm(ThreadPool& pool, int64_t batch, int64_t m, int64_t ctx, int64_t k, int64_t v, DType wdt,
          kernels::ActPrecision prec)
      : pool(pool), batch(batch), m(m), ctx(ctx), k(k), v(v), wdt(wdt), prec(prec) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> d(-1, 1);
    x1.resize(static_cast<size_t>(m * k));
    x2.resize(static_cast<size_t>(m * ctx));
    for (auto& e : x1) e = d(rng);
    for (auto& e : x2) e = d(rng);
    auto fill = [&](std::vector<uint8_t>& wb, int64_t n) {
      wb.resize(static_cast<size_t>(n) * dtype_size(wdt));
      for (int64_t i = 0; i < n; ++i) {
        const float e = d(rng);
        if (wdt == DType::bf16) reinterpret_cast<uint16_t*>(wb.data())[i] = f32_to_bf16(e).bits;
        else reinterpret_cast<float*>(wb.data())[i] = e;
      }
    };
    w1.resize(static_cast<size_t>(pool.size()));
    w2.resize(w1.size());
    for (size_t t = 0; t < w1.size(); ++t) {
      fill(w1[t], ctx * k);
      fill(w2[t], v * ctx);
    }
    y.assign(w1.size(), std::vector<float>(static_cast<size_t>(m * std::max(ctx, v))));
  }
  double flops() const { return 2.0 * batch * m * ctx * (k + v); }
  void run() {
    pool.run(static_cast<int>(batch), [&](int, int th) {
      ScratchArena& ts = scratch[static_cast<size_t>(th)];
      kernels::linear(x1.data(), m, k, w1[th].data(), wdt, ctx, k, y[th].data(), ctx, prec, nullptr, ts);
      kernels::linear(x2.data(), m, ctx, w2[th].data(), wdt, v, ctx, y[th].data(), v, prec, nullptr, ts);
    });
  }
  ThreadPool& pool;
  std::vector<ScratchArena> scratch = std::vector<ScratchArena>(static_cast<size_t>(pool.size()));  // one per thread
  int64_t batch, m, ctx, k, v;
  DType wdt;
  kernels::ActPrecision prec;
  std::vector<float> x1, x2;
  std::vector<std::vector<uint8_t>> w1, w2;
  std::vector<std::vector<float>> y;
};

// One layer, one KV head of head_dim (K-only for the MLA latent rows), bf16, room for `batch`
// sequences of ctx tokens in blocks of bs; null with the reason on stderr when it cannot be made.
std::unique_ptr<PagedKvCache> bench_cache(int64_t head_dim, bool k_only, int64_t bs, int64_t batch, int64_t ctx) {
  KvCacheConfig kc;
  kc.n_layers = 1;
  kc.n_kv_heads = 1;
  kc.head_dim = head_dim;
  kc.k_only = k_only;
  kc.block_size = bs;
  kc.n_blocks = batch * ((ctx + bs - 1) / bs);
  kc.dtype = DType::bf16;
  kc.prefix_caching = false;
  auto kv = PagedKvCache::create(kc);
  if (!kv.ok()) {
    std::fprintf(stderr, "bench_decode_attention: %s\n", kv.status().to_string().c_str());
    return nullptr;
  }
  return std::move(*kv);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = arg(argc, argv, 1, 32, 1, 4096), ctx = arg(argc, argv, 2, 4096, 1, int64_t{1} << 20);
  const int64_t heads = arg(argc, argv, 3, 128, 1, 1024), steps = arg(argc, argv, 4, 10, 1, 100000);
  const int64_t threads = arg(argc, argv, 5, 0, 0, 1024);
  if (argc > 6 || batch < 0 || ctx < 0 || heads < 0 || steps < 0 || threads < 0) {
    std::fprintf(stderr, "usage: bench_decode_attention [batch 32] [ctx 4096] [mla_heads 128] [steps 10] [threads 0]\n");
    return 2;
  }
  ThreadPool pool(static_cast<int>(threads));
  std::printf("bench_decode_attention: batch %lld, ctx %lld, %d threads, isa %s\n", (long long)batch, (long long)ctx,
              pool.size(), kernels::isa_name(kernels::active_isa()));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> ud(-1, 1);

  // ---- absorbed MLA
  const int64_t lat = 512, rope = 64, D = lat + rope, bs = 16;
  double mla_rate = 0, mla_ref = 0, mla_best = 0, mla_ref_best = 0;
  {
    auto kv = bench_cache(D, /*k_only=*/true, bs, batch, ctx);
    if (!kv) return 1;
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t s = 0; s < batch; ++s) {
      (void)kv->add_sequence(s);
      (void)kv->append(s, ctx);
    }
    for (int64_t j = 0; j < ctx; ++j)
      for (int64_t s = 0; s < batch; ++s) {
        for (auto& v : row) v = ud(rng);
        kv->write(0, s, j, row.data(), nullptr);
      }
    std::vector<std::vector<const uint8_t*>> blocks(static_cast<size_t>(batch));
    std::vector<kernels::PagedRows> views(static_cast<size_t>(batch));
    for (int64_t s = 0; s < batch; ++s) {
      for (int64_t b : kv->block_table(s)) blocks[s].push_back(kv->k_head(0, b, 0));
      views[s] = kernels::PagedRows{blocks[s].data(), nullptr, bs, D, DType::bf16};
    }
    std::vector<float> q(static_cast<size_t>(batch * heads * D)), out(static_cast<size_t>(batch * heads * lat));
    for (auto& v : q) v = 0.05f * ud(rng);
    const int64_t max_groups = (heads + 31) / 32;
    const int64_t groups = std::clamp<int64_t>((pool.size() + batch - 1) / batch, 1, max_groups);
    const int64_t hg = std::min<int64_t>(heads, ((heads + groups - 1) / groups + 31) / 32 * 32);
    const int64_t ng = (heads + hg - 1) / hg;
    RefGemm ref(pool, batch, heads, ctx, D, lat, DType::bf16, kernels::ActPrecision::bf16);
    ScratchArena mla_scratch(pool.size());
    Times t, tr;
    for (int64_t st = 0; st <= steps; ++st) {
      tr.time(st > 0, [&] { ref.run(); });
      t.time(st > 0, [&] {
        pool.run(static_cast<int>(batch * ng), [&](int task, int thread) {
          const int64_t s = task / ng, h0 = (task % ng) * hg, nh = std::min(hg, heads - h0);
          kernels::mla_decode_attend(&q[(s * heads + h0) * D], D, nh, lat, rope, views[s], ctx, 0.135f,
                                     &out[(s * heads + h0) * lat], lat, mla_scratch.slot(thread));
        });
      });
    }
    const SampleSummary sm = summarize(t.wall);
    const double flops = 2.0 * batch * heads * ctx * (D + lat);
    mla_rate = flops / sm.median;
    mla_ref = ref.flops() / summarize(tr.wall).median;
    mla_best = flops / sm.min;
    mla_ref_best = ref.flops() / summarize(tr.wall).min;
    std::printf("MLA absorbed  heads %lld kv bf16 576/token  path %s  step median %.2f ms  p90 %.2f ms  %.1f GFLOP/s "
                "(median step; %.2f GFLOP/step, %.0f FLOP per KV byte)\n",
                (long long)heads, kernels::mla_decode_path_name(DType::bf16), sm.median * 1e3, sm.p90 * 1e3,
                mla_rate / 1e9, flops / 1e9, flops / (2.0 * batch * ctx * D));
  }

  // ---- MFA: GQA with 1 KV head of 256, 64 query heads
  double mfa_rate = 0, mfa_ref_f32 = 0, mfa_ref_bf16 = 0, mfa_best = 0, mfa_ref_best = 0, mqa_rate = 0;
  {
    const int64_t hd = 256, qh = 64;
    auto kv = bench_cache(hd, /*k_only=*/false, bs, batch, ctx);
    if (!kv) return 1;
    std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
    for (int64_t s = 0; s < batch; ++s) {
      (void)kv->add_sequence(s);
      (void)kv->append(s, ctx);
    }
    for (int64_t j = 0; j < ctx; ++j)
      for (int64_t s = 0; s < batch; ++s) {
        for (auto& x : k) x = ud(rng);
        for (auto& x : v) x = ud(rng);
        kv->write(0, s, j, k.data(), v.data());
      }
    std::vector<float> q(static_cast<size_t>(batch * qh * hd)), out(q.size());
    for (auto& x : q) x = 0.05f * ud(rng);
    GqaShape shape{qh, 1, hd, 0};
    RefGemm ref32(pool, batch, qh, ctx, hd, hd, DType::f32, kernels::ActPrecision::f32);
    RefGemm ref16(pool, batch, qh, ctx, hd, hd, DType::bf16, kernels::ActPrecision::bf16);
    // The same step through mqa_decode_attend (shared K and V rows, heads as the vector
    // dimension, bf16 dot products), split like the MLA step.
    std::vector<std::vector<const uint8_t*>> kb(static_cast<size_t>(batch)), vb(kb.size());
    std::vector<kernels::PagedRows> kvw(kb.size()), vvw(kb.size());
    for (int64_t s = 0; s < batch; ++s) {
      for (int64_t b : kv->block_table(s)) {
        kb[s].push_back(kv->k_head(0, b, 0));
        vb[s].push_back(kv->v_head(0, b, 0));
      }
      kvw[s] = kernels::PagedRows{kb[s].data(), nullptr, bs, hd, DType::bf16};
      vvw[s] = kernels::PagedRows{vb[s].data(), nullptr, bs, hd, DType::bf16};
    }
    const int64_t mg = std::clamp<int64_t>((pool.size() + batch - 1) / batch, 1, (qh + 31) / 32);
    const int64_t mhg = std::min<int64_t>(qh, ((qh + mg - 1) / mg + 31) / 32 * 32), mng = (qh + mhg - 1) / mhg;
    const float sc = 1.0f / 16.0f;
    ScratchArena scratch(pool.size());
    Times t, t32, t16, tm;
    for (int64_t st = 0; st <= steps; ++st) {
      t32.time(st > 0, [&] { ref32.run(); });
      t16.time(st > 0, [&] { ref16.run(); });
      t.time(st > 0, [&] {
        pool.run(static_cast<int>(batch), [&](int s, int thread) {
          gqa_attend_one(*kv, 0, s, ctx, 0, shape, &q[s * qh * hd], &out[s * qh * hd], scratch.slot(thread));
        });
      });
      tm.time(st > 0, [&] {
        pool.run(static_cast<int>(batch * mng), [&](int task, int thread) {
          const int64_t s = task / mng, h0 = (task % mng) * mhg, nh = std::min(mhg, qh - h0);
          kernels::mqa_decode_attend(&q[(s * qh + h0) * hd], hd, nh, kvw[s], &vvw[s], hd, ctx, sc,
                                     &out[(s * qh + h0) * hd], hd, scratch.slot(thread));
        });
      });
    }
    const SampleSummary sm = summarize(t.wall);
    const double flops = 4.0 * batch * qh * ctx * hd;
    mfa_rate = flops / sm.median;
    mfa_ref_f32 = ref32.flops() / summarize(t32.wall).median;
    mfa_ref_bf16 = ref16.flops() / summarize(t16.wall).median;
    mfa_best = flops / sm.min;
    const SampleSummary smq = summarize(tm.wall);
    mqa_rate = flops / smq.median;
    mfa_ref_best = ref32.flops() / summarize(t32.wall).min;
    std::printf("MFA (GQA 1x256, 64 heads) kv bf16 512/token  step median %.2f ms  p90 %.2f ms  %.1f GFLOP/s "
                "(median step; %.2f GFLOP/step, %.0f FLOP per KV byte)\n",
                sm.median * 1e3, sm.p90 * 1e3, mfa_rate / 1e9, flops / 1e9, flops / (2.0 * batch * ctx * 2 * hd));
    std::printf("MFA through mqa_decode_attend (%s)  step median %.2f ms  p90 %.2f ms  %.1f GFLOP/s\n",
                kernels::mla_decode_path_name(DType::bf16), smq.median * 1e3, smq.p90 * 1e3, mqa_rate / 1e9);
  }

  // ---- machine rates, same run
  const double sgemm = kernels::measure_gemm_flops(pool, DType::f32);
  const double peak_bf16 = kernels::measure_peak_flops(pool, DType::bf16);
  const double peak_f32 = kernels::measure_peak_flops(pool, DType::f32);
  std::printf("reference GEMMs (linear(), the step's two products per sequence, interleaved with the steps, median "
              "round): MLA shapes bf16 %.1f GFLOP/s (%s); MFA shapes bf16 %.1f GFLOP/s, f32 %.1f GFLOP/s (%s)\n",
              mla_ref / 1e9, kernels::linear_path_name(heads, DType::bf16, kernels::ActPrecision::bf16),
              mfa_ref_bf16 / 1e9, mfa_ref_f32 / 1e9, kernels::linear_path_name(64, DType::f32, kernels::ActPrecision::f32));
  std::printf("machine: OpenBLAS sgemm %.1f GFLOP/s; register-only peak vdpbf16ps %.1f, f32 FMA %.1f GFLOP/s\n",
              sgemm / 1e9, peak_bf16 / 1e9, peak_f32 / 1e9);
  std::printf("MLA absorbed: %.0f%% of the bf16 reference GEMM, %.0f%% of peak bf16\n", 100 * mla_rate / mla_ref,
              100 * mla_rate / peak_bf16);
  std::printf("MFA: %.0f%% of the f32 reference GEMM, %.0f%% of the bf16 one, %.0f%% of peak f32 FMA, %.0f%% of peak bf16\n",
              100 * mfa_rate / mfa_ref_f32, 100 * mfa_rate / mfa_ref_bf16, 100 * mfa_rate / peak_f32,
              100 * mfa_rate / peak_bf16);
  std::printf("MFA shapes through mqa_decode_attend: %.0f%% of the bf16 reference GEMM, %.0f%% of peak bf16\n",
              100 * mqa_rate / mfa_ref_bf16, 100 * mqa_rate / peak_bf16);
  // Best steps (least disturbed by other load), for comparison only.
  std::printf("best step: MLA %.1f GFLOP/s = %.0f%% of the best bf16 reference GEMM round, %.0f%% of peak bf16; "
              "MFA %.1f GFLOP/s = %.0f%% of the best f32 reference GEMM round, %.0f%% of peak f32 FMA\n",
              mla_best / 1e9, 100 * mla_best / mla_ref_best, 100 * mla_best / peak_bf16, mfa_best / 1e9,
              100 * mfa_best / mfa_ref_best, 100 * mfa_best / peak_f32);
  return 0;
}
