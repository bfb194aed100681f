// bench_sampler: the cost of sampling one token from a row of logits (Sampler::sample), the
// per-sequence work a decode step adds after the LM head, by vocabulary size and sampling
// settings; and with a structured-outputs token mask that allows a tenth of the vocabulary.
// Rows: Gaussian logits (sd 3, a flat distribution: the worst case for a nucleus) and a peaked
// row (a trained model's typical shape: one token far ahead). Prints median / p90 µs per sample.
// Usage: bench_sampler [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/stats.h"
#include "runtime/sampler.h"

using namespace afd;

int main(int argc, char** argv) {
  int reps = 200;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  std::printf("| vocab | row | temperature | top_p | top_k | mask | logprob | median us | p90 us |\n");
  std::printf("|---:|---|---:|---:|---:|---|---|---:|---:|\n");
  for (int64_t vocab : {32000, 129280, 151936}) {
    std::mt19937 gen(1);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> flat(static_cast<size_t>(vocab)), peaked(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) {
      flat[i] = normal(gen);
      peaked[i] = normal(gen) * 0.5f;
    }
    peaked[123] = 20.0f;
    std::vector<uint64_t> mask(static_cast<size_t>((vocab + 63) / 64), 0);
    for (int64_t i = 0; i < vocab; i += 10) mask[i / 64] |= uint64_t{1} << (i % 64);
    struct Setting {
      const char* row;
      float temperature, top_p;
      int64_t top_k;
      bool masked, logprob;
    };
    for (const Setting& s :
         {Setting{"flat", 0.0f, 1.0f, 0, false, false}, Setting{"flat", 0.0f, 1.0f, 0, false, true},
          Setting{"flat", 1.0f, 1.0f, 0, false, false}, Setting{"flat", 0.7f, 0.9f, 0, false, false},
          Setting{"flat", 1.0f, 1.0f, 40, false, false}, Setting{"peaked", 1.0f, 1.0f, 0, false, false},
          Setting{"flat", 1.0f, 1.0f, 0, true, false}}) {
      SamplingParams p;
      p.logprob = s.logprob;
      p.temperature = s.temperature;
      p.top_p = s.top_p;
      p.top_k = s.top_k;
      p.seed = 7;
      Sampler sampler(p);
      const std::vector<float>& row = std::strcmp(s.row, "flat") ? peaked : flat;
      std::vector<double> us;
      int64_t sink = 0;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        sink += sampler.sample(row.data(), vocab, s.masked ? mask.data() : nullptr).token;
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("| %ld | %s | %.1f | %.1f | %ld | %s | %s | %.1f | %.1f |\n", static_cast<long>(vocab), s.row,
                  s.temperature, s.top_p, static_cast<long>(s.top_k), s.masked ? "1/10" : "-", s.logprob ? "yes" : "no",
                  quantile(us, 0.5), quantile(us, 0.9));
      if (sink == -1) std::printf("\n");
    }
  }
  return 0;
}
