// gqa_decode_attend: the dispatch, the loop nest (compiled for AVX-512, AVX2 + FMA and the
// baseline ISA) and the scalar reference. The tiled AVX-512 kernel is in gqa_attention_avx512.cpp.
#include "kernels/cpu/gqa_attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/cpu_features.h"
#include "kernels/cpu/gqa_attention_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/score_tile.h"

namespace afd::kernels {

namespace {

// Scores in tiles of 16 positions (detail::score_tile), kernels::softmax per head, then P.V one
// V row at a time.
__attribute__((always_inline)) inline void attend_loop(const float* q, int64_t G, const PagedRows& k,
                                                       const PagedRows& v, int64_t j0, int64_t n_ctx, float scale,
                                                       float* out, ScratchSlot& scratch) {
  const int64_t hd = k.row_dim;
  const int64_t n = n_ctx - j0;
  constexpr int64_t kB = detail::kScoreTile;
  ScratchSlot::Frame frame(scratch);
  float* scores = scratch.take<float>(static_cast<size_t>(G * n));  // [G, n]
  float* r = scratch.take<float>(static_cast<size_t>(hd));
  float* kt = scratch.take<float>(static_cast<size_t>(hd * kB));
  float* krows = scratch.take<float>(static_cast<size_t>(hd * kB));
  for (int64_t jb = j0; jb < n_ctx; jb += kB)
    detail::score_tile(k, jb, std::min(kB, n_ctx - jb), q, hd, G, scale, krows, kt, &scores[jb - j0], n);
  for (int64_t h = 0; h < G; ++h) {
    softmax(&scores[h * n], n);
    std::memset(out + h * hd, 0, static_cast<size_t>(hd) * 4);
  }
  for (int64_t j = j0; j < n_ctx; ++j) {
    load_row(v, j, hd, r);
    for (int64_t h = 0; h < G; ++h) {
      const float p = scores[h * n + (j - j0)];
      float* oh = out + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] += p * r[i];
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void attend_loop_avx512(
    const float* q, int64_t G, const PagedRows& k, const PagedRows& v, int64_t j0, int64_t n_ctx, float scale,
    float* out, ScratchSlot& scratch) {
  attend_loop(q, G, k, v, j0, n_ctx, scale, out, scratch);
}

__attribute__((target("avx2,fma"))) void attend_loop_avx2(const float* q, int64_t G, const PagedRows& k,
                                                          const PagedRows& v, int64_t j0, int64_t n_ctx,
                                                          float scale, float* out, ScratchSlot& scratch) {
  attend_loop(q, G, k, v, j0, n_ctx, scale, out, scratch);
}

void attend_loop_portable(const float* q, int64_t G, const PagedRows& k, const PagedRows& v, int64_t j0,
                          int64_t n_ctx, float scale, float* out, ScratchSlot& scratch) {
  attend_loop(q, G, k, v, j0, n_ctx, scale, out, scratch);
}

enum class Path { avx512_tiled, mqa, loop_avx512, loop_avx2, loop_portable };

Path choose(int64_t head_dim, DType dtype, int64_t j0) {
  static const bool cpu_avx512 = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl;
  }();
  static const bool cpu_avx2 = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx2 && f.fma;
  }();
  const bool avx512 = cpu_avx512 && isa_limit() >= Isa::avx512;
  const bool avx2 = cpu_avx2 && isa_limit() >= Isa::avx2;
  if (avx512 && head_dim % 16 == 0 && (dtype == DType::bf16 || dtype == DType::f32 || dtype == DType::f8_e4m3))
    return Path::avx512_tiled;
  if (avx2 && j0 == 0) return Path::mqa;
  if (avx512) return Path::loop_avx512;
  if (avx2) return Path::loop_avx2;
  return Path::loop_portable;
}

}  // namespace

void gqa_decode_attend(const float* q, int64_t n_heads, const PagedRows& k, const PagedRows& v, int64_t j0,
                       int64_t n_ctx, float scale, float* out, ScratchSlot& scratch) {
  AFD_CHECK(v.row_dim == k.row_dim && v.dtype == k.dtype && v.block_size == k.block_size && 0 <= j0 && j0 < n_ctx,
            "gqa_decode_attend: bad shape");
  switch (choose(k.row_dim, k.dtype, j0)) {
    case Path::avx512_tiled: return detail::gqa_decode_avx512_tiled(q, n_heads, k, v, j0, n_ctx, scale, out, scratch);
    case Path::mqa:
      return mqa_decode_attend(q, k.row_dim, n_heads, k, &v, k.row_dim, n_ctx, scale, out, k.row_dim, scratch);
    case Path::loop_avx512: return attend_loop_avx512(q, n_heads, k, v, j0, n_ctx, scale, out, scratch);
    case Path::loop_avx2: return attend_loop_avx2(q, n_heads, k, v, j0, n_ctx, scale, out, scratch);
    case Path::loop_portable: return attend_loop_portable(q, n_heads, k, v, j0, n_ctx, scale, out, scratch);
  }
}

const char* gqa_decode_path_name(int64_t head_dim, int64_t j0) {
  switch (choose(head_dim, DType::bf16, j0)) {
    case Path::avx512_tiled: return "avx512_tiled";
    case Path::mqa: return "mqa";
    case Path::loop_avx512: return "loop_avx512";
    case Path::loop_avx2: return "loop_avx2";
    case Path::loop_portable: return "loop_portable";
  }
  return "?";
}

namespace ref {

void gqa_decode_attend(const float* q, int64_t n_heads, const PagedRows& k, const PagedRows& v, int64_t j0,
                       int64_t n_ctx, float scale, float* out) {
  const int64_t hd = k.row_dim, n = n_ctx - j0;
  std::vector<float> s(static_cast<size_t>(n)), row(static_cast<size_t>(hd));
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * hd;
    for (int64_t j = j0; j < n_ctx; ++j) {
      load_row(k, j, hd, row.data());
      float d = 0;
      for (int64_t i = 0; i < hd; ++i) d += qh[i] * row[i];
      s[j - j0] = d * scale;
    }
    ref::softmax(s.data(), n);
    float* oh = out + h * hd;
    std::fill(oh, oh + hd, 0.0f);
    for (int64_t j = j0; j < n_ctx; ++j) {
      load_row(v, j, hd, row.data());
      for (int64_t i = 0; i < hd; ++i) oh[i] += s[j - j0] * row[i];
    }
  }
}

}  // namespace ref

}  // namespace afd::kernels
