// Internal: the stream partition of a thread's W rows, shared by the row kernels that work on S
// rows at a time (linear_avx2.cpp, linear_fp8_avx2.cpp, linear_fp8_avx512.cpp), and the choice
// of their tile instantiation.
#pragma once

#include <cstdint>
#include <type_traits>

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

// For a row set of rn rows (S, or 1 for a row left over) and t tokens (1..4): calls
// f(std::integral_constant<int, rows>{}, std::integral_constant<int, tokens>{}), so that f can
// pick a tile instantiation.
template <int S, class F>
inline void with_tile_shape(int rn, int64_t t, F&& f) {
  auto tokens = [&](auto rows) {
    if (t == 1) f(rows, std::integral_constant<int, 1>{});
    else if (t == 2) f(rows, std::integral_constant<int, 2>{});
    else if (t == 3) f(rows, std::integral_constant<int, 3>{});
    else f(rows, std::integral_constant<int, 4>{});
  };
  if (rn == S) tokens(std::integral_constant<int, S>{});
  else tokens(std::integral_constant<int, 1>{});
}

}  // namespace afd::kernels::detail
