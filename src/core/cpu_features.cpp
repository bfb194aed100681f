#include "core/cpu_features.h"

#include <cstdlib>
#include <string_view>

namespace afd {

namespace {
CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = true;  // checked below via cpuid
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  f.f16c = (c >> 29) & 1;
#endif
  // AFD_CPU_DISABLE: the user-facing ISA override (cpu_features.h).
  if (const char* dis = std::getenv("AFD_CPU_DISABLE")) {
    std::string_view v(dis);
    if (v == "avx512" || v == "all") {
      f.avx512f = f.avx512bw = f.avx512vl = f.avx512_bf16 = f.avx512_vnni = false;
    }
    if (v == "all") f.avx2 = f.fma = f.f16c = false;
  }
  return f;
}
}  // namespace

std::string CpuFeatures::to_string() const {
  std::string s;
  auto add = [&](bool on, const char* n) { if (on) { if (!s.empty()) s += ","; s += n; } };
  add(avx2, "avx2"); add(fma, "fma"); add(f16c, "f16c"); add(avx512f, "avx512f");
  add(avx512bw, "avx512bw"); add(avx512vl, "avx512vl"); add(avx512_bf16, "avx512_bf16");
  add(avx512_vnni, "avx512_vnni");
  return s.empty() ? "portable" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace afd
