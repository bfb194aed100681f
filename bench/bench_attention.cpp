// Times gqa_attend_one (one query token, one KV head group) over a long bf16 context,
// single-threaded, and reports the achieved KV read bandwidth and FLOP rate (best of `reps`),
// and the time to store one token's K and V rows (PagedKvCache::write).
// Usage: bench_attention [ctx] [n_kv_heads] [reps]. AFD_CPU_DISABLE=avx512 times the portable
// kernel instead of the tiled AVX-512 one (see gqa_attention.cpp).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/timer.h"
#include "model/gqa_attention.h"

namespace {

// argv[i] as a whole number in [1, max], or `fallback` when absent; -1 if it is not one.
int64_t positive_arg(int argc, char** argv, int i, int64_t fallback, int64_t max) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(argv[i], &end, 10);
  return end != argv[i] && *end == 0 && v >= 1 && v <= max ? v : -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace afd;
  const int64_t ctx = positive_arg(argc, argv, 1, 4096, int64_t{1} << 24);
  const int64_t n_kv = positive_arg(argc, argv, 2, 4, 64), n_heads = 8 * n_kv, hd = 128;
  const int reps = static_cast<int>(positive_arg(argc, argv, 3, 20, 100000));
  if (argc > 4 || ctx < 0 || n_kv < 0 || reps < 0) {
    std::fprintf(stderr, "usage: bench_attention [ctx (1..2^24, 4096)] [n_kv_heads (1..64, 4)] [reps (20)]\n");
    return 2;
  }
  for (DType dt : {DType::bf16, DType::f8_e4m3, DType::f32}) {
    KvCacheConfig c{1, n_kv, hd, 16, (ctx + 15) / 16, dt};
    auto kv = PagedKvCache::create(c);
    if (!kv.ok()) {
      std::fprintf(stderr, "bench_attention: %s\n", kv.status().to_string().c_str());
      return 1;
    }
    (void)(*kv)->add_sequence(0);
    (void)(*kv)->append(0, ctx);
    std::vector<float> k(n_kv * hd), q(n_heads * hd), out(n_heads * hd);
    for (int64_t j = 0; j < ctx; ++j) {
      for (int64_t i = 0; i < n_kv * hd; ++i) k[i] = 0.01f * ((j * 31 + i * 7) % 101 - 50);
      (*kv)->write(0, 0, j, k.data(), k.data());
    }
    // Storing one token's K and V rows (what every decode step does per layer): best of reps
    // passes over all positions, the pages already touched by the fill above.
    double store_best = 1e9;
    for (int rep = 0; rep < reps; ++rep) {
      int64_t t0 = now_ns();
      for (int64_t j = 0; j < ctx; ++j) (*kv)->write(0, 0, j, k.data(), k.data());
      store_best = std::min(store_best, (now_ns() - t0) * 1e-9 / static_cast<double>(ctx));
    }
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * (i % 13);
    GqaShape s{n_heads, n_kv, hd, 0};
    ScratchSlot scratch;
    double best = 1e9;
    for (int rep = 0; rep < reps; ++rep) {
      int64_t t0 = now_ns();
      for (int64_t g = 0; g < n_kv; ++g) gqa_attend_one(**kv, 0, 0, ctx, g, s, q.data(), out.data(), scratch);
      best = std::min(best, (now_ns() - t0) * 1e-9);
    }
    double bytes = 2.0 * ctx * n_kv * hd * dtype_size(dt);
    double flops = 4.0 * ctx * n_heads * hd;
    std::printf("kv=%-8s ctx=%lld  %.3f ms  %.1f GB/s  %.1f GFLOP/s  store K+V of a token %.0f ns\n", dtype_name(dt),
                (long long)ctx, best * 1e3, bytes / best / 1e9, flops / best / 1e9, store_best * 1e9);
  }
}
