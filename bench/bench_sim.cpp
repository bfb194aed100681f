// bench_sim: throughput of the AFD discrete-event simulator (src/plan/simulator.h).
// Prints (1) timed events per second for single runs of the A/F ratio paper baseline at several
// ratios, one thread each, and (2) the wall time of the A/F ratio paper's full sweep (r = 1, 2, 4, 8,
// 16, 24, 32; B = 256, μ_P = 100, μ_D = 500, N = 10,000 per attention instance), serially
// and on a thread pool. Each figure is the best of --reps runs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "core/timer.h"
#include "plan/sim_sweep.h"
#include "plan/simulator.h"

using namespace afd;
using namespace afd::plan;

namespace {

SimConfig baseline() {
  SimConfig c;
  c.batch = 256;
  c.requests_per_attn = 10000;
  c.prefill = {LengthDistKind::fixed, 100, 0};
  c.decode = {LengthDistKind::geometric, 500, 0};
  c.latency = af_ratio_paper_profile();
  c.seed = 1;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_sim [--reps N]\n");
      return 2;
    }
  }

  std::printf("bench_sim: AFD discrete-event simulator, A/F ratio paper baseline (B=256, mu_P=100, mu_D=500, N=10000/instance)\n");
  std::printf("event = one timed event popped from the queue (attention done, transfer done, FFN done)\n\n");
  std::printf("%-10s %12s %12s %10s %14s %14s\n", "bundle", "events", "requests", "wall s", "events/s", "requests/s");
  double total_events = 0, total_wall = 0;
  for (int64_t r : {1, 8, 32}) {
    SimConfig c = baseline();
    c.n_attn = r;
    double best = 1e300;
    SimResult res;
    for (int k = 0; k < reps; ++k) {
      const double t0 = now_s();
      auto out = simulate(c);
      const double dt = now_s() - t0;
      if (!out.ok()) {
        std::fprintf(stderr, "bench_sim: %s\n", out.status().to_string().c_str());
        return 1;
      }
      res = *out;
      best = std::min(best, dt);
    }
    total_events += static_cast<double>(res.events);
    total_wall += best;
    char name[32];
    std::snprintf(name, sizeof name, "%lldA-1F", static_cast<long long>(r));
    std::printf("%-10s %12lld %12lld %10.4f %14.3e %14.3e\n", name, static_cast<long long>(res.events),
                static_cast<long long>(res.n_requests), best, res.events / best, res.n_requests / best);
  }
  std::printf("%-10s %12.0f %12s %10.4f %14.3e\n\n", "all", total_events, "", total_wall, total_events / total_wall);

  std::vector<RatioSpec> ratios;
  for (int64_t r : {1, 2, 4, 8, 16, 24, 32}) ratios.push_back({r, 1});
  std::printf("%-28s %8s %12s %10s %14s\n", "full A/F-ratio-paper sweep", "threads", "events", "wall s", "events/s");
  const int hw = ThreadPool(0).size();
  for (int threads : {1, hw}) {
    if (threads == hw && hw == 1) break;
    ThreadPool pool(threads);
    double best = 1e300, events = 0;
    for (int k = 0; k < reps; ++k) {
      const double t0 = now_s();
      auto pts = run_ratio_sweep(baseline(), ratios, threads > 1 ? &pool : nullptr);
      const double dt = now_s() - t0;
      if (!pts.ok()) {
        std::fprintf(stderr, "bench_sim: %s\n", pts.status().to_string().c_str());
        return 1;
      }
      events = 0;
      for (const auto& p : *pts) events += static_cast<double>(p.sim.events);
      best = std::min(best, dt);
    }
    std::printf("%-28s %8d %12.0f %10.4f %14.3e\n", "r = 1,2,4,8,16,24,32", threads, events, best, events / best);
  }
  return 0;
}
