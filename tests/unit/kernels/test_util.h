// Shared helpers for the kernel tests: ISA levels to test, random data.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"

namespace afd::kernels::testing {

// Every level up to what this process may use (after AFD_CPU_DISABLE masking).
inline std::vector<Isa> isa_levels() {
  std::vector<Isa> v;
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) v.push_back(static_cast<Isa>(i));
  return v;
}

// Restores the ISA limit when a test ends, even on failure.
struct IsaLimitGuard {
  explicit IsaLimitGuard(Isa isa) { set_isa_limit(isa); }
  ~IsaLimitGuard() { set_isa_limit(Isa::avx512); }
};

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace afd::kernels::testing
