// Internal: per-thread row-range kernels behind linear_fp8() (linear_fp8.h). Not part of the
// public contract; tests reach them through linear_fp8() and set_isa_limit().
//
// Two shapes of work:
//   gemv  few tokens: each W row is read once from memory, converted in registers and dotted
//         with up to 4 tokens' x at a time (the rows stay in L1 for the next group of 4); the
//         bf16 and AVX2 gemvs take 4 rows at a time from 4 sequential streams of the thread's
//         rows.
//   tile  many tokens: a tile of W rows is dequantized once into a bf16 or f32 buffer in the
//         running thread's scratch slot and handed to linear()'s tile kernels
//         (linear_kernels.h), which reuse it across all tokens.
//
// Batch invariance: in bf16 mode (the fast precision) on AVX-512 and in both modes on AVX2,
// each output y[i, r] is a function of x[i], W's row r, cols and the ISA level only (not of n,
// i, the other tokens, the pool, the row split or Fp8Tuning): every path of the ISA level
// computes it in one order, on the same weight values:
//   AVX-512 BF16, bf16 mode: linear()'s bf16 order (linear_kernels.h) on
//         Wb[r, c] = bf16(f32(fp8(q[r, c]) * scale)) (round to nearest even, subnormal results
//         flushed to zero, as vcvtne2ps2bf16 does) and x rounded to bf16: one 16-lane
//         accumulator; columns in chunks of 32 (the last zero padded), lane j takes pair
//         16k + j of every chunk k in ascending k with vdpbf16ps(acc, W, x); hsum16 (hsum.h);
//         y = y + total (accumulate) or total. That is, bit for bit, linear() on the bf16
//         weights Wb: the gemv (byte tables with the scale folded in) computes Wb in registers,
//         the tiles dequantize Wb (fp8_dequant_rows_bf16_avx512) for linear()'s bf16 kernels,
//         so the tiles are invariant exactly where those kernels are.
//   AVX2: the AVX2 order of linear_kernels.h on Wh[r, c] = fp8(q[r, c]) * 2^-8 (exact) and the
//         activations prescaled for r's scale row, xs[c] = f32(x[c] * (scale[c / 128] * 256))
//         (x rounded to bf16 first in bf16 mode; prescale_x_fp8). The gemv converts Wh in
//         registers, the tiles store it (fp8_rows_unscaled_f32_avx2) and split at scale rows.
// The per-128-column block scales are thus applied per product term, before the sum, on both
// levels (to W on AVX-512, to x on AVX2, where a per-weight multiply costs the gemv ~15 %).
// AVX-512 in f32 mode (the reference precision): its gemv scales each block's partial sums, its
// tiles each weight, so only LinearOrder::batch_invariant (the tiles at every n, in linear()'s
// canonical f32-weight order) is batch-invariant there.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear_fp8.h"

namespace afd::kernels::detail {

// Activations for the gemv kernels: xf [n, ldx] with ldx = round_up(cols, 128), zero padded,
// rounded through bf16 when round_bf16 (f32 variant), or xb [n, ldx] bf16 (table variant).
int64_t fp8_gemv_ldx(int64_t cols);
void prep_x_fp8_gemv_f32(const float* x, int64_t n, int64_t x_stride, int64_t cols, bool round_bf16, float* xf);
void prep_x_fp8_gemv_bf16(const float* x, int64_t n, int64_t x_stride, int64_t cols, uint16_t* xb);
// W's scale row for row r; the end (<= r1) of the run of rows from r on that share it.
inline const float* fp8_scale_row(const Fp8BlockWeights& w, int64_t r) {
  return w.scale + (r + w.row_offset) / kFp8Block * w.scale_stride;
}
inline int64_t fp8_scale_run_end(const Fp8BlockWeights& w, int64_t r, int64_t r1) {
  const int64_t e = (r + w.row_offset) / kFp8Block * kFp8Block + kFp8Block - w.row_offset;
  return e < r1 ? e : r1;
}
// xs [n, ldxs] = x [n, ldx] times (srow[c / 128] * 256) per column, c < cols (f32 products): the
// activations of the AVX2 kernels for the rows of scale row srow.
void prescale_x_fp8(const float* x, int64_t n, int64_t ldx, int64_t cols, const float* srow, float* xs,
                    int64_t ldxs);
// Whether this CPU has AVX-512 VBMI (the byte-table gemv); checked with active_isa() == avx512.
bool cpu_has_avx512_vbmi();

// y[i, r] (+)= sum_c x[i, c] W[r, c] for r in [r0, r1), i < n.
// AVX-512, f32 activations, conversion through IEEE half (vcvtph2ps, exact): f32 products,
// each 128-column block's partial sums scaled once.
void fp8_gemv_avx512(const float* xf, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols, int64_t r0,
                     int64_t r1, float* y, int64_t ldy, bool acc);
// AVX-512 BF16 + VBMI, bf16 activations: conversion by the block's scaled byte tables
// (vpermt2b) into bf16(fp8 * scale), vdpbf16ps in the bf16 order. scratch (the calling thread's
// slot): the tables, ceil(cols / 128) * 256 bytes, for the call.
void fp8_gemv_lut8_avx512(const uint16_t* xb, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols,
                          int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch);
// AVX2 + F16C, conversion through IEEE half (fp8 * 2^-8, exact), activations prescaled per scale
// row (prescale_x_fp8, done inside): the AVX2 order. scratch (the calling thread's slot): the
// prescaled activations, n * ldx floats, for the call.
void fp8_gemv_avx2(const float* xf, int64_t n, int64_t ldx, const Fp8BlockWeights& w, int64_t cols, int64_t r0,
                   int64_t r1, float* y, int64_t ldy, bool acc, ScratchSlot& scratch);

// out [r1 - r0, cols] (row stride cols) = W rows [r0, r1) dequantized; bf16 rounds the f32
// product fp8 * scale to nearest even.
void fp8_dequant_rows_bf16_avx512(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, uint16_t* out);
void fp8_dequant_rows_f32_avx512(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out);
void fp8_dequant_rows_f32_avx2(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out);
// out [r1 - r0, cols] = fp8(q) * 2^-8 (exact, no scale): the AVX2 tiles' weights.
void fp8_rows_unscaled_f32_avx2(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out);
void fp8_dequant_rows_f32_scalar(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out);

// Tuning of linear_fp8(): which path takes a call. The defaults are what linear_fp8() uses;
// benchmarks and tests pass others to linear_fp8_tuned. The choice changes the time, never the
// result (the orders above). Defaults from bench_kernels --fp8-weights on the dev machine
// (docs/BENCHMARKS.md, "FP8 weights").
struct Fp8Tuning {
  // AVX-512 with bf16 activations: 2 = the byte-table gemv where the CPU has VBMI; any other
  // value, or no VBMI: no gemv (the tiles take every n).
  int gemv_lut = 2;
  // Largest n that takes the AVX-512 BF16 gemv (bf16 activations; above it: tiles). The byte-table
  // gemv (4 rows per pass, bf16 x) stays ahead of the dequantized tiles up to 16 tokens, at 7168
  // columns too (x 224 KiB): 0.62-0.95 of the tiles' time at n = 5..16 on the bench model's
  // shapes, one thread, cold weights, interleaved in one process.
  int64_t gemv_max_n = 16;
  // Rows dequantized per tile (rounded down to a multiple of 16, at least 16). From whole decode
  // steps (docs/bench-log/2026-11-26-smalln.md): a 128-row tile (512 KiB at 2048 columns, in L2)
  // gives the bf16 small-n kernel it feeds whole row chunks.
  int64_t tile_rows = 128;
  // For n >= 2 the bf16 gemv also needs the n rows of x (bf16, as the gemv stores them) within
  // this many bytes; the gemv reloads them for every 4 W rows.
  int64_t gemv_max_x_bytes = 256 * 1024;
  // The same two limits for the gemvs on f32 x (AVX2 in both precisions, AVX-512 with f32
  // activations): the gemv reloads every token's x slice for each W row, so once the n rows of x
  // outgrow L1 the tiles are faster (bench_kernels --fp8-weights,
  // docs/bench-log/2026-11-26-fp8-prefetch.md).
  int64_t gemv_f32_max_n = 4;
  int64_t gemv_f32_max_x_bytes = 32 * 1024;
  // The many-token AVX-512 bf16 tiles take linear()'s pairs kernel from this n on (even cols);
  // -1: linear()'s default, kPairsMinNDefault (linear_kernels.h).
  int64_t pairs_min_n = -1;
};

// linear_fp8() (linear_fp8.h) with the path chosen by `tuning`; scratch as linear_fp8()'s.
void linear_fp8_tuned(const float* x, int64_t n, int64_t x_stride, const Fp8BlockWeights& w, int64_t rows, int64_t cols,
                      float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch,
                      bool accumulate, LinearOrder order, const Fp8Tuning& tuning);
// linear_fp8_path_name() (linear_fp8.h) for a call of linear_fp8_tuned with `tuning`.
const char* linear_fp8_path_name(int64_t n, int64_t cols, ActPrecision prec, LinearOrder order,
                                 const Fp8Tuning& tuning);

}  // namespace afd::kernels::detail
