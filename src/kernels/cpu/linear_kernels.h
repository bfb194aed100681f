// Internal: per-thread row-range kernels behind linear() (ops.h). Each computes
// y[i, r] for i < n and r in [r0, r1), streaming those rows of W once for all n tokens
// (tokens are processed in chunks of kTokenChunk so a chunk of x stays in L2).
// Not part of the public contract; tests reach them through linear(), linear_tuned() and
// set_isa_limit().
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "kernels/cpu/ops.h"

namespace afd::kernels::detail {

// Batch invariance (bf16 W x bf16 x on AVX-512 BF16: rows_dp_bf16_avx512, and
// rows_dp_bf16_pairs_avx512 with canonical = true, at every n, tuning, row split and pool size):
// every output element y[i, r] is computed in one canonical order that depends on cols only.
//   - x[i] is rounded to bf16; columns are grouped in 32-column chunks c = 0 .. ceil(cols / 32) - 1,
//     i.e. 16 column pairs k = 16 c + j, j = 0..15 (the last chunk zero padded);
//   - 16 f32 accumulators L_j, each starting at +0: for c ascending, L_j = vdpbf16ps(L_j, pair k of
//     x[i], pair k of W[r]) (one lane of one instruction: L_j + x[2k] w[2k] + x[2k+1] w[2k+1] with
//     the instruction's rounding and denormal flushing). Pairs past cols may be skipped: they add
//     +0 to an accumulator that is never -0;
//   - S_q = (L_4q + L_4q+2) + (L_4q+1 + L_4q+3) for q = 0..3, total = (S_0 + S_2) + (S_1 + S_3);
//   - y[i, r] = total, or y[i, r] + total with accumulate.
// The dot-layout kernels (linear_avx512.cpp) hold L_0..L_15 as the lanes of one zmm per
// (row, token), carried across column blocks, and sum the lanes with that tree (reduce4); the
// pairs kernel (linear_avx512_pairs.cpp) makes the lanes tokens and runs the 16 j's as separate
// passes. linear() (ops.h) keeps that order at every n with LinearOrder::batch_invariant; with
// LinearOrder::fastest it runs the pairs kernel's one-chain order from LinearTuning::pairs_min_n tokens
// on (faster: the canonical pairs kernel takes 1.13-1.2x its time, hot, one thread, n = 64..256).
// Other ISA levels and precisions have orders of their own (ops.h).
constexpr int64_t kTokenChunk = 96;
// Largest n that the bf16 x bf16 row streams (rows_seq_dp, linear_avx512.cpp) take.
constexpr int64_t kRowSeqMaxN = 4;
// Largest n of the bf16 x bf16 small-n path (rows_dp_bf16_avx512; linear_avx512.cpp); from
// the pairs threshold (LinearTuning::pairs_min_n) on, the pairs kernel takes the product instead.
constexpr int64_t kSmallNMax = 48;
// Default of LinearTuning::pairs_min_n: the token count from which the pairs kernel is ahead of
// the tiles on the small and bench models' prefill shapes (docs/bench-log/2026-11-26-prefill.md).
constexpr int64_t kPairsMinNDefault = 32;
// bf16 x bf16 on rows of at most this many columns: the small-n tiles stay ahead of the pairs
// kernel (whose per-tile epilogue weighs more on short rows) up to kSmallNMax tokens
// (docs/bench-log/2026-11-26-smalln.md).
constexpr int64_t kPairsShortCols = 768;

// Layout helpers for the prepared activations (done once per call, by the caller thread).
// Round x [n, x_stride] to bf16 into xb [n, ldx], ldx >= round_up(cols, 32), columns >= cols zeroed.
void prep_x_bf16(const float* x, int64_t n, int64_t x_stride, int64_t cols, uint16_t* xb, int64_t ldx);
// Copy x into xp [n, ldx] (ldx = round_up(cols, 32), zero padded), optionally rounding through
// bf16, and permuting each 32-column block to the order in which the AVX-512 kernel widens bf16
// weights with unpacklo/unpackhi: block position p holds column perm32(p).
void prep_x_f32_perm32(const float* x, int64_t n, int64_t x_stride, int64_t cols, bool round_bf16,
                       float* xp, int64_t ldx);
// Copy x into xc [n, ldx] (ldx = round_up(cols, 32), zero padded), optionally rounding through bf16.
void prep_x_f32(const float* x, int64_t n, int64_t x_stride, int64_t cols, bool round_bf16, float* xc,
                int64_t ldx);

// Tuning of linear(): which path takes a call (the pairs kernel, OpenBLAS) and how the AVX-512
// row kernels (linear_avx512.cpp) run. The defaults are what linear() uses; benchmarks
// (bench_kernels --tune, --small-n) and tests pass others to linear_tuned.
// With bf16 x bf16 the knobs change only the speed, never the bits (the canonical order above).
// With LinearOrder::fastest, blas_min_n and pairs_min_n choose between orders (ops.h).
struct LinearTuning {
  // Smallest n for which bf16 x bf16 on AVX-512 BF16 (even cols) takes the pairs kernel; -1: the
  // defaults, kPairsMinNDefault, but kSmallNMax + 1 for rows of at most kPairsShortCols columns.
  int64_t pairs_min_n = -1;
  // Smallest n for which the product goes to OpenBLAS sgemm, [w_bf16][act_bf16] (never for bf16 x
  // bf16 on AVX-512 BF16, never with LinearOrder::batch_invariant); -1: the default of the ISA
  // level. Defaults: on AVX-512, never (the tiles are at least as fast as sgemm, run
  // single-threaded per pool thread, at every n that bench_kernels --compare-sgemm times, for
  // bf16 and f32 weights; docs/BENCHMARKS.md "Kernels"). The AVX2 tiles (12 accumulators of 8
  // lanes) hand off from n = 64, where sgemm's packing is amortised: with AVX-512 masked and
  // OpenBLAS on its Haswell kernels, bf16 W [768, 2048], the tiles were 5 % ahead at 64 tokens and
  // sgemm 8 % ahead at 128 (docs/bench-log/2026-11-29-avx2-long-context.md).
  int64_t blas_min_n[2][2] = {{-1, -1}, {-1, -1}};

  // Single token: 1 = rows one at a time (row_seq_*), 8 = interleaved 8-row tiles, any other
  // value 4-row tiles; the W stream's software prefetch distance in bytes ahead of the current
  // load (0: none; rows one at a time prefetch with bf16 activations only). Defaults from
  // bench_kernels --tune on the bench model's shapes and whole decode steps
  // (docs/bench-log/2026-11-26-fp8-prefetch.md).
  int rows_single = 1;
  int64_t prefetch_bytes = 8192;
  // Rows one at a time, bf16 x bf16 (one token, and 2..row_seq_max_n tokens): the thread's rows
  // as this many contiguous parts (1, 2 or 4) streamed side by side, one row of each at a time
  // (independent accumulator chains; each (row, token) has one). Default: the fastest of 1, 2
  // and 4 on the bench model's shapes (`bench_kernels --small-n 3 --ns 1 --row-streams S`).
  int row_streams = 4;
  // bf16 x bf16 at 2..row_seq_max_n tokens (at most kRowSeqMaxN): the rows one at a time in
  // row_streams streams as for one token; more tokens take the small-n tiles (1: one token
  // only). Default: whole verification steps of 2..4 tokens per sequence (afd bench
  // --query-tokens; docs/bench-log/2026-11-29-verify-row-streams.md); in isolation
  // `bench_kernels --small-n 3,5 --ns 2,3,4 --row-streams 4`.
  int row_seq_max_n = 4;
  // The row streams' W prefetch distance in bytes at 2..row_seq_max_n tokens (0: none; one
  // token takes prefetch_bytes). Default: whole verification steps, as row_seq_max_n.
  int64_t row_seq_prefetch_bytes = 0;
  // bf16 x bf16 at row_seq_max_n + 1..kSmallNMax tokens: 0 = the general tiles (4 rows x <= 6 tokens, no
  // prefetch), 3 or 4 = rows_small_dp with 3-row tiles of <= 8 tokens or 4-row tiles of <= 6
  // tokens. 3-row tiles run n = 8 as one token block instead of two (bench_kernels --small-n;
  // docs/bench-log/2026-11-26-smalln.md).
  int small_n_layout = 3;
  // The small-n tiles: the budget for one column block's slice of x; the least prefetch distance
  // (a whole number of tiles is used); the W bytes per row chunk when several token blocks share
  // a call whose x exceeds the budget (0: no chunks).
  int64_t small_n_x_bytes = 40 * 1024;
  int64_t small_n_prefetch_min_bytes = 8192;
  int64_t small_n_chunk_bytes = 128 * 1024;
};

// Working memory of the row kernels (scratch): the calling thread's slot; what a kernel takes
// there is given back when it returns (a Frame of its own).
// AVX-512 BF16: xb from prep_x_bf16; w bf16 [rows, cols]. vdpbf16ps with f32 accumulation.
// scratch: the small-n tiles' partial sums when they split the columns into blocks
// (rows per chunk x 8 tokens x 16 floats).
void rows_dp_bf16_avx512(const uint16_t* xb, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols, int64_t r0,
                         int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch,
                         const LinearTuning& tuning = {});
// Many tokens, AVX-512 BF16, even cols ("pairs" layout, linear_avx512_pairs.cpp): x rounded to
// bf16 into xp [ceil(n / 16)][P][ldx / (2 P)][16][2] (token block, lane class j, index c of column
// pair k = P c + j in its class, token lane, pair element; ldx = round_up(cols, 32); missing
// tokens and columns zero), so that a vector holds one column pair of 16 tokens. canonical: P = 16
// classes and the canonical order above; else P = 1 (the pairs in order) and one accumulator
// chain per (row, token) over all pairs (LinearOrder::fastest). prep and kernel must agree.
void prep_x_bf16_pairs(const float* x, int64_t n, int64_t x_stride, int64_t cols, uint16_t* xp, int64_t ldx,
                       bool canonical = false);
// y[i, r] for i < n, r in [r0, r1) from xp (prep_x_bf16_pairs) and w bf16 [rows, cols], cols
// even: vdpbf16ps with the tokens as the vector lanes, f32 accumulation. scratch: with
// canonical, on rows longer than 1024 columns, a class-major copy of a 6-row tile of W (about
// 12 x cols bytes).
void rows_dp_bf16_pairs_avx512(const uint16_t* xp, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols, int64_t r0,
                               int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch,
                               bool canonical = false);
// AVX-512 F: xp from prep_x_f32_perm32; w bf16 widened exactly to f32; f32 FMA.
// canonical (both FMA kernels): every element in one order at every n, tuning and row split:
// 4-row tiles at n = 1 too, one accumulator per element fed chunk by chunk (bf16 W: the low then
// the high 16 columns of each 32-column block; f32 W: 16 columns at a time) from +0, lanes summed
// by the reduce4 tree. Otherwise n = 1 takes 4 chains per row (row_seq_fma_*).
void rows_fma_bf16w_avx512(const float* xp, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols,
                           int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc,
                           const LinearTuning& tuning = {}, bool canonical = false);
// AVX-512 F: x any layout [n, ldx]; w f32.
void rows_fma_f32w_avx512(const float* x, int64_t n, int64_t ldx, const float* w, int64_t cols,
                          int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc,
                          const LinearTuning& tuning = {}, bool canonical = false);
// AVX2 + FMA: x [n, ldx] f32 (prep_x_f32 layout or the caller's); w bf16 or f32.
// Order of every output (the AVX2 order; any n, token, tile or row split): one 8-lane f32
// accumulator, lane j takes column 8k + j of every whole group k of 8 columns in ascending k,
// acc = fma(w, x, acc); s = hsum8(acc) (hsum.h); then s = fma(w[c], x[c], s) for the
// last cols % 8 columns in ascending c; y = y + s (accumulate) or s. bf16 w is widened exactly.
void rows_fma_bf16w_avx2(const float* x, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols,
                         int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc);
void rows_fma_f32w_avx2(const float* x, int64_t n, int64_t ldx, const float* w, int64_t cols,
                        int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc);
// Portable: x [n, ldx] f32 (already rounded in bf16 mode); w bf16 or f32 (is_bf16).
void rows_scalar(const float* x, int64_t n, int64_t ldx, const void* w, bool is_bf16, int64_t cols,
                 int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc);

// linear() (ops.h) with the path and the AVX-512 row kernels chosen by `tuning`; scratch as
// linear()'s.
void linear_tuned(const float* x, int64_t n, int64_t x_stride, const void* w, DType w_dtype, int64_t rows, int64_t cols,
                  float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch,
                  bool accumulate, const LinearTuning& tuning, LinearOrder order = LinearOrder::fastest);

// The n from which linear() takes the pairs kernel for bf16 x bf16 on AVX-512 BF16 with this
// tuning: tuning.pairs_min_n when set (>= 0), else kPairsMinNDefault (linear_fp8's tiles use this;
// linear() itself keeps rows of at most kPairsShortCols columns on the small-n path by default).
int64_t resolve_pairs_min_n(const LinearTuning& tuning);
// linear_path_name() (ops.h) for a call of linear_tuned with `tuning`.
const char* linear_path_name(int64_t n, DType w_dtype, ActPrecision prec, int64_t cols, LinearOrder order,
                             const LinearTuning& tuning);

}  // namespace afd::kernels::detail
