// Internal: the stream partition of a thread's W rows, shared by the row kernels that work on S
// rows at a time (linear_avx2.cpp, linear_fp8_avx2.cpp, linear_fp8_avx512.cpp).
#pragma once

#include <cstdint>

namespace afd::kernels::detail {

// Calls f(S, rows) for sets of S row indices of [r0, r1), one from each S-th of the range (set
// j: r0 + j, r0 + q + j, ..., q = (r1 - r0) / S), so the sets read the range as S long sequential
// streams (enough memory-level parallelism, streams the hardware prefetchers follow, even when
// rows are short); then f(1, &r) for each row left over.
template <int S, class F>
inline void stream_sets(int64_t r0, int64_t r1, F&& f) {
  const int64_t q = (r1 - r0) / S;  // rows per stream
  for (int64_t j = 0; j < q; ++j) {
    int64_t rows[S];
    for (int s = 0; s < S; ++s) rows[s] = r0 + s * q + j;
    f(S, rows);
  }
  for (int64_t r = r0 + S * q; r < r1; ++r) f(1, &r);
}

}  // namespace afd::kernels::detail
