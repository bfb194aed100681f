// Internal: software prefetch of the weight streams in the CPU kernels.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace afd::kernels::detail {

// Prefetches (to L1) the Lines 64-byte lines that start pf bytes after p, when they lie within
// the `left` bytes from p on (pf <= 0: nothing). always_inline: GCC 12 at -O2 drops every call
// of a prefetch-only helper that it has not inlined (nothing but prefetches: no side effects in
// its model), so without it the prefetches can silently vanish from the binary.
template <int Lines>
__attribute__((always_inline)) inline void prefetch_ahead(const void* p, int64_t pf, int64_t left) {
  if (pf > 0 && pf + 64 * Lines <= left) {
    const char* q = static_cast<const char*>(p) + pf;
#pragma GCC unroll 4
    for (int l = 0; l < Lines; ++l) _mm_prefetch(q + 64 * l, _MM_HINT_T0);
  }
}

}  // namespace afd::kernels::detail
