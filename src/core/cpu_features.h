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

// Detected once; AFD_CPU_DISABLE=avx512 (or "all") masks features for testing portable paths.
const CpuFeatures& cpu_features();

}  // namespace afd
