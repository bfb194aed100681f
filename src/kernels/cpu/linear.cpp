// linear(): dispatch between the tile kernels (W streamed once for all tokens) and OpenBLAS
// sgemm (large n, f32 activations), with the rows of W split across the ThreadPool.
//
// The installed OpenBLAS (Debian 0.3.21) is built without BUILD_BFLOAT16: it exports no
// cblas_sbgemm. bf16 activations therefore always use the AVX-512 BF16 tile kernel (or, without
// AVX-512 BF16, exact bf16-rounded x with f32 FMA / sgemm, which gives the same products).
//
// OpenBLAS threading: the first BLAS use calls openblas_set_num_threads(1), and every pool
// thread calls OpenBLAS on its own slice of W's rows. So OpenBLAS never starts threads of its
// own that would compete with the pool's (spinning) workers for the same cores; parallelism
// comes only from afd's ThreadPool. measure_gemm_flops (machine_limits.h) times the same scheme.
#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/openblas_threads.h"

namespace afd::kernels {

void ensure_openblas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

namespace detail {

namespace {
// The defaults are documented at LinearTuning::blas_min_n.
int64_t resolve_blas_min_n(const LinearTuning& tuning, bool w_bf16, bool act_bf16, Isa isa) {
  const int64_t v = tuning.blas_min_n[w_bf16][act_bf16];
  if (v >= 0) return v;
  return isa == Isa::avx512 ? (int64_t{1} << 62) : 64;
}

int64_t bf16_pairs_min_n(const LinearTuning& tuning, int64_t cols) {
  if (tuning.pairs_min_n < 0 && cols <= kPairsShortCols) return kSmallNMax + 1;
  return resolve_pairs_min_n(tuning);
}
}  // namespace

int64_t resolve_pairs_min_n(const LinearTuning& tuning) {
  return tuning.pairs_min_n >= 0 ? tuning.pairs_min_n : kPairsMinNDefault;
}

void prep_x_bf16(const float* x, int64_t n, int64_t x_stride, int64_t cols, uint16_t* xb, int64_t ldx) {
  for (int64_t i = 0; i < n; ++i) {
    f32_to_bf16_row(x + i * x_stride, cols, xb + i * ldx);
    std::fill(xb + i * ldx + cols, xb + (i + 1) * ldx, uint16_t{0});
  }
}

void prep_x_f32(const float* x, int64_t n, int64_t x_stride, int64_t cols, bool round, float* xc,
                int64_t ldx) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    float* o = xc + i * ldx;
    if (round)
      for (int64_t c = 0; c < cols; ++c) o[c] = round_bf16(xi[c]);
    else
      std::copy(xi, xi + cols, o);
    std::fill(o + cols, o + ldx, 0.0f);
  }
}

void prep_x_f32_perm32(const float* x, int64_t n, int64_t x_stride, int64_t cols, bool round, float* xp,
                       int64_t ldx) {
  // unpacklo_epi16 on 32 bf16 yields, per 128-bit lane k (0..3), columns 8k..8k+3;
  // unpackhi yields 8k+4..8k+7. Position p < 16 of a block holds column 8(p/4) + p%4,
  // position 16 + p holds column 8(p/4) + 4 + p%4.
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    float* o = xp + i * ldx;
    for (int64_t c0 = 0; c0 < ldx; c0 += 32) {
      for (int p = 0; p < 32; ++p) {
        int q = p & 15;
        int64_t col = c0 + 8 * (q / 4) + (q % 4) + (p >= 16 ? 4 : 0);
        float v = col < cols ? xi[col] : 0.0f;
        o[c0 + p] = round ? round_bf16(v) : v;
      }
    }
  }
}

void rows_scalar(const float* x, int64_t n, int64_t ldx, const void* w, bool is_bf16, int64_t cols,
                 int64_t r0, int64_t r1, float* y, int64_t ldy, bool acc) {
  const uint16_t* wb = static_cast<const uint16_t*>(w);
  const float* wf = static_cast<const float*>(w);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * ldx;
      float s = 0.0f;
      if (is_bf16)
        for (int64_t c = 0; c < cols; ++c) s += xi[c] * bf16_to_f32(wb[r * cols + c]);
      else
        for (int64_t c = 0; c < cols; ++c) s += xi[c] * wf[r * cols + c];
      float* o = y + i * ldy + r;
      *o = acc ? *o + s : s;
    }
  }
}

}  // namespace detail

namespace {

using namespace detail;

enum class Path { scalar, avx2_fma, avx512_dp, avx512_dp_pairs, avx512_dp_pairs_canonical, avx512_fma, blas_sgemm };

Path choose_path(int64_t n, int64_t cols, bool w_bf16, bool act_bf16, Isa isa, LinearOrder order,
                 const LinearTuning& tuning) {
  // With native BF16 dot products the tile kernel does twice the work per instruction of sgemm.
  const bool native_bf16 = w_bf16 && act_bf16 && isa == Isa::avx512;
  if (native_bf16 && cols % 2 == 0 && n >= bf16_pairs_min_n(tuning, cols))
    return order == LinearOrder::batch_invariant ? Path::avx512_dp_pairs_canonical : Path::avx512_dp_pairs;
  if (!native_bf16 && order == LinearOrder::fastest && n >= resolve_blas_min_n(tuning, w_bf16, act_bf16, isa))
    return Path::blas_sgemm;
  if (isa == Isa::avx512) return (w_bf16 && act_bf16) ? Path::avx512_dp : Path::avx512_fma;
  if (isa == Isa::avx2) return Path::avx2_fma;
  return Path::scalar;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::scalar: return "scalar";
    case Path::avx2_fma: return "avx2_fma_tile";
    case Path::avx512_dp: return "avx512_bf16_dp_tile";
    case Path::avx512_dp_pairs: return "avx512_bf16_dp_pairs";
    case Path::avx512_dp_pairs_canonical: return "avx512_bf16_dp_pairs_canonical";
    case Path::avx512_fma: return "avx512_fma_tile";
    case Path::blas_sgemm: return "openblas_sgemm";
  }
  return "?";
}

// sgemm on bf16 weights: widen blocks of rows into an f32 buffer taken from scratch, then
// y[:, block] = x . block^T. Each sgemm call packs all of x (n x cols) again, so the blocks are
// large (up to 4 MiB of f32, at least 16 rows): packing x costs 1 / (2 * rows per block) of the
// block's FLOPs in bytes moved.
void sgemm_bf16w_rows(const float* x, int64_t n, int64_t ldx, const uint16_t* w, int64_t cols, int64_t r0, int64_t r1,
                      float* y, int64_t ldy, bool acc, ScratchSlot& scratch) {
  const int64_t rb = std::min(std::max<int64_t>(1, r1 - r0),
                              std::max<int64_t>(16, (1024 * 1024) / std::max<int64_t>(cols, 1)));
  ScratchSlot::Frame frame(scratch);
  float* wf = scratch.take<float>(static_cast<size_t>(rb * cols));
  for (int64_t r = r0; r < r1; r += rb) {
    const int64_t nr = std::min(rb, r1 - r);
    bf16_to_f32_row(w + r * cols, nr * cols, wf);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n), static_cast<blasint>(nr),
                static_cast<blasint>(cols), 1.0f, x, static_cast<blasint>(ldx), wf,
                static_cast<blasint>(cols), acc ? 1.0f : 0.0f, y + r, static_cast<blasint>(ldy));
  }
}

}  // namespace

void matmul_f32(const float* a, int64_t m, int64_t k, int64_t lda, const float* b, int64_t n, int64_t ldb, float* c,
                int64_t ldc) {
  AFD_CHECK(m >= 0 && k >= 0 && n >= 0 && lda >= k && ldb >= n && ldc >= n, "matmul_f32: bad shape or stride");
  if (m == 0 || n == 0) return;
  ensure_openblas_single_threaded();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(std::max<int64_t>(lda, 1)), b,
              static_cast<blasint>(std::max<int64_t>(ldb, 1)), 0.0f, c,
              static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

void linear(const float* x, int64_t n, int64_t x_stride, const void* w, DType w_dtype, int64_t rows, int64_t cols,
            float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch, bool accumulate,
            LinearOrder order) {
  detail::linear_tuned(x, n, x_stride, w, w_dtype, rows, cols, y, y_stride, prec, pool, scratch, accumulate,
                       detail::LinearTuning{}, order);
}

namespace detail {

void linear_tuned(const float* x, int64_t n, int64_t x_stride, const void* w, DType w_dtype, int64_t rows, int64_t cols,
                  float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch,
                  bool accumulate, const LinearTuning& tuning, LinearOrder order) {
  AFD_CHECK(w_dtype == DType::bf16 || w_dtype == DType::f32, "linear: weights must be bf16 or f32");
  AFD_CHECK(n >= 0 && rows >= 0 && cols >= 0);
  AFD_CHECK(scratch.size() >= (pool != nullptr ? pool->size() : 1), "linear: fewer scratch slots than threads");
  AFD_CHECK(n <= 1 || (x_stride >= cols && y_stride >= rows), "linear: row strides shorter than rows");
  if (n == 0 || rows == 0) return;
  const bool w_bf16 = w_dtype == DType::bf16;
  const bool act_bf16 = prec == ActPrecision::bf16;
  const Isa isa = active_isa();
  const Path path = choose_path(n, cols, w_bf16, act_bf16, isa, order, tuning);
  const uint16_t* wb = static_cast<const uint16_t*>(w);
  const float* wf = static_cast<const float*>(w);

  // Prepare activations once on the calling thread (cheap next to streaming W), into its slot
  // (0), held until the call returns.
  const int64_t ldx32 = (cols + 31) / 32 * 32;
  ScratchSlot& own = scratch.slot(0);
  ScratchSlot::Frame frame(own);
  const uint16_t* xb = nullptr;
  const float* xf = x;
  int64_t ldx = x_stride;
  switch (path) {
    case Path::avx512_dp: {
      // The small-n path reads every token's x at the same column for each W tile: x rows a
      // multiple of 1 KiB apart would put those lines into a few L1 sets next to the tile's W
      // lines, so such rows get 64 bytes of zero padding.
      const int64_t ldxp = n <= kSmallNMax && (ldx32 * 2) % 1024 == 0 ? ldx32 + 32 : ldx32;
      uint16_t* p = own.take<uint16_t>(static_cast<size_t>(n * ldxp));
      prep_x_bf16(x, n, x_stride, cols, p, ldxp);
      xb = p;
      ldx = ldxp;
      break;
    }
    case Path::avx512_dp_pairs:
    case Path::avx512_dp_pairs_canonical: {
      // Many tokens: the 16-token blocks are prepared in parallel (each is independent).
      uint16_t* p = own.take<uint16_t>(static_cast<size_t>((n + 15) / 16 * 16 * ldx32));
      const bool canonical = path == Path::avx512_dp_pairs_canonical;
      auto prep = [&](int64_t b0, int64_t b1, int) {
        const int64_t t0 = 16 * b0, t1 = std::min(n, 16 * b1);
        if (t0 < t1) prep_x_bf16_pairs(x + t0 * x_stride, t1 - t0, x_stride, cols, p + t0 * ldx32, ldx32, canonical);
      };
      if (pool != nullptr) pool->parallel_for((n + 15) / 16, prep);
      else prep(0, (n + 15) / 16, 0);
      xb = p;
      ldx = ldx32;
      break;
    }
    case Path::avx512_fma:
      if (w_bf16) {
        float* p = own.take<float>(static_cast<size_t>(n * ldx32));
        prep_x_f32_perm32(x, n, x_stride, cols, act_bf16, p, ldx32);
        xf = p;
        ldx = ldx32;
        break;
      }
      [[fallthrough]];
    default:
      if (act_bf16) {
        float* p = own.take<float>(static_cast<size_t>(n * ldx32));
        prep_x_f32(x, n, x_stride, cols, true, p, ldx32);
        xf = p;
        ldx = ldx32;
      }
      break;
  }
  if (path == Path::blas_sgemm) ensure_openblas_single_threaded();

  // Rows [r0, r1) on the thread that owns slot `ts`.
  auto rows_fn = [&](int64_t r0, int64_t r1, ScratchSlot& ts) {
    switch (path) {
      case Path::avx512_dp:
        rows_dp_bf16_avx512(xb, n, ldx, wb, cols, r0, r1, y, y_stride, accumulate, ts, tuning);
        break;
      case Path::avx512_dp_pairs:
      case Path::avx512_dp_pairs_canonical:
        rows_dp_bf16_pairs_avx512(xb, n, ldx, wb, cols, r0, r1, y, y_stride, accumulate, ts,
                                  path == Path::avx512_dp_pairs_canonical);
        break;
      case Path::avx512_fma:
        if (w_bf16)
          rows_fma_bf16w_avx512(xf, n, ldx, wb, cols, r0, r1, y, y_stride, accumulate, tuning,
                                order == LinearOrder::batch_invariant);
        else
          rows_fma_f32w_avx512(xf, n, ldx, wf, cols, r0, r1, y, y_stride, accumulate, tuning,
                               order == LinearOrder::batch_invariant);
        break;
      case Path::avx2_fma:
        if (w_bf16)
          rows_fma_bf16w_avx2(xf, n, ldx, wb, cols, r0, r1, y, y_stride, accumulate);
        else
          rows_fma_f32w_avx2(xf, n, ldx, wf, cols, r0, r1, y, y_stride, accumulate);
        break;
      case Path::scalar:
        rows_scalar(xf, n, ldx, w, w_bf16, cols, r0, r1, y, y_stride, accumulate);
        break;
      case Path::blas_sgemm:
        if (w_bf16)
          sgemm_bf16w_rows(xf, n, ldx, wb, cols, r0, r1, y, y_stride, accumulate, ts);
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(n),
                      static_cast<blasint>(r1 - r0), static_cast<blasint>(cols), 1.0f, xf,
                      static_cast<blasint>(ldx), wf + r0 * cols, static_cast<blasint>(cols),
                      accumulate ? 1.0f : 0.0f, y + r0, static_cast<blasint>(y_stride));
        break;
    }
  };

  const int n_threads = pool ? pool->size() : 1;
  // Row chunks: multiples of 16 rows (tiles take 4, sgemm likes 16), kChunksPerThread per thread,
  // handed out dynamically, so a thread that starts late or is slowed by another process
  // leaves its chunks to the others. Each chunk is a contiguous stream of W.
  constexpr int64_t kChunksPerThread = 4, kRowAlign = 16;
  const int64_t max_chunks = rows / kRowAlign;
  if (n_threads <= 1 || max_chunks < 2) {
    rows_fn(0, rows, own);
  } else {
    const int64_t n_chunks = std::min<int64_t>(max_chunks, n_threads * kChunksPerThread);
    const int64_t chunk = ((rows + n_chunks - 1) / n_chunks + kRowAlign - 1) / kRowAlign * kRowAlign;
    const int n_tasks = static_cast<int>((rows + chunk - 1) / chunk);
    pool->run(n_tasks, [&](int task, int thread) {
      const int64_t b = task * chunk;
      rows_fn(b, std::min(rows, b + chunk), scratch.slot(thread));
    });
  }
}

}  // namespace detail

const char* linear_impl_name(ActPrecision prec) {
  switch (active_isa()) {
    case Isa::avx512: return prec == ActPrecision::bf16 ? "avx512_bf16" : "avx512_fma";
    case Isa::avx2: return "avx2";
    case Isa::scalar: return "scalar";
  }
  return "?";
}

namespace detail {
const char* linear_path_name(int64_t n, DType w_dtype, ActPrecision prec, int64_t cols, LinearOrder order,
                             const LinearTuning& tuning) {
  return path_name(
      choose_path(n, cols, w_dtype == DType::bf16, prec == ActPrecision::bf16, active_isa(), order, tuning));
}
}  // namespace detail

const char* linear_path_name(int64_t n, DType w_dtype, ActPrecision prec, int64_t cols, LinearOrder order) {
  return detail::linear_path_name(n, w_dtype, prec, cols, order, detail::LinearTuning{});
}

}  // namespace afd::kernels
