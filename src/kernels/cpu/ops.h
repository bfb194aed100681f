// CPU kernels: pointers, sizes, a thread pool and caller-owned scratch (core/scratch_arena.h);
// no model or request types.
// Every kernel has a scalar reference (namespace ref) and SIMD versions chosen at run
// time from cpu_features(); the kernel-op registry (tests/kernel_ops/) checks each against its
// reference at every ISA level, and bench_kernels --ops times them.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/scratch_arena.h"
#include "core/thread_pool.h"

namespace afd::kernels {

// How activations enter a matrix product.
//   f32:  x is used exactly; bf16 weights are widened to f32 (the "reference" mode).
//   bf16: x is rounded to bf16 and products use bf16 inputs with f32 accumulation
//         (the "fast" mode; AVX512-BF16 vdpbf16ps where available).
enum class ActPrecision : uint8_t { f32, bf16 };

// The summation order linear() may give each output element y[i, r].
//   fastest: the order of the fastest path for the call's shape, which may depend on n: without
//     AVX-512 BF16, large n goes to OpenBLAS sgemm (detail::LinearTuning::blas_min_n), whose order is
//     not the tiles'; with it, bf16 x bf16 from detail::LinearTuning::pairs_min_n tokens on runs one
//     accumulator chain per element instead of the canonical 16.
//   batch_invariant: y[i, r] depends on x[i], W[r], cols, the dtypes, the precision and the ISA
//     level only: never on n, the other tokens, i, the split of the rows or the pool. Holds for
//     every weight dtype and precision at every ISA level: AVX-512 BF16 with bf16 activations (the
//     canonical order of kernels/cpu/linear_kernels.h), AVX-512 with f32 activations (the 4-row
//     FMA tiles at every n, n = 1 included), the AVX2 tiles (one order at every n), the scalar
//     path (one sequential sum per element); FP8 weights as linear_fp8.h states. Slower from
//     32 tokens on (the 16-class pairs kernel on AVX-512 BF16; no sgemm on AVX2 from 64):
//     docs/BENCHMARKS.md "Batch-invariant mode".
enum class LinearOrder : uint8_t { fastest, batch_invariant };
// The order a batch-invariant mode (--deterministic) asks for.
inline LinearOrder linear_order(bool batch_invariant) {
  return batch_invariant ? LinearOrder::batch_invariant : LinearOrder::fastest;
}

// y[i, r] = sum_c x[i, c] * W[r, c]  for i < n, r < rows.
// x: [n, cols] with row stride x_stride (floats); W: [rows, cols] row-major, dtype bf16 or f32;
// y: [n, rows] with row stride y_stride. If accumulate, adds into y instead of overwriting.
// pool may be null (single-threaded). Small n uses a GEMV path that streams W once for all n
// rows; large n may use OpenBLAS sgemm where that measures faster (order: LinearOrder).
// With bf16 weights, bf16 activations rounds x only (W is already bf16); with f32 weights,
// bf16 activations rounds x to bf16 and keeps W in f32 (products in f32).
// scratch: the working memory, one slot per thread that runs the call: at least pool->size()
// slots (1 without a pool). The calling thread takes from slot 0 (it is thread 0 of
// ThreadPool::run) the prepared activations, at most (n + 15) * round_up(cols, 32) * 4 bytes,
// held until the call returns; a task on pool thread t takes from slot t its tiles' buffers
// while it runs (bf16 weights handed to sgemm: up to 4 MiB of widened rows). Slot 0 must belong
// to the calling thread: a call from inside a task of another pool region passes pool = nullptr
// and an arena whose slot 0 is that task's. Nothing stays taken after the call.
void linear(const float* x, int64_t n, int64_t x_stride, const void* w, DType w_dtype, int64_t rows, int64_t cols,
            float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch,
            bool accumulate = false, LinearOrder order = LinearOrder::fastest);

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w   for i < n; x, y: [n, dim]; y may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y);

// NEOX-style rotary embedding in place on x: [n_heads, head_dim] at position pos.
// For i < head_dim/2 with inv_freq_i = theta^(-2i/head_dim), angle = pos * inv_freq_i:
//   (x[i], x[i+half]) <- (x[i]*cos - x[i+half]*sin, x[i+half]*cos + x[i]*sin).
// Angles are computed in double and rounded to float, matching an f64 reference to ~1e-7.
void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, double theta);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); out may alias gate.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// c[i, j] = sum_l a[i, l] * b[l, j] for i < m, j < n, l < k: row-major f32 with row strides
// lda, ldb, ldc, on the calling thread (the library sgemm, NoTrans x NoTrans). For products
// whose weight is used as b (its rows are the inner dimension), where linear() wants W^T.
void matmul_f32(const float* a, int64_t m, int64_t k, int64_t lda, const float* b, int64_t n, int64_t ldb, float* c,
                int64_t ldc);

// In-place numerically stable softmax over x[0..n).
void softmax(float* x, int64_t n);
// The two halves of a softmax over blocks of a row (online softmax): scale_max sets x[i] *= s
// and returns max x[i] (-inf for n = 0); exp_sub_sum sets x[i] = exp(x[i] - m) and returns
// their sum.
float scale_max(float* x, int64_t n, float s);
float exp_sub_sum(float* x, int64_t n, float m);

// y[i] += a * x[i]
void axpy(float a, const float* x, int64_t n, float* y);

// Conversions.
void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y);
void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y);

// FP8 e4m3 quantisation with one float scale per group of `group` consecutive values
// (group = dim for per-token scales, 128 for per-block). scale = amax / 448 (1 when amax == 0);
// q = fp8(x / scale). x: [n], q: [n], scales: [n / group]; n % group == 0.
void quantize_fp8_e4m3(const float* x, int64_t n, int64_t group, uint8_t* q, float* scales);
// x[i] = fp8_to_f32(q[i]) * scales[i / group]
void dequantize_fp8_e4m3(const uint8_t* q, const float* scales, int64_t n, int64_t group, float* x);
// q[i] = f32_to_fp8_e4m3(x[i] * mul) for i < n (core/dtype.h): the KV cache's rounding, which
// multiplies by the inverse of its scale.
void scale_to_fp8_e4m3(const float* x, int64_t n, float mul, uint8_t* q);
// max |x[i]| over i < n (0 for n == 0); exact for finite x (a maximum does not depend on the
// order). With a NaN in x the result is unspecified (the vector path returns NaN, the scalar
// one skips it).
float abs_max(const float* x, int64_t n);

// Name of the implementation linear() dispatches to on this CPU ("avx512_bf16", "avx2", "scalar").
const char* linear_impl_name(ActPrecision prec);
// Name of the implementation linear() uses for this particular call shape, e.g.
// "avx512_bf16_dp_tile", "avx512_bf16_dp_pairs", "avx512_fma_tile", "avx2_fma_tile", "scalar",
// "openblas_sgemm" (for benchmarks and reports; cols: W's columns).
const char* linear_path_name(int64_t n, DType w_dtype, ActPrecision prec, int64_t cols = 0,
                             LinearOrder order = LinearOrder::fastest);

namespace ref {
// Scalar references with the same contracts (pool unused; single thread).
void linear(const float* x, int64_t n, int64_t x_stride, const void* w, DType w_dtype, int64_t rows,
            int64_t cols, float* y, int64_t y_stride, ActPrecision prec, bool accumulate = false);
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void quantize_fp8_e4m3(const float* x, int64_t n, int64_t group, uint8_t* q, float* scales);
void dequantize_fp8_e4m3(const uint8_t* q, const float* scales, int64_t n, int64_t group, float* x);
void matmul_f32(const float* a, int64_t m, int64_t k, int64_t lda, const float* b, int64_t n, int64_t ldb, float* c,
                int64_t ldc);
void softmax(float* x, int64_t n);
float scale_max(float* x, int64_t n, float s);
float exp_sub_sum(float* x, int64_t n, float m);
void axpy(float a, const float* x, int64_t n, float* y);
void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y);
void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y);
}  // namespace ref

}  // namespace afd::kernels
