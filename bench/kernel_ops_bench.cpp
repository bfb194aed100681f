#include "kernel_ops_bench.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/cpu_features.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "kernel_ops.h"
#include "kernels/cpu/isa.h"

namespace afd::bench {
namespace {

using kernels::ops::KernelOp;
using kernels::ops::OpCase;
using kernels::ops::Shape;

// Each round: enough calls for ~20 ms (at least one), after reset(); hot caches (the same
// inputs every call; in-place ops run on their own output).
constexpr double kRoundSeconds = 0.02;

// Seconds per call of f, one sample per round.
template <class F>
std::vector<double> time_rounds(OpCase& c, int rounds, F&& f) {
  c.reset();
  int64_t t0 = now_ns();
  f();  // warm-up: page faults, scratch, thread spin-up
  const double est = std::max(1e-8, static_cast<double>(now_ns() - t0) * 1e-9);
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(kRoundSeconds / est));
  std::vector<double> s;
  for (int r = 0; r < rounds; ++r) {
    c.reset();
    t0 = now_ns();
    for (int64_t i = 0; i < calls; ++i) f();
    s.push_back(static_cast<double>(now_ns() - t0) * 1e-9 / static_cast<double>(calls));
  }
  return s;
}

}  // namespace

int run_kernel_ops(int threads, int rounds, const std::string& filter, const std::string& model) {
  ThreadPool pool(threads);
  std::printf("bench_kernels --ops: threads %d, isa %s, cpu features: %s; %d rounds of >= %.0f ms each, hot caches\n\n",
              threads, kernels::isa_name(kernels::active_isa()), cpu_features().to_string().c_str(), rounds,
              kRoundSeconds * 1e3);
  std::printf("| op | model | shape | µs median | µs p90 | GB/s | GFLOP/s | ref µs median | ref µs p90 | × ref |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const KernelOp& op : kernels::ops::kernel_ops()) {
    if (!filter.empty() && op.name.find(filter) == std::string::npos) continue;
    for (const auto& [m, shapes] :
         {std::pair<const char*, const std::vector<Shape>*>{"default", &op.default_model_shapes},
          {"bench", &op.bench_model_shapes}}) {
      if (!model.empty() && model != m) continue;
      for (const Shape& s : *shapes) {
        std::unique_ptr<OpCase> c = op.make(s);
        const SampleSummary k = summarize(time_rounds(*c, rounds, [&] { c->run(&pool); }));
        std::printf("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f |", op.name.c_str(), m, s.label.c_str(), k.median * 1e6,
                    k.p90 * 1e6, c->bytes / k.median / 1e9, c->flops / k.median / 1e9);
        if (c->flops <= 1e8 && c->bytes <= 1e8) {
          const SampleSummary r = summarize(time_rounds(*c, rounds, [&] { c->reference(); }));
          std::printf(" %.2f | %.2f | %.1f |\n", r.median * 1e6, r.p90 * 1e6, r.median / k.median);
        } else {
          std::printf(" — | — | — |\n");
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace afd::bench
