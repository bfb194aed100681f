// GCC 12 reports false -Wuninitialized warnings inside its own AVX-512 headers
// (_mm*_undefined_* helpers, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/machine_limits.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/timer.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/openblas_threads.h"

namespace afd::kernels {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer alloc_buffer(size_t bytes) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  AFD_CHECK(p != nullptr, "machine_limits: allocation of " + std::to_string(rounded) + " bytes failed");
  return Buffer(static_cast<uint8_t*>(p));
}

__attribute__((target("avx512f"))) uint64_t read_avx512(const uint8_t* p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  // The lanes are summed as unsigned words (wrapping): _mm512_reduce_add_epi64 adds them as
  // signed long long, whose overflow is undefined.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t s = 0;
  for (uint64_t v : lanes) s += v;
  for (; i < bytes; ++i) s += p[i];
  return s;
}

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < bytes; ++i) s += p[i];
  return s;
}

uint64_t read_portable(const uint8_t* p, size_t bytes) {
  uint64_t s0 = 0, s1 = 0;
  size_t i = 0;
  for (; i + 16 <= bytes; i += 16) {
    uint64_t a, b;
    std::memcpy(&a, p + i, 8);
    std::memcpy(&b, p + i + 8, 8);
    s0 += a;
    s1 += b;
  }
  for (; i < bytes; ++i) s0 += p[i];
  return s0 + s1;
}

uint64_t read_sum(const uint8_t* p, size_t bytes) {
  switch (detected_isa()) {
    case Isa::avx512: return read_avx512(p, bytes);
    case Isa::avx2: return read_avx2(p, bytes);
    default: return read_portable(p, bytes);
  }
}

// Splits [0, bytes) into per-thread parts aligned to 4 KiB.
void for_parts(ThreadPool& pool, size_t bytes, const std::function<void(size_t, size_t)>& fn) {
  pool.parallel_for(static_cast<int64_t>(bytes),
                    [&](int64_t b, int64_t e, int) { fn(static_cast<size_t>(b), static_cast<size_t>(e)); },
                    4096);
}

constexpr int64_t kPeakIters = 20'000'000;

// 12 independent accumulators cover FMA latency (4) x 2 pipes with room to spare.
__attribute__((target("avx512f,avx512bf16"))) float peak_dp_bf16(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x2000);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f"))) float peak_fma_avx512(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float peak_fma_avx2(int64_t iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float l[8];
  _mm256_store_ps(l, s);
  return l[0] + l[7];
}

// Fills [b, e) with distinct 8-byte words, so no two pages are equal (a page-merging hypervisor
// or KSM could otherwise back the whole buffer with one cached page and inflate the bandwidth).
void fill_distinct(uint8_t* p, size_t b, size_t e) {
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    uint64_t v = i * 0x9e3779b97f4a7c15ull + 1;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < e; ++i) p[i] = static_cast<uint8_t>(i | 1);
}

}  // namespace

double measure_peak_flops(ThreadPool& pool, DType dtype) {
  const Isa isa = detected_isa();
  // FLOP per (iteration, accumulator): lanes * 2 (FMA) or lanes * 4 (dpbf16: 2 products + 2 adds).
  double flop_per_step;
  float (*fn)(int64_t);
  if (dtype == DType::bf16 && isa == Isa::avx512) {
    fn = peak_dp_bf16, flop_per_step = 16 * 4;
  } else if (isa == Isa::avx512) {
    fn = peak_fma_avx512, flop_per_step = 16 * 2;
  } else if (isa == Isa::avx2) {
    fn = peak_fma_avx2, flop_per_step = 8 * 2;
  } else {
    return 0.0;  // no vector FMA: not measured
  }
  std::atomic<uint32_t> sink{0};
  double best = 0.0;
  for (int r = 0; r < 3; ++r) {
    int64_t t0 = now_ns();
    pool.run(pool.size(), [&](int, int) { sink.fetch_add(static_cast<uint32_t>(fn(kPeakIters) > 0)); });
    double dt = static_cast<double>(now_ns() - t0) * 1e-9;
    best = std::max(best, static_cast<double>(pool.size()) * kPeakIters * 12 * flop_per_step / dt);
  }
  return best;
}

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int runs) {
  Buffer buf = alloc_buffer(bytes);
  uint8_t* p = buf.get();
  for_parts(pool, bytes, [&](size_t b, size_t e) { fill_distinct(p, b, e); });
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int r = 0; r <= runs; ++r) {
    int64_t t0 = now_ns();
    for_parts(pool, bytes, [&](size_t b, size_t e) { sink.fetch_add(read_sum(p + b, e - b)); });
    double dt = static_cast<double>(now_ns() - t0) * 1e-9;
    if (r > 0) best = std::max(best, static_cast<double>(bytes) / dt);  // pass 0 is warm-up
  }
  AFD_CHECK(sink.load() != 0);  // keeps the reads observable
  return best;
}

double measure_copy_bandwidth(ThreadPool& pool, size_t bytes, int runs) {
  Buffer src = alloc_buffer(bytes), dst = alloc_buffer(bytes);
  uint8_t* s = src.get();
  uint8_t* d = dst.get();
  for_parts(pool, bytes, [&](size_t b, size_t e) {
    fill_distinct(s, b, e);
    std::memset(d + b, 0, e - b);
  });
  double best = 0.0;
  for (int r = 0; r <= runs; ++r) {
    int64_t t0 = now_ns();
    for_parts(pool, bytes, [&](size_t b, size_t e) { std::memcpy(d + b, s + b, e - b); });
    double dt = static_cast<double>(now_ns() - t0) * 1e-9;
    if (r > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / dt);
  }
  AFD_CHECK(std::memcmp(d, s, std::min<size_t>(bytes, 4096)) == 0);
  return best;
}

double measure_gemm_flops(ThreadPool& pool, DType dtype, int64_t m, int64_t n, int64_t k, int runs) {
  AFD_CHECK(dtype == DType::bf16 || dtype == DType::f32, "measure_gemm_flops: bf16 or f32 only");
  AFD_CHECK(m > 0 && n > 0 && k > 0);
  ensure_openblas_single_threaded();
  // The installed OpenBLAS has no cblas_sbgemm (built without BUILD_BFLOAT16), so for bf16 the
  // library GEMM is sgemm on the same values widened to f32 (widening is not timed). Inputs are
  // small values exact in bf16: no denormals, no overflow.
  Buffer a = alloc_buffer(static_cast<size_t>(m * k) * 4);
  Buffer b = alloc_buffer(static_cast<size_t>(n * k) * 4);
  Buffer c = alloc_buffer(static_cast<size_t>(m * n) * 4);
  float* af = reinterpret_cast<float*>(a.get());
  float* bf32 = reinterpret_cast<float*>(b.get());
  for (int64_t i = 0; i < m * k; ++i) af[i] = static_cast<float>((i * 7) % 13 - 6) * 0.125f;
  for (int64_t i = 0; i < n * k; ++i) bf32[i] = static_cast<float>((i * 5) % 11 - 5) * 0.25f;
  float* cf = reinterpret_cast<float*>(c.get());
  auto product = [&](int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(r1 - r0),
                static_cast<blasint>(k), 1.0f, af, static_cast<blasint>(k), bf32 + r0 * k,
                static_cast<blasint>(k), 0.0f, cf + r0, static_cast<blasint>(n));
  };
  double best = 0.0;
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  for (int r = 0; r <= runs; ++r) {
    int64_t t0 = now_ns();
    pool.parallel_for(n, [&](int64_t r0, int64_t r1, int) { product(r0, r1); }, 16);
    double dt = static_cast<double>(now_ns() - t0) * 1e-9;
    if (r > 0) best = std::max(best, flops / dt);
  }
  return best;
}

}  // namespace afd::kernels
