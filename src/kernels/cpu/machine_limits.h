// Machine limits measured at run time, so benchmarks can report achieved fractions of them
// (afd bench, bench/bench_kernels). All functions take several seconds at most and allocate
// their buffers for the duration of the call only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace afd::kernels {

// Streaming read bandwidth in bytes/s: every pool thread sums its contiguous part of a
// `bytes` buffer (far larger than the caches) with the widest vector loads the CPU has.
// Best of `runs` passes (each after one warm-up pass that also touches the pages).
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int runs = 5);

// Stream copy bandwidth in bytes/s, counted as in STREAM "Copy": 2 * bytes per pass
// (bytes read + bytes written; write-allocate traffic not counted). Each pool thread copies
// its contiguous part with memcpy. Best of `runs` passes.
double measure_copy_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int runs = 5);

// GEMM rate in FLOP/s (2*m*n*k per product) through OpenBLAS the way linear() uses it:
// C[m, n] = A[m, k] . B[n, k]^T, with B's n rows split across the pool threads and OpenBLAS
// single-threaded inside each, via cblas_sgemm. The installed OpenBLAS (Debian 0.3.21) has no
// cblas_sbgemm, so dtype bf16 measures sgemm on bf16-exact values widened to f32: the fastest
// library GEMM available for bf16 data here. Best of `runs` products after one warm-up.
double measure_gemm_flops(ThreadPool& pool, DType dtype, int64_t m = 1024, int64_t n = 2048,
                          int64_t k = 2048, int runs = 3);

// Peak arithmetic rate in FLOP/s of the vector units, measured with independent register-only
// chains on every pool thread (no memory traffic): f32 -> FMA (2 FLOP per lane), bf16 ->
// vdpbf16ps (4 FLOP per f32 lane) where AVX-512 BF16 exists, else the f32 rate. The ceiling
// a GEMM kernel on this machine cannot exceed; reported beside the library GEMM rate.
double measure_peak_flops(ThreadPool& pool, DType dtype);

}  // namespace afd::kernels
