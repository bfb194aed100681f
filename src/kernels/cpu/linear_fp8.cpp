// linear_fp8(): dispatch between the gemv kernels (few tokens: W streamed from memory once,
// converted in registers) and dequantized tiles fed to linear()'s tile kernels (many tokens),
// with W's rows split across the ThreadPool as in linear(); the scalar reference; block
// quantization.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/linear_kernels.h"

namespace afd::kernels {

namespace detail {

int64_t fp8_gemv_ldx(int64_t cols) { return (cols + kFp8Block - 1) / kFp8Block * kFp8Block; }

void prep_x_fp8_gemv_f32(const float* x, int64_t n, int64_t x_stride, int64_t cols, bool round, float* xf) {
  const int64_t ldx = fp8_gemv_ldx(cols);
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    float* o = xf + i * ldx;
    if (round)
      for (int64_t c = 0; c < cols; ++c) o[c] = round_bf16(xi[c]);
    else
      std::copy(xi, xi + cols, o);
    std::fill(o + cols, o + ldx, 0.0f);
  }
}

void prep_x_fp8_gemv_bf16(const float* x, int64_t n, int64_t x_stride, int64_t cols, uint16_t* xb) {
  const int64_t ldx = fp8_gemv_ldx(cols);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t* o = xb + i * ldx;
    f32_to_bf16_row(x + i * x_stride, cols, o);
    std::fill(o + cols, o + ldx, uint16_t{0});
  }
}

bool cpu_has_avx512_vbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has;
}

void fp8_dequant_rows_f32_scalar(const Fp8BlockWeights& w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* q = w.q + r * cols;
    const float* s = fp8_scale_row(w, r);
    float* o = out + (r - r0) * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = fp8_e4m3_to_f32(q[c]) * s[c / kFp8Block];
  }
}

void prescale_x_fp8(const float* x, int64_t n, int64_t ldx, int64_t cols, const float* srow, float* xs,
                    int64_t ldxs) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c0 = 0; c0 < cols; c0 += kFp8Block) {
      const float s = srow[c0 / kFp8Block] * 256.0f;
      const int64_t c1 = std::min(cols, c0 + kFp8Block);
      for (int64_t c = c0; c < c1; ++c) xs[i * ldxs + c] = x[i * ldx + c] * s;
    }
}

}  // namespace detail

namespace {

using namespace detail;

enum class Path {
  scalar,
  avx2_gemv,
  avx2_tile,
  avx512_gemv,
  avx512_gemv_lut8,
  avx512_tile_bf16,
  avx512_tile_pairs,
  avx512_tile_f32
};

Path choose_path(int64_t n, int64_t cols, bool act_bf16, Isa isa, LinearOrder order, const Fp8Tuning& t) {
  // The bf16 gemv (AVX-512 BF16, bf16 activations) and the gemvs on f32 x have their own limits.
  const bool x_bf16 = act_bf16 && isa == Isa::avx512;
  const int64_t max_n = x_bf16 ? t.gemv_max_n : t.gemv_f32_max_n;
  const int64_t max_x = x_bf16 ? t.gemv_max_x_bytes : t.gemv_f32_max_x_bytes;
  const bool gemv = n <= max_n && (n == 1 || n * fp8_gemv_ldx(cols) * (x_bf16 ? 2 : 4) <= max_x);
  switch (isa) {
    case Isa::avx512: {
      // f32 activations: the gemv scales 128-column partial sums, the tiles each weight; in the
      // batch-invariant order the tiles take every n (linear()'s canonical f32-weight order).
      if (!act_bf16) return gemv && order == LinearOrder::fastest ? Path::avx512_gemv : Path::avx512_tile_f32;
      // bf16 activations: the byte-table gemv needs VBMI; without it the tiles take every n.
      if (gemv && t.gemv_lut == 2 && cpu_has_avx512_vbmi()) return Path::avx512_gemv_lut8;
      // Many tokens: the dequantized tiles go to linear()'s "pairs" kernel, as bf16 W would.
      LinearTuning lt;
      lt.pairs_min_n = t.pairs_min_n;
      return cols % 2 == 0 && n >= resolve_pairs_min_n(lt) ? Path::avx512_tile_pairs : Path::avx512_tile_bf16;
    }
    case Isa::avx2: return gemv ? Path::avx2_gemv : Path::avx2_tile;
    case Isa::scalar: break;
  }
  return Path::scalar;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::scalar: return "scalar_fp8";
    case Path::avx2_gemv: return "avx2_fp8_gemv";
    case Path::avx2_tile: return "avx2_fp8_tile_f32";
    case Path::avx512_gemv: return "avx512_fp8_gemv";
    case Path::avx512_gemv_lut8: return "avx512_fp8_gemv_lut8";
    case Path::avx512_tile_bf16: return "avx512_fp8_tile_bf16";
    case Path::avx512_tile_pairs: return "avx512_fp8_tile_pairs";
    case Path::avx512_tile_f32: return "avx512_fp8_tile_f32";
  }
  return "?";
}

}  // namespace

void linear_fp8(const float* x, int64_t n, int64_t x_stride, const Fp8BlockWeights& w, int64_t rows, int64_t cols,
                float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch, bool accumulate,
                LinearOrder order) {
  detail::linear_fp8_tuned(x, n, x_stride, w, rows, cols, y, y_stride, prec, pool, scratch, accumulate, order,
                           detail::Fp8Tuning{});
}

namespace detail {

void linear_fp8_tuned(const float* x, int64_t n, int64_t x_stride, const Fp8BlockWeights& w, int64_t rows, int64_t cols,
                      float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch,
                      bool accumulate, LinearOrder order, const Fp8Tuning& tuning) {
  AFD_CHECK(n >= 0 && rows >= 0 && cols >= 0);
  AFD_CHECK(scratch.size() >= (pool != nullptr ? pool->size() : 1), "linear_fp8: fewer scratch slots than threads");
  AFD_CHECK(n <= 1 || (x_stride >= cols && y_stride >= rows), "linear_fp8: row strides shorter than rows");
  AFD_CHECK(w.row_offset >= 0 && w.row_offset < kFp8Block, "linear_fp8: row_offset outside [0, 128)");
  AFD_CHECK(w.scale_stride >= (cols + kFp8Block - 1) / kFp8Block, "linear_fp8: scale_stride below the block count");
  if (n == 0 || rows == 0) return;
  const bool act_bf16 = prec == ActPrecision::bf16;
  const Path path = choose_path(n, cols, act_bf16, active_isa(), order, tuning);
  const int64_t tile_rows = std::max<int64_t>(16, tuning.tile_rows / 16 * 16);

  // Activations, prepared once on the calling thread into its slot (0), held until the call
  // returns.
  ScratchSlot& own = scratch.slot(0);
  ScratchSlot::Frame frame(own);
  const float* xf = x;
  const uint16_t* xb = nullptr;
  int64_t ldx = x_stride;
  switch (path) {
    case Path::avx512_gemv:
    case Path::avx2_gemv: {
      ldx = fp8_gemv_ldx(cols);
      float* p = own.take<float>(static_cast<size_t>(n * ldx));
      prep_x_fp8_gemv_f32(x, n, x_stride, cols, act_bf16, p);
      xf = p;
      break;
    }
    case Path::avx512_gemv_lut8: {
      ldx = fp8_gemv_ldx(cols);
      uint16_t* p = own.take<uint16_t>(static_cast<size_t>(n * ldx));
      prep_x_fp8_gemv_bf16(x, n, x_stride, cols, p);
      xb = p;
      break;
    }
    case Path::avx512_tile_bf16: {
      ldx = (cols + 31) / 32 * 32;
      uint16_t* p = own.take<uint16_t>(static_cast<size_t>(n * ldx));
      prep_x_bf16(x, n, x_stride, cols, p, ldx);
      xb = p;
      break;
    }
    case Path::avx512_tile_pairs: {
      ldx = (cols + 31) / 32 * 32;
      uint16_t* p = own.take<uint16_t>(static_cast<size_t>((n + 15) / 16 * 16 * ldx));
      prep_x_bf16_pairs(x, n, x_stride, cols, p, ldx, order == LinearOrder::batch_invariant);
      xb = p;
      break;
    }
    case Path::avx512_tile_f32: break;  // x used in place
    case Path::avx2_tile:
    case Path::scalar:
      if (act_bf16) {
        ldx = (cols + 31) / 32 * 32;
        float* p = own.take<float>(static_cast<size_t>(n * ldx));
        prep_x_f32(x, n, x_stride, cols, act_bf16, p, ldx);
        xf = p;
      }
      break;
  }

  // Rows [r0, r1) on the thread that owns slot `ts`.
  auto rows_fn = [&](int64_t r0, int64_t r1, ScratchSlot& ts) {
    switch (path) {
      case Path::avx512_gemv: fp8_gemv_avx512(xf, n, ldx, w, cols, r0, r1, y, y_stride, accumulate); return;
      case Path::avx512_gemv_lut8:
        fp8_gemv_lut8_avx512(xb, n, ldx, w, cols, r0, r1, y, y_stride, accumulate, ts);
        return;
      case Path::avx2_gemv: fp8_gemv_avx2(xf, n, ldx, w, cols, r0, r1, y, y_stride, accumulate, ts); return;
      default: break;
    }
    // Tiles: dequantize tile_rows rows once, reuse them for all n tokens. The tile buffer (and
    // on AVX2 the prescaled x) is taken once for the largest tile.
    ScratchSlot::Frame tile_frame(ts);
    const size_t tile_elems = static_cast<size_t>(std::min(tile_rows, r1 - r0) * cols);
    uint16_t* const wb_tile = path == Path::avx512_tile_bf16 || path == Path::avx512_tile_pairs
                                  ? ts.take<uint16_t>(tile_elems)
                                  : nullptr;
    float* const wf_tile = wb_tile == nullptr ? ts.take<float>(tile_elems) : nullptr;
    float* const xs = path == Path::avx2_tile ? ts.take<float>(static_cast<size_t>(n * cols)) : nullptr;
    for (int64_t rt = r0, nr; rt < r1; rt += nr) {
      nr = std::min(tile_rows, r1 - rt);
      // The AVX2 tiles end at scale rows: their x is prescaled per scale row.
      if (path == Path::avx2_tile) nr = fp8_scale_run_end(w, rt, rt + nr) - rt;
      float* yt = y + rt;
      switch (path) {
        case Path::avx512_tile_bf16: {
          uint16_t* t = wb_tile;
          fp8_dequant_rows_bf16_avx512(w, cols, rt, rt + nr, t);
          rows_dp_bf16_avx512(xb, n, ldx, t, cols, 0, nr, yt, y_stride, accumulate, ts);
          break;
        }
        case Path::avx512_tile_pairs: {
          uint16_t* t = wb_tile;
          fp8_dequant_rows_bf16_avx512(w, cols, rt, rt + nr, t);
          rows_dp_bf16_pairs_avx512(xb, n, ldx, t, cols, 0, nr, yt, y_stride, accumulate, ts,
                                    order == LinearOrder::batch_invariant);
          break;
        }
        case Path::avx512_tile_f32: {
          float* t = wf_tile;
          fp8_dequant_rows_f32_avx512(w, cols, rt, rt + nr, t);
          rows_fma_f32w_avx512(xf, n, ldx, t, cols, 0, nr, yt, y_stride, accumulate, {},
                               order == LinearOrder::batch_invariant);
          break;
        }
        case Path::avx2_tile: {
          // Unscaled rows of one scale row; x prescaled for it (linear_fp8_kernels.h).
          float* t = wf_tile;
          fp8_rows_unscaled_f32_avx2(w, cols, rt, rt + nr, t);
          prescale_x_fp8(xf, n, ldx, cols, fp8_scale_row(w, rt), xs, cols);
          rows_fma_f32w_avx2(xs, n, cols, t, cols, 0, nr, yt, y_stride, accumulate);
          break;
        }
        default: {
          float* t = wf_tile;
          fp8_dequant_rows_f32_scalar(w, cols, rt, rt + nr, t);
          rows_scalar(xf, n, ldx, t, /*is_bf16=*/false, cols, 0, nr, yt, y_stride, accumulate);
          break;
        }
      }
    }
  };

  // Row chunks as in linear(): multiples of 16 rows, a few per thread, handed out dynamically.
  const int n_threads = pool ? pool->size() : 1;
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

const char* linear_fp8_path_name(int64_t n, int64_t cols, ActPrecision prec, LinearOrder order,
                                 const Fp8Tuning& tuning) {
  return path_name(choose_path(n, cols, prec == ActPrecision::bf16, active_isa(), order, tuning));
}

}  // namespace detail

const char* linear_fp8_path_name(int64_t n, int64_t cols, ActPrecision prec) {
  return detail::linear_fp8_path_name(n, cols, prec, LinearOrder::fastest, detail::Fp8Tuning{});
}

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  const int64_t sb = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t br = 0; br * kFp8Block < rows; ++br) {
    const int64_t r0 = br * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
    for (int64_t bc = 0; bc < sb; ++bc) {
      const int64_t c0 = bc * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      scale[br * sb + bc] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * cols + c] = f32_to_fp8_e4m3(w[r * cols + c] / s);
    }
  }
}

void dequantize_fp8_blocks(const Fp8BlockWeights& w, int64_t rows, int64_t cols, float* out) {
  switch (active_isa()) {
    case Isa::avx512: detail::fp8_dequant_rows_f32_avx512(w, cols, 0, rows, out); return;
    case Isa::avx2: detail::fp8_dequant_rows_f32_avx2(w, cols, 0, rows, out); return;
    case Isa::scalar: break;
  }
  detail::fp8_dequant_rows_f32_scalar(w, cols, 0, rows, out);
}

namespace ref {

void linear_fp8(const float* x, int64_t n, int64_t x_stride, const Fp8BlockWeights& w, int64_t rows, int64_t cols,
                float* y, int64_t y_stride, ActPrecision prec, bool accumulate) {
  std::vector<float> wr(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    detail::fp8_dequant_rows_f32_scalar(w, cols, r, r + 1, wr.data());
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * x_stride;
      float acc = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float xv = prec == ActPrecision::bf16 ? round_bf16(xi[c]) : xi[c];
        acc += xv * wr[c];
      }
      float* o = y + i * y_stride + r;
      *o = accumulate ? *o + acc : acc;
    }
  }
}

}  // namespace ref

}  // namespace afd::kernels
