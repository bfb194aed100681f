// Run-time CPU feature detection; kernels dispatch on these, never on compile flags.
#pragma once

#include <string>

namespace afd {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  std::string to_string() const;
};

// Detected once. The environment variable AFD_CPU_DISABLE is a documented user-facing ISA
// override (docs/DEPLOYMENT.md, "Configuration"): "avx512" masks the AVX-512 features, "all"
// also AVX2 / FMA / F16C, so every kernel takes its AVX2 or portable path (a CPU whose wide
// vectors downclock it, a comparison run, the tests of the portable paths).
const CpuFeatures& cpu_features();

}  // namespace afd
