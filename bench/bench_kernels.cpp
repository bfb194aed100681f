// bench_kernels: times the CPU kernels against the machine limits measured in the same run.
//   bench_kernels [--threads N] [--quick] [--compare-sgemm] [--tune] [--fp8] [--fp8-weights]
//                 [--fp8-dequant [--shapes ROWS,COLS,..] [--rounds R]]
//                 [--small-n V,.. [--ns N,..] [--shapes ROWS,COLS,..] [--rounds R] [--row-streams S]]
//                 [--ops [--filter SUBSTR] [--model default|bench] [--rounds R]]
// Prints a Markdown table: kernel path, W shape, n, precision, time per call, GB/s of W
// streamed, GFLOP/s, fraction of the measured read bandwidth, of the library GEMM rate and of
// the vector peak. Every case is timed in several rounds (best of 9 repetitions per round, best
// round), the limits before every round and at the end (best sample used, worst printed too).
// Weights are cold: each timed call uses the next of a set of distinct matrices whose total
// size is several times the L3 cache, as MoE decode touches different experts every step.
// --fp8: instead, the FP8 e4m3 quantization of AFD's dispatch and the FFN side's
// dequantization (per-token scales, one thread, activations hot in cache): the dispatched
// kernels against the scalar references and against a copy of the same bytes, in the same run.
// --fp8-weights: linear_fp8 (FP8 e4m3 weights with 128x128 block scales, linear_fp8.h) against
// linear with bf16 weights of the same shapes, cold, for 1..256 tokens, with the read bandwidth
// measured in the same rounds; plus the gemv conversion variants (half vs bf16 table) and the
// gemv / tile crossover (the defaults in linear_fp8.cpp come from these tables).
// --fp8-dequant: the tile path's dequantization alone, one thread, cold (run_fp8_dequant).
// --small-n: bf16 x bf16 products of W shapes (--shapes, default the expert shapes [768, 2048],
// [2048, 768]) at n tokens (--ns, default 1,2,4,8,16,32)
// for each variant V = layout + 10 * (x block KiB, < 1000) + 1e4 * (least prefetch distance
// KiB, < 1000) + 1e7 * (row chunk: 0 the default, 1 none, k >= 2 k * 16 KiB) of
// detail::LinearTuning (layout 0 = the general tiles, 3 / 4 = 3- / 4-row small-n tiles,
// 5 = the row streams up to kRowSeqMaxN tokens, 9 = the pairs kernel, which the other layouts
// switch off; layouts other than 5 take the row streams for one token only; 0 KiB = the
// default), interleaved in each of R rounds (default 5); --row-streams S:
// LinearTuning::row_streams (the row streams' S).
// --ops: every op of the kernel registry (tests/kernel_ops) at the default model's and the bench
// model's shapes, median and p90 of R rounds (default 5), beside its scalar reference
// (bench/kernel_ops_bench.h); --filter: ops whose name contains SUBSTR; --model: one shape set.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernel_ops_bench.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/machine_limits.h"
#include "kernels/cpu/ops.h"

using namespace afd;
using namespace afd::kernels;

namespace {

struct Limits {
  double read_bw = 0, copy_bw = 0, gemm_f32 = 0, peak_f32 = 0, peak_bf16 = 0;
};

struct WeightSet {
  DType dtype;
  int64_t rows, cols, count;
  std::vector<uint8_t> data;  // count matrices [rows, cols], back to back
  const void* get(int64_t i) const {
    return data.data() + static_cast<size_t>(i % count) * rows * cols * dtype_size(dtype);
  }
  double bytes_one() const { return static_cast<double>(rows * cols * dtype_size(dtype)); }
};

WeightSet make_weights(DType dtype, int64_t rows, int64_t cols, double min_total_bytes) {
  WeightSet w{dtype, rows, cols, 1, {}};
  w.count = std::max<int64_t>(1, static_cast<int64_t>(min_total_bytes / w.bytes_one() + 0.999));
  w.data.resize(static_cast<size_t>(w.count * w.bytes_one()));
  uint32_t s = 12345;
  if (dtype == DType::bf16) {
    auto* p = reinterpret_cast<uint16_t*>(w.data.data());
    for (size_t i = 0; i < w.data.size() / 2; ++i) {
      s = s * 1664525u + 1013904223u;
      p[i] = f32_to_bf16((static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.1f).bits;
    }
  } else {
    auto* p = reinterpret_cast<float*>(w.data.data());
    for (size_t i = 0; i < w.data.size() / 4; ++i) {
      s = s * 1664525u + 1013904223u;
      p[i] = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
  }
  return w;
}

struct Result {
  double sec_per_call;
};

// Best-of-3 of (total time / calls) over `calls` calls cycling through the weight set.
Result time_linear(const WeightSet& w, int64_t n, ActPrecision prec, ThreadPool& pool, double min_seconds,
                   const detail::LinearTuning& tuning = {}) {
  std::vector<float> x(static_cast<size_t>(n * w.cols)), y(static_cast<size_t>(n * w.rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  ScratchArena scratch(pool.size());  // the kernels' working memory, reused by every call
  int64_t call = 0;
  auto one = [&] {
    detail::linear_tuned(x.data(), n, w.cols, w.get(call++), w.dtype, w.rows, w.cols, y.data(), w.rows, prec, &pool,
                         scratch, false, tuning);
  };
  for (int64_t i = 0; i < w.count; ++i) one();  // warm-up: page faults, scratch, thread spin-up
  // Calls per repetition: enough for min_seconds, at least one full pass over the set.
  int64_t t0 = now_ns();
  one();
  double est = std::max(1e-7, static_cast<double>(now_ns() - t0) * 1e-9);
  int64_t calls = std::max<int64_t>(w.count, static_cast<int64_t>(min_seconds / est));
  // Best of kReps short repetitions: on a shared machine, other processes' bursts inflate
  // some repetitions; the best one is the closest to the machine's own capability.
  constexpr int kReps = 9;
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    int64_t s = now_ns();
    for (int64_t i = 0; i < calls; ++i) one();
    best = std::min(best, static_cast<double>(now_ns() - s) * 1e-9 / static_cast<double>(calls));
  }
  return {best};
}

struct Case {
  const WeightSet* w;
  int64_t n;
  ActPrecision prec;
  int64_t blas_min_n;  // -2: leave the default; else forced for this case
  std::string path;
  double best_sec = 1e30;
};

void run_case(Case& c, ThreadPool& pool, double min_seconds) {
  const bool wb = c.w->dtype == DType::bf16, ab = c.prec == ActPrecision::bf16;
  detail::LinearTuning tuning;
  if (c.blas_min_n != -2) tuning.blas_min_n[wb][ab] = c.blas_min_n;
  c.path = detail::linear_path_name(c.n, c.w->dtype, c.prec, 0, LinearOrder::fastest, tuning);
  c.best_sec = std::min(c.best_sec, time_linear(*c.w, c.n, c.prec, pool, min_seconds, tuning).sec_per_call);
}

void print_table(const std::vector<Case>& cases, const Limits& lim) {
  std::printf("| kernel path | W [rows, cols] dtype | n | act | time/call (us) | W GB/s | GFLOP/s | "
              "frac read BW | frac sgemm | frac peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    const WeightSet& w = *c.w;
    double gbs = w.bytes_one() / c.best_sec;
    double flops = 2.0 * static_cast<double>(c.n) * w.rows * w.cols / c.best_sec;
    const bool bf_act = c.prec == ActPrecision::bf16;
    double peak = (bf_act && w.dtype == DType::bf16) ? lim.peak_bf16 : lim.peak_f32;
    std::printf("| %s | [%lld, %lld] %s | %lld | %s | %.1f | %.2f | %.1f | %.3f | %.3f | %.3f |\n", c.path.c_str(),
                static_cast<long long>(w.rows), static_cast<long long>(w.cols), dtype_name(w.dtype),
                static_cast<long long>(c.n), bf_act ? "bf16" : "f32", c.best_sec * 1e6, gbs / 1e9, flops / 1e9,
                gbs / lim.read_bw, flops / lim.gemm_f32, peak > 0 ? flops / peak : 0.0);
  }
}

// Best seconds per call of fn over rounds of repetitions (at least min_s per round).
template <typename Fn>
double best_seconds(Fn&& fn, double min_s) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    int64_t calls = 0;
    const int64_t t0 = now_ns();
    int64_t t = t0;
    while (t - t0 < static_cast<int64_t>(min_s * 1e9)) {
      fn();
      ++calls;
      t = now_ns();
    }
    best = std::min(best, static_cast<double>(t - t0) * 1e-9 / static_cast<double>(calls));
  }
  return best;
}

int run_fp8(bool quick) {
  const double min_s = quick ? 0.02 : 0.1;
  std::printf("FP8 e4m3 quantization, per-token scales, one thread; isa %s\n", isa_name(active_isa()));
  std::printf("| tokens | hidden | scalar reference us | kernel us | speedup | kernel GB/s (f32 in) | copy GB/s | kernel / copy |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  struct Deq {
    int64_t n, hidden;
    double ref_s, k_s, copy_s, bytes;
  };
  std::vector<Deq> deq;
  for (int64_t hidden : {int64_t{2048}, int64_t{7168}})
    for (int64_t n : {int64_t{32}, int64_t{128}}) {
      const int64_t total = n * hidden;
      std::vector<float> x(static_cast<size_t>(total)), y(static_cast<size_t>(total));
      uint32_t r = 7;
      for (float& v : x) {
        r = r * 1664525u + 1013904223u;
        v = (static_cast<float>(r >> 8) / 16777216.0f - 0.5f) * 8.0f;
      }
      std::vector<uint8_t> q(static_cast<size_t>(total));
      std::vector<float> sc(static_cast<size_t>(n));
      const double ref_s = best_seconds([&] { ref::quantize_fp8_e4m3(x.data(), total, hidden, q.data(), sc.data()); }, min_s);
      const double k_s = best_seconds([&] { quantize_fp8_e4m3(x.data(), total, hidden, q.data(), sc.data()); }, min_s);
      const double copy_s = best_seconds([&] {
        std::memcpy(y.data(), x.data(), x.size() * sizeof(float));
        asm volatile("" : : "r"(y.data()) : "memory");
      }, min_s);
      const double bytes = static_cast<double>(total) * sizeof(float);
      std::printf("| %lld | %lld | %.1f | %.1f | %.1fx | %.1f | %.1f | %.2f |\n", static_cast<long long>(n),
                  static_cast<long long>(hidden), ref_s * 1e6, k_s * 1e6, ref_s / k_s, bytes / k_s / 1e9,
                  bytes / copy_s / 1e9, copy_s / k_s);
      const double dref_s = best_seconds([&] { ref::dequantize_fp8_e4m3(q.data(), sc.data(), total, hidden, y.data()); }, min_s);
      const double dk_s = best_seconds([&] { dequantize_fp8_e4m3(q.data(), sc.data(), total, hidden, y.data()); }, min_s);
      deq.push_back({n, hidden, dref_s, dk_s, copy_s, bytes});
    }
  std::printf("\nFP8 e4m3 dequantization (the FFN worker's side), same inputs\n");
  std::printf("| tokens | hidden | scalar reference us | kernel us | speedup | kernel GB/s (f32 out) | kernel / copy |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Deq& d : deq)
    std::printf("| %lld | %lld | %.1f | %.1f | %.1fx | %.1f | %.2f |\n", static_cast<long long>(d.n),
                static_cast<long long>(d.hidden), d.ref_s * 1e6, d.k_s * 1e6, d.ref_s / d.k_s, d.bytes / d.k_s / 1e9,
                d.copy_s / d.k_s);
  return 0;
}

// ---- --fp8-weights ----

// count FP8 matrices [rows, cols] with their block scales, back to back (cold like WeightSet).
struct Fp8Set {
  int64_t rows, cols, count;
  std::vector<uint8_t> q;
  std::vector<float> scale;
  int64_t scale_stride() const { return (cols + kFp8Block - 1) / kFp8Block; }
  int64_t scale_count() const { return (rows + kFp8Block - 1) / kFp8Block * scale_stride(); }
  Fp8BlockWeights get(int64_t i) const {
    const int64_t k = i % count;
    return {q.data() + static_cast<size_t>(k * rows * cols), scale.data() + static_cast<size_t>(k * scale_count()),
            scale_stride(), 0};
  }
  double bytes_one() const { return static_cast<double>(rows * cols) + 4.0 * static_cast<double>(scale_count()); }
};

Fp8Set make_fp8_weights(int64_t rows, int64_t cols, double min_total_bytes) {
  Fp8Set w{rows, cols, 1, {}, {}};
  w.count = std::max<int64_t>(1, static_cast<int64_t>(min_total_bytes / w.bytes_one() + 0.999));
  w.q.resize(static_cast<size_t>(w.count * rows * cols));
  w.scale.resize(static_cast<size_t>(w.count * w.scale_count()));
  uint32_t s = 12345;
  for (auto& b : w.q) {
    s = s * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(s >> 24);
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN encodings
  }
  for (auto& v : w.scale) v = 1e-3f;
  return w;
}

// Seconds per call (best of 9 repetitions, each at least min_seconds and a full pass over the set).
template <typename Fn>
double time_cold(Fn&& one, int64_t count, double min_seconds) {
  for (int64_t i = 0; i < count; ++i) one();
  int64_t t0 = now_ns();
  one();
  const double est = std::max(1e-7, static_cast<double>(now_ns() - t0) * 1e-9);
  const int64_t calls = std::max<int64_t>(count, static_cast<int64_t>(min_seconds / est));
  double best = 1e30;
  for (int rep = 0; rep < 9; ++rep) {
    const int64_t s = now_ns();
    for (int64_t i = 0; i < calls; ++i) one();
    best = std::min(best, static_cast<double>(now_ns() - s) * 1e-9 / static_cast<double>(calls));
  }
  return best;
}

int run_fp8_weights(int threads, bool quick) {
  ThreadPool pool(threads);
  ScratchArena scratch(pool.size());  // the kernels' working memory, reused by every call
  const double min_s = quick ? 0.03 : 0.1;
  const int rounds = quick ? 1 : 3;
  const double cold = 256.0 * 1024 * 1024;
  const detail::Fp8Tuning def;
  std::printf("threads %d, cpu features: %s, isa: %s, rounds %d; fp8 defaults: gemv %s, gemv up to n = %lld "
              "(x within %lld bytes), tiles of %lld rows\n",
              threads, cpu_features().to_string().c_str(), isa_name(active_isa()), rounds,
              def.gemv_lut == 2 ? "bf16 byte table" : def.gemv_lut == 1 ? "bf16 word table" : "half", static_cast<long long>(def.gemv_max_n),
              static_cast<long long>(def.gemv_max_x_bytes), static_cast<long long>(def.tile_rows));
  struct Shape {
    int64_t rows, cols;
    double total;
  };
  // Decode batch 1 on one large matrix (4x L3); MoE expert projections of Qwen3-30B-A3B, of the
  // bench preset and DeepSeek-V3's gate/up [2048, 7168], as cold sets.
  const std::vector<Shape> shapes = {{8192, 8192, 1},   {768, 2048, cold}, {2048, 768, cold},
                                     {512, 2048, cold}, {2048, 512, cold}, {2048, 7168, cold}};
  std::vector<int64_t> ns = {1, 2, 4, 8, 16, 64, 256};
  if (quick) ns = {1, 4, 64};
  struct Row {
    int64_t rows, cols, n;
    std::string variant, path;
    double bf16_s = 1e30, fp8_s = 1e30, fp8_bytes = 0, bf16_bytes = 0;
  };
  std::vector<Row> table;
  // Variants of the fp8 kernel timed per case: the default, and for few tokens the other gemv
  // conversion and the tile path (the crossover).
  struct Variant {
    const char* name;
    int lut;
    int64_t gemv_max;
  };
  std::vector<Row> variants;
  double best_read = 0, worst_read = 1e30;
  std::vector<WeightSet> bsets;
  std::vector<Fp8Set> fsets;
  for (const Shape& sh : shapes) {
    bsets.push_back(make_weights(DType::bf16, sh.rows, sh.cols, sh.total));
    fsets.push_back(make_fp8_weights(sh.rows, sh.cols, sh.total == 1 ? 1 : sh.total / 2));
  }
  for (size_t k = 0; k < shapes.size(); ++k)
    for (int64_t n : ns) {
      if (k == 0 && n > 4) continue;
      table.push_back({shapes[k].rows, shapes[k].cols, n, "default", "", 1e30, 1e30, fsets[k].bytes_one(), bsets[k].bytes_one()});
      if (n <= 16) {
        for (Variant v : {Variant{"gemv half", 0, int64_t{1} << 40}, Variant{"gemv bf16 word table", 1, int64_t{1} << 40},
                          Variant{"gemv bf16 byte table", 2, int64_t{1} << 40}, Variant{"tile", -1, 0}})
          variants.push_back({shapes[k].rows, shapes[k].cols, n, v.name, "", 1e30, 1e30, fsets[k].bytes_one(), 0});
      }
    }
  auto set_of = [&](int64_t rows, int64_t cols) {
    for (size_t k = 0; k < shapes.size(); ++k)
      if (shapes[k].rows == rows && shapes[k].cols == cols) return k;
    return size_t{0};
  };
  for (int round = 0; round < rounds; ++round) {
    const double bw = measure_read_bandwidth(pool);
    best_read = std::max(best_read, bw);
    worst_read = std::min(worst_read, bw);
    for (Row& r : table) {
      const size_t k = set_of(r.rows, r.cols);
      const WeightSet& bw_set = bsets[k];
      const Fp8Set& fs = fsets[k];
      std::vector<float> x(static_cast<size_t>(r.n * r.cols)), y(static_cast<size_t>(r.n * r.rows));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
      int64_t call = 0;
      r.bf16_s = std::min(r.bf16_s, time_cold([&] {
        linear(x.data(), r.n, r.cols, bw_set.get(call++), DType::bf16, r.rows, r.cols, y.data(), r.rows,
               ActPrecision::bf16, &pool, scratch);
      }, bw_set.count, min_s));
      r.path = linear_fp8_path_name(r.n, r.cols, ActPrecision::bf16);
      r.fp8_s = std::min(r.fp8_s, time_cold([&] {
        linear_fp8(x.data(), r.n, r.cols, fs.get(call++), r.rows, r.cols, y.data(), r.rows, ActPrecision::bf16, &pool,
                   scratch);
      }, fs.count, min_s));
    }
    for (Row& r : variants) {
      const Fp8Set& fs = fsets[set_of(r.rows, r.cols)];
      std::vector<float> x(static_cast<size_t>(r.n * r.cols)), y(static_cast<size_t>(r.n * r.rows));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
      const int lut = r.variant == "gemv bf16 word table" ? 1 : r.variant == "gemv bf16 byte table" ? 2 : 0;
      const int64_t gmax = r.variant == "tile" ? 0 : int64_t{1} << 40;
      detail::Fp8Tuning t;
      t.gemv_lut = lut;
      t.gemv_max_n = t.gemv_f32_max_n = t.gemv_max_x_bytes = t.gemv_f32_max_x_bytes = gmax;
      r.path = detail::linear_fp8_path_name(r.n, r.cols, ActPrecision::bf16, LinearOrder::fastest, t);
      int64_t call = 0;
      r.fp8_s = std::min(r.fp8_s, time_cold([&] {
        detail::linear_fp8_tuned(x.data(), r.n, r.cols, fs.get(call++), r.rows, r.cols, y.data(), r.rows,
                                 ActPrecision::bf16, &pool, scratch, false, LinearOrder::fastest, t);
      }, fs.count, min_s));
    }
  }
  const double bw = measure_read_bandwidth(pool);
  best_read = std::max(best_read, bw);
  worst_read = std::min(worst_read, bw);
  std::printf("read bandwidth, best (worst) of %d samples: %.2f (%.2f) GB/s\n\n", rounds + 1, best_read / 1e9,
              worst_read / 1e9);
  std::printf("bf16 activations; W bytes include the float32 block scales\n");
  std::printf("| W [rows, cols] | n | fp8 path | bf16 us | fp8 us | bf16 W GB/s | fp8 W GB/s | bf16 frac read BW | "
              "fp8 frac read BW | fp8 speedup (bf16 time / fp8 time) |\n");
  std::printf("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : table)
    std::printf("| [%lld, %lld] | %lld | %s | %.1f | %.1f | %.2f | %.2f | %.3f | %.3f | %.2f |\n",
                static_cast<long long>(r.rows), static_cast<long long>(r.cols), static_cast<long long>(r.n),
                r.path.c_str(), r.bf16_s * 1e6, r.fp8_s * 1e6, r.bf16_bytes / r.bf16_s / 1e9,
                r.fp8_bytes / r.fp8_s / 1e9, r.bf16_bytes / r.bf16_s / best_read, r.fp8_bytes / r.fp8_s / best_read,
                r.bf16_s / r.fp8_s);
  std::printf("\nfp8 kernel variants (bf16 activations)\n| W [rows, cols] | n | variant | path | us | fp8 W GB/s |\n"
              "|---|---:|---|---|---:|---:|\n");
  for (const Row& r : variants)
    std::printf("| [%lld, %lld] | %lld | %s | %s | %.1f | %.2f |\n", static_cast<long long>(r.rows),
                static_cast<long long>(r.cols), static_cast<long long>(r.n), r.variant.c_str(), r.path.c_str(),
                r.fp8_s * 1e6, r.fp8_bytes / r.fp8_s / 1e9);
  return 0;
}

// ---- --fp8-dequant ----
// The tile path's dequantization alone (fp8_dequant_rows_bf16_avx512, tiles of the default
// tile_rows, one thread) over cold sets of 256 MiB per shape, against a one-thread read of
// 256 MiB in the same rounds: ns per weight and the FP8 bytes read per second; median [min,
// max] over the rounds.
int run_fp8_dequant(int rounds, const std::vector<int>& shapes) {
  if (active_isa() != Isa::avx512) {
    std::printf("no AVX-512 BF16 on this CPU: the tile dequantization measured here is not used\n");
    return 0;
  }
  ThreadPool one(1);
  const int64_t tile = detail::Fp8Tuning{}.tile_rows;
  std::vector<Fp8Set> sets;
  for (size_t i = 0; i + 1 < shapes.size(); i += 2)
    sets.push_back(make_fp8_weights(shapes[i], shapes[i + 1], 256.0 * 1024 * 1024));
  std::vector<std::vector<double>> ns(sets.size());
  std::vector<double> bw;
  std::vector<uint16_t> out;
  for (int round = 0; round < rounds; ++round) {
    bw.push_back(measure_read_bandwidth(one, size_t{256} << 20, 1));
    for (size_t k = 0; k < sets.size(); ++k) {
      const Fp8Set& w = sets[k];
      out.resize(static_cast<size_t>(std::min(tile, w.rows) * w.cols));
      const int64_t s = now_ns();
      for (int64_t m = 0; m < w.count; ++m)
        for (int64_t r = 0; r < w.rows; r += tile)
          detail::fp8_dequant_rows_bf16_avx512(w.get(m), w.cols, r, std::min(w.rows, r + tile), out.data());
      ns[k].push_back(static_cast<double>(now_ns() - s) / static_cast<double>(w.count * w.rows * w.cols));
    }
  }
  const SampleSummary b = summarize(bw);
  std::printf("one thread, tiles of %lld rows, %d rounds; one-thread read of 256 MiB: %.2f GB/s median [%.2f, %.2f]\n",
              static_cast<long long>(tile), rounds, b.median / 1e9, b.min / 1e9, b.max / 1e9);
  std::printf(
      "| W [rows, cols] | ns per weight, median [min, max] | FP8 GB/s (median) | fraction of the read |\n"
      "|---|---:|---:|---:|\n");
  for (size_t k = 0; k < sets.size(); ++k) {
    const SampleSummary t = summarize(ns[k]);
    std::printf("| [%lld, %lld] | %.4f [%.4f, %.4f] | %.2f | %.2f |\n", static_cast<long long>(sets[k].rows),
                static_cast<long long>(sets[k].cols), t.median, t.min, t.max, 1.0 / t.median, 1e9 / t.median / b.median);
  }
  return 0;
}

// 10th percentile of single-call times (bf16 activations) over min_seconds of calls cycling
// through the cold weight set. On a loaded machine most calls share the cores or the memory
// bus with other processes; the fast tail is the closest to the kernel's own speed.
double time_calls_p10(const WeightSet& w, int64_t n, ThreadPool& pool, double min_seconds,
                      const detail::LinearTuning& tuning) {
  std::vector<float> x(static_cast<size_t>(n * w.cols)), y(static_cast<size_t>(n * w.rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  ScratchArena scratch(pool.size());  // the kernels' working memory, reused by every call
  int64_t call = 0;
  auto one = [&] {
    detail::linear_tuned(x.data(), n, w.cols, w.get(call++), w.dtype, w.rows, w.cols, y.data(), w.rows,
                         ActPrecision::bf16, &pool, scratch, false, tuning);
  };
  for (int64_t i = 0; i < w.count; ++i) one();
  std::vector<double> t;
  const int64_t t_end = now_ns() + static_cast<int64_t>(min_seconds * 1e9);
  while (static_cast<int64_t>(t.size()) < 2 * w.count || now_ns() < t_end) {
    const int64_t s = now_ns();
    one();
    t.push_back(static_cast<double>(now_ns() - s) * 1e-9);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 10];
}

// ---- --small-n ----
// bf16 x bf16 expert products at n = 1..32 tokens, small-n layouts interleaved in every
// round, read bandwidth sampled before every round; per round the 10th percentile of
// single-call times (time_calls_p10); median and range of those over the rounds.
int run_small_n(ThreadPool& pool, int rounds, const std::vector<int>& variants, const std::vector<int>& ns,
                const std::vector<int>& shapes, int row_streams) {
  const double cold = 256.0 * 1024 * 1024;
  std::vector<WeightSet> sets;
  sets.reserve(shapes.size() / 2);
  for (size_t i = 0; i + 1 < shapes.size(); i += 2)
    sets.push_back(make_weights(DType::bf16, shapes[i], shapes[i + 1], cold));
  struct Row {
    const WeightSet* w;
    int64_t n;
    int variant;
    std::vector<double> s;
  };
  std::vector<Row> rows;
  for (const WeightSet& w : sets)
    for (int n : ns)
      for (int v : variants) rows.push_back({&w, n, v, {}});
  std::vector<double> bw;
  for (int r = 0; r < rounds; ++r) {
    bw.push_back(measure_read_bandwidth(pool, size_t{256} << 20, 2));
    for (Row& row : rows) {
      // variant = layout + 10 * (x block KiB, < 1000) + 1e4 * (least prefetch distance KiB, < 1000)
      // + 1e7 * (row chunk: 0 the default, 1 none, k >= 2: k * 16 KiB).
      const int chunk = row.variant / 10000000;
      // 0 KiB (or a layout other than 0, 3, 4): the default.
      detail::LinearTuning tuning;
      tuning.pairs_min_n = row.variant % 10 == 9 ? 1 : int64_t{1} << 40;
      tuning.row_streams = row_streams;
      const int layout = row.variant % 10;
      const int64_t x_bytes = int64_t{row.variant / 10 % 1000} * 1024;
      const int64_t pf_min = int64_t{row.variant / 10000 % 1000} * 1024;
      if (layout == 0 || layout == 3 || layout == 4) tuning.small_n_layout = layout;
      tuning.row_seq_max_n = layout == 5 ? static_cast<int>(detail::kRowSeqMaxN) : 1;
      if (x_bytes != 0) tuning.small_n_x_bytes = x_bytes;
      if (pf_min != 0) tuning.small_n_prefetch_min_bytes = pf_min;
      if (chunk != 0) tuning.small_n_chunk_bytes = chunk == 1 ? 0 : int64_t{chunk} * 16 * 1024;
      row.s.push_back(time_calls_p10(*row.w, row.n, pool, 0.1, tuning));
    }
  }
  const double bw_med = median(bw);
  std::printf("read bandwidth per round (GB/s):");
  for (double b : bw) std::printf(" %.1f", b / 1e9);
  std::printf("; median %.2f\n", bw_med / 1e9);
  std::printf(
      "| W [rows, cols] | n | layout | us/call p10, median | range | GB/s (median) | frac read BW (median) | frac read BW (best) |\n");
  std::printf("|---|---:|---:|---:|---|---:|---:|---:|\n");
  for (const Row& row : rows) {
    const double m = median(row.s);
    const auto [lo, hi] = std::minmax_element(row.s.begin(), row.s.end());
    std::printf("| [%lld, %lld] | %lld | %d | %.1f | %.1f-%.1f | %.2f | %.3f | %.3f |\n",
                static_cast<long long>(row.w->rows), static_cast<long long>(row.w->cols), static_cast<long long>(row.n),
                row.variant, m * 1e6, *lo * 1e6, *hi * 1e6, row.w->bytes_one() / m / 1e9,
                row.w->bytes_one() / m / bw_med, row.w->bytes_one() / *lo / *std::max_element(bw.begin(), bw.end()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false, compare = false, tune = false, fp8 = false, fp8_weights = false, fp8_dequant = false;
  std::vector<int> small_n, small_ns = {1, 2, 4, 8, 16, 32}, shapes = {768, 2048, 2048, 768};
  int rounds_arg = 5, row_streams = 1;
  bool shapes_given = false, ops = false;
  std::string ops_filter, ops_model;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--compare-sgemm")) compare = true;
    else if (!std::strcmp(argv[i], "--tune")) tune = true;
    else if (!std::strcmp(argv[i], "--fp8")) fp8 = true;
    else if (!std::strcmp(argv[i], "--fp8-weights")) fp8_weights = true;
    else if (!std::strcmp(argv[i], "--fp8-dequant")) fp8_dequant = true;
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds_arg = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--row-streams") && i + 1 < argc) row_streams = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ops")) ops = true;
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) ops_filter = argv[++i];
    else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) ops_model = argv[++i];
    else if ((!std::strcmp(argv[i], "--small-n") || !std::strcmp(argv[i], "--ns") ||
              !std::strcmp(argv[i], "--shapes")) &&
             i + 1 < argc) {
      std::vector<int>& out = !std::strcmp(argv[i], "--ns")       ? small_ns
                              : !std::strcmp(argv[i], "--shapes") ? shapes
                                                                  : small_n;
      shapes_given = shapes_given || &out == &shapes;
      out.clear();
      for (const char* p = argv[++i]; *p;) {
        out.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: bench_kernels [--threads N] [--quick] [--compare-sgemm] [--tune [--shapes ROWS,COLS,..]] [--fp8] "
          "[--fp8-weights] [--fp8-dequant [--shapes ..] [--rounds R]] [--small-n V,.. [--ns N,..] [--shapes "
          "ROWS,COLS,..] [--rounds R] [--row-streams S]] [--ops [--filter SUBSTR] [--model default|bench] [--rounds R]]\n");
      return 2;
    }
  }
  if (ops) return bench::run_kernel_ops(threads, rounds_arg, ops_filter, ops_model);
  if (fp8) return run_fp8(quick);
  if (fp8_weights) return run_fp8_weights(threads, quick);
  if (fp8_dequant)
    return run_fp8_dequant(rounds_arg, shapes_given ? shapes : std::vector<int>{512, 2048, 2048, 512, 1024, 7168});
  ThreadPool pool(threads);
  if (!small_n.empty()) return run_small_n(pool, rounds_arg, small_n, small_ns, shapes, row_streams);
  if (tune) {
    // n == 1: prefetch distance x rows per tile, interleaved rounds (best of rounds), each round
    // also timing a plain read of 256 MiB as a noise reference. Shapes: --shapes when given
    // (cold sets of 256 MiB), else one 128 MiB matrix [8192, 8192].
    std::vector<WeightSet> sets;
    if (shapes_given)
      for (size_t i = 0; i + 1 < shapes.size(); i += 2)
        sets.push_back(make_weights(DType::bf16, shapes[i], shapes[i + 1], 256.0 * 1024 * 1024));
    else
      sets.push_back(make_weights(DType::bf16, 8192, 8192, 1));
    const int64_t pfs[] = {0, 1024, 4096, 8192, 16384};
    // rows per tile (1: rows one at a time), and for 1 the row streams of bf16 x bf16.
    const std::pair<int, int> rs[] = {{1, 1}, {1, 2}, {1, 4}, {4, 1}, {8, 1}};
    constexpr int kModes = static_cast<int>(std::size(rs));
    std::vector<std::array<std::array<std::array<double, 2>, 5>, kModes>> best(sets.size());
    double best_read = 0;
    for (int round = 0; round < 5; ++round) {
      best_read = std::max(best_read, measure_read_bandwidth(pool, size_t{256} << 20, 2));
      for (size_t si = 0; si < sets.size(); ++si)
        for (int ri = 0; ri < kModes; ++ri)
          for (int pi = 0; pi < 5; ++pi) {
            detail::LinearTuning tuning;
            tuning.prefetch_bytes = pfs[pi];
            tuning.rows_single = rs[ri].first;
            tuning.row_streams = rs[ri].second;
            for (int pr = 0; pr < 2; ++pr) {
              Result r = time_linear(sets[si], 1, pr ? ActPrecision::f32 : ActPrecision::bf16, pool, 0.1, tuning);
              best[si][ri][pi][pr] = std::max(best[si][ri][pi][pr], sets[si].bytes_one() / r.sec_per_call);
            }
          }
    }
    std::printf(
        "plain read (256 MiB): %.2f GB/s\n| W [rows, cols] | rows/tile | row streams | prefetch B | bf16 act GB/s | f32 act GB/s |\n|---|---|---|---|---|---|\n",
        best_read / 1e9);
    for (size_t si = 0; si < sets.size(); ++si)
      for (int ri = 0; ri < kModes; ++ri)
        for (int pi = 0; pi < 5; ++pi)
          std::printf("| [%lld, %lld] | %d | %d | %lld | %.2f | %.2f |\n", static_cast<long long>(sets[si].rows),
                      static_cast<long long>(sets[si].cols), rs[ri].first, rs[ri].second,
                      static_cast<long long>(pfs[pi]), best[si][ri][pi][0] / 1e9, best[si][ri][pi][1] / 1e9);
    return 0;
  }
  const double min_s = quick ? 0.03 : 0.1;
  const int rounds = quick ? 1 : 3;
  std::printf("threads %d, cpu features: %s, isa: %s, rounds %d\n", threads, cpu_features().to_string().c_str(),
              isa_name(active_isa()), rounds);

  const double cold = 256.0 * 1024 * 1024;  // total bytes per weight set: 8x the 32 MiB L3
  // One large matrix each (128 MiB, 4x L3) for decode batch 1; MoE expert projections
  // (Qwen3-30B-A3B sizes: gate/up [768, 2048], down [2048, 768]) as cold sets.
  WeightSet big = make_weights(DType::bf16, 8192, 8192, 1);
  WeightSet bigf = make_weights(DType::f32, 8192, 4096, 1);
  WeightSet up = make_weights(DType::bf16, 768, 2048, cold);
  WeightSet down = make_weights(DType::bf16, 2048, 768, cold);
  WeightSet upf = compare ? make_weights(DType::f32, 768, 2048, cold) : WeightSet{DType::f32, 0, 0, 0, {}};
  std::vector<Case> cases;
  for (const WeightSet* w : {&big, &bigf})
    for (auto prec : {ActPrecision::bf16, ActPrecision::f32}) cases.push_back({w, 1, prec, -2, ""});
  std::vector<int64_t> ns = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  if (quick) ns = {1, 8, 64, 256};
  for (const WeightSet* w : {&up, &down})
    for (auto prec : {ActPrecision::bf16, ActPrecision::f32})
      for (int64_t n : ns) cases.push_back({w, n, prec, -2, ""});
  if (compare) {
    // Tile kernels vs OpenBLAS sgemm for f32 activations (decides LinearTuning::blas_min_n).
    for (const WeightSet* w : {&up, &upf})
      for (int64_t n : {16, 32, 64, 128, 256}) {
        cases.push_back({w, n, ActPrecision::f32, int64_t{1} << 40, ""});
        cases.push_back({w, n, ActPrecision::f32, 1, ""});
      }
  }

  // Rounds over all cases, with the machine limits measured before each round and at the
  // end; on a shared machine the best of each is the closest to the machine's own capability.
  Limits best, worst{1e30, 1e30, 1e30, 1e30, 1e30};
  auto sample_limits = [&] {
    Limits l;
    l.read_bw = measure_read_bandwidth(pool);
    l.copy_bw = measure_copy_bandwidth(pool);
    l.gemm_f32 = measure_gemm_flops(pool, DType::f32);
    l.peak_f32 = measure_peak_flops(pool, DType::f32);
    l.peak_bf16 = measure_peak_flops(pool, DType::bf16);
    auto upd = [](double& b, double& w, double v) { b = std::max(b, v); w = std::min(w, v); };
    upd(best.read_bw, worst.read_bw, l.read_bw);
    upd(best.copy_bw, worst.copy_bw, l.copy_bw);
    upd(best.gemm_f32, worst.gemm_f32, l.gemm_f32);
    upd(best.peak_f32, worst.peak_f32, l.peak_f32);
    upd(best.peak_bf16, worst.peak_bf16, l.peak_bf16);
  };
  for (int r = 0; r < rounds; ++r) {
    sample_limits();
    for (Case& c : cases) run_case(c, pool, min_s);
  }
  sample_limits();
  std::printf("limits, best (worst) of %d samples: read %.2f (%.2f) GB/s, copy %.2f (%.2f) GB/s, OpenBLAS sgemm "
              "m=1024,n=2048,k=2048 %.1f (%.1f) GFLOP/s, peak FMA f32 %.1f (%.1f) GFLOP/s, peak vdpbf16ps "
              "%.1f (%.1f) GFLOP/s\n\n",
              rounds + 1, best.read_bw / 1e9, worst.read_bw / 1e9, best.copy_bw / 1e9, worst.copy_bw / 1e9,
              best.gemm_f32 / 1e9, worst.gemm_f32 / 1e9, best.peak_f32 / 1e9, worst.peak_f32 / 1e9,
              best.peak_bf16 / 1e9, worst.peak_bf16 / 1e9);
  print_table(cases, best);
  return 0;
}
