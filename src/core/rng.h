// Rng: xoshiro256** seeded through splitmix64, with its own uniform and geometric
// sampling so that a seeded simulation gives the same bits on every platform and standard
// library (std:: distributions are implementation-defined). Not thread-safe; one per run.
// Used by the simulator (plan/) and by make-model's weight generator (model/).
#pragma once

#include <cmath>
#include <cstdint>

namespace afd {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& w : s_) w = splitmix64(&x);
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1]: 53 random bits.
  double uniform_open0() { return (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (hi >= lo); multiply-shift, bias < 2^-32 for small ranges.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * span;
    return lo + static_cast<int64_t>(m >> 64);
  }
  // Geometric on {0, 1, 2, ...} with success probability p in (0, 1]: P(k) = (1-p)^k p.
  int64_t geometric(double p) {
    if (p >= 1.0) return 0;
    return static_cast<int64_t>(std::floor(std::log(uniform_open0()) / std::log1p(-p)));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace afd
