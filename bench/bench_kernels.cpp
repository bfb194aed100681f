// bench_kernels: times the CPU kernels against the machine limits measured in the same run.
//   bench_kernels [--threads N] [--quick] [--compare-sgemm] [--tune]
// Prints a Markdown table: kernel path, W shape, n, precision, time per call, GB/s of W
// streamed, GFLOP/s, fraction of the measured read bandwidth and of the library GEMM rate.
// Weights are cold: each timed call uses the next of a set of distinct matrices whose total
// size is several times the L3 cache, as MoE decode touches different experts every step.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernels/cpu/isa.h"
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
Result time_linear(const WeightSet& w, int64_t n, ActPrecision prec, ThreadPool& pool, double min_seconds) {
  std::vector<float> x(static_cast<size_t>(n * w.cols)), y(static_cast<size_t>(n * w.rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  int64_t call = 0;
  auto one = [&] {
    linear(x.data(), n, w.cols, w.get(call++), w.dtype, w.rows, w.cols, y.data(), w.rows, prec, &pool);
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

void print_header() {
  std::printf("| kernel path | W [rows, cols] dtype | n | act | time/call (us) | W GB/s | GFLOP/s | "
              "frac read BW | frac sgemm | frac peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
}

void run_case(const WeightSet& w, int64_t n, ActPrecision prec, ThreadPool& pool, const Limits& lim,
              double min_seconds, const char* label_override = nullptr) {
  Result r = time_linear(w, n, prec, pool, min_seconds);
  double gbs = w.bytes_one() / r.sec_per_call;
  double flops = 2.0 * static_cast<double>(n) * w.rows * w.cols / r.sec_per_call;
  const bool bf_act = prec == ActPrecision::bf16;
  double peak = (bf_act && w.dtype == DType::bf16) ? lim.peak_bf16 : lim.peak_f32;
  std::printf("| %s | [%lld, %lld] %s | %lld | %s | %.1f | %.1f | %.1f | %.3f | %.3f | %.3f |\n",
              label_override ? label_override : linear_path_name(n, w.dtype, prec),
              static_cast<long long>(w.rows), static_cast<long long>(w.cols), dtype_name(w.dtype),
              static_cast<long long>(n), bf_act ? "bf16" : "f32", r.sec_per_call * 1e6, gbs / 1e9, flops / 1e9,
              gbs / lim.read_bw, flops / lim.gemm_f32, peak > 0 ? flops / peak : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false, compare = false, tune = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--compare-sgemm")) compare = true;
    else if (!std::strcmp(argv[i], "--tune")) tune = true;
    else {
      std::fprintf(stderr, "usage: bench_kernels [--threads N] [--quick] [--compare-sgemm] [--tune]\n");
      return 2;
    }
  }
  ThreadPool pool(threads);
  if (tune) {
    // n == 1 on a 128 MiB bf16 matrix: prefetch distance x rows per tile, interleaved rounds
    // (best of rounds), each round also timing a plain read of 256 MiB as a noise reference.
    WeightSet big = make_weights(DType::bf16, 8192, 8192, 1);
    const int64_t pfs[] = {0, 512, 1024, 2048, 4096};
    const int rs[] = {4, 8};
    double best[2][5][2] = {};
    double best_read = 0;
    for (int round = 0; round < 5; ++round) {
      best_read = std::max(best_read, measure_read_bandwidth(pool, size_t{256} << 20, 2));
      for (int ri = 0; ri < 2; ++ri)
        for (int pi = 0; pi < 5; ++pi) {
          detail::set_linear_avx512_tuning(pfs[pi], rs[ri]);
          for (int pr = 0; pr < 2; ++pr) {
            Result r = time_linear(big, 1, pr ? ActPrecision::f32 : ActPrecision::bf16, pool, 0.1);
            best[ri][pi][pr] = std::max(best[ri][pi][pr], big.bytes_one() / r.sec_per_call);
          }
        }
    }
    std::printf("plain read (256 MiB): %.2f GB/s\n| rows/tile | prefetch B | bf16 act GB/s | f32 act GB/s |\n|---|---|---|---|\n",
                best_read / 1e9);
    for (int ri = 0; ri < 2; ++ri)
      for (int pi = 0; pi < 5; ++pi)
        std::printf("| %d | %lld | %.2f | %.2f |\n", rs[ri], static_cast<long long>(pfs[pi]), best[ri][pi][0] / 1e9,
                    best[ri][pi][1] / 1e9);
    return 0;
  }
  const double min_s = quick ? 0.03 : 0.1;
  Limits lim;
  lim.read_bw = measure_read_bandwidth(pool);
  lim.copy_bw = measure_copy_bandwidth(pool);
  lim.gemm_f32 = measure_gemm_flops(pool, DType::f32);
  lim.peak_f32 = measure_peak_flops(pool, DType::f32);
  lim.peak_bf16 = measure_peak_flops(pool, DType::bf16);
  auto print_limits = [&](const char* when) {
    std::printf("%s: read %.2f GB/s, copy %.2f GB/s, OpenBLAS sgemm (m=1024,n=2048,k=2048) %.1f GFLOP/s, "
                "peak FMA f32 %.1f GFLOP/s, peak vdpbf16ps %.1f GFLOP/s\n",
                when, lim.read_bw / 1e9, lim.copy_bw / 1e9, lim.gemm_f32 / 1e9, lim.peak_f32 / 1e9,
                lim.peak_bf16 / 1e9);
  };
  std::printf("threads %d, cpu features: %s, isa: %s\n", threads, cpu_features().to_string().c_str(),
              isa_name(active_isa()));
  print_limits("limits measured at start");
  std::printf("(fractions below use these; the limits are measured again at the end and both printed)\n\n");

  const double cold = 256.0 * 1024 * 1024;  // total bytes per weight set: 8x the 32 MiB L3
  print_header();
  {
    // One large matrix (128 MiB, 4x L3): decode batch 1.
    WeightSet big = make_weights(DType::bf16, 8192, 8192, 1);
    for (auto prec : {ActPrecision::bf16, ActPrecision::f32}) run_case(big, 1, prec, pool, lim, min_s);
    WeightSet bigf = make_weights(DType::f32, 8192, 4096, 1);
    for (auto prec : {ActPrecision::bf16, ActPrecision::f32}) run_case(bigf, 1, prec, pool, lim, min_s);
  }
  // MoE expert projections (Qwen3-30B-A3B sizes): gate/up [768, 2048], down [2048, 768], cold.
  std::vector<int64_t> ns = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  if (quick) ns = {1, 8, 64, 256};
  for (auto shape : {std::pair<int64_t, int64_t>{768, 2048}, std::pair<int64_t, int64_t>{2048, 768}}) {
    WeightSet w = make_weights(DType::bf16, shape.first, shape.second, cold);
    for (auto prec : {ActPrecision::bf16, ActPrecision::f32})
      for (int64_t n : ns) run_case(w, n, prec, pool, lim, min_s);
  }
  if (compare) {
    // Tile kernels vs OpenBLAS sgemm for f32 activations (decides linear_blas_min_n).
    for (DType dt : {DType::bf16, DType::f32}) {
      WeightSet w = make_weights(dt, 768, 2048, cold);
      const bool wb = dt == DType::bf16;
      const int64_t saved = detail::linear_blas_min_n(wb, false);
      for (int64_t n : {16, 32, 64, 128, 256}) {
        detail::set_linear_blas_min_n(wb, false, int64_t{1} << 40);
        run_case(w, n, ActPrecision::f32, pool, lim, min_s);
        detail::set_linear_blas_min_n(wb, false, 1);
        run_case(w, n, ActPrecision::f32, pool, lim, min_s);
      }
      detail::set_linear_blas_min_n(wb, false, saved);
    }
  }
  Limits end;
  end.read_bw = measure_read_bandwidth(pool);
  end.copy_bw = measure_copy_bandwidth(pool);
  end.gemm_f32 = measure_gemm_flops(pool, DType::f32);
  end.peak_f32 = measure_peak_flops(pool, DType::f32);
  end.peak_bf16 = measure_peak_flops(pool, DType::bf16);
  std::swap(lim, end);
  std::printf("\n");
  print_limits("limits measured at end");
  return 0;
}
