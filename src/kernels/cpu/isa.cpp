#include "kernels/cpu/isa.h"

#include <atomic>

#include "core/cpu_features.h"

namespace afd::kernels {

namespace {
std::atomic<int> g_limit{static_cast<int>(Isa::avx512)};
}

Isa detected_isa() {
  static const Isa detected = [] {
    const CpuFeatures& f = cpu_features();
    if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512_bf16 && f.avx2 && f.fma) return Isa::avx512;
    if (f.avx2 && f.fma && f.f16c) return Isa::avx2;
    return Isa::scalar;
  }();
  return detected;
}

Isa active_isa() {
  int d = static_cast<int>(detected_isa());
  int l = g_limit.load(std::memory_order_relaxed);
  return static_cast<Isa>(d < l ? d : l);
}

void set_isa_limit(Isa limit) { g_limit.store(static_cast<int>(limit), std::memory_order_relaxed); }

Isa isa_limit() { return static_cast<Isa>(g_limit.load(std::memory_order_relaxed)); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

}  // namespace afd::kernels
