// mqa_decode_attend: the scalar reference, the portable tiled f32 loop nest, and the dispatch
// to the bf16 dot-product kernel (mla_attention_avx512.cpp) for bf16 rows on AVX-512 BF16 CPUs
// and to the f32 register-tiled kernel (mla_attention_avx2.cpp) on every other AVX2 CPU and
// row dtype.
#include "kernels/cpu/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/mla_attention_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/score_tile.h"

namespace afd::kernels {

namespace {

// Portable tiled f32 version over positions [j0, j1): kTile key rows are widened once into a
// transposed tile kt[d][kTile] and shared by all heads (scores: kTile accumulators per head, one
// broadcast-FMA per element); P.V adds each widened value row into the heads' outputs.
constexpr int64_t kTile = detail::kScoreTile;

void tiled_portable(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& kv, const PagedRows* v,
                    int64_t d_lat, int64_t j0, int64_t j1, float scale, const MqaPartial& part, ScratchSlot& scratch,
                    const int64_t* row_ctx) {
  const int64_t D = kv.row_dim, n = j1 - j0;
  const PagedRows& vr = v != nullptr ? *v : kv;
  ScratchSlot::Frame frame(scratch);
  float* const rows = scratch.take<float>(static_cast<size_t>(kTile * std::max(D, d_lat)));
  float* const kt = scratch.take<float>(static_cast<size_t>(kTile * D));
  float* const sc = scratch.take<float>(static_cast<size_t>(n_heads * n));
  for (int64_t jb = 0; jb < n; jb += kTile)
    detail::score_tile(kv, j0 + jb, std::min(kTile, n - jb), q, q_stride, n_heads, scale, rows, kt, &sc[jb], n);
  for (int64_t h = 0; h < n_heads; ++h) {
    float* s = &sc[h * n];
    // Positions past the row's end: probability 0 (P.V then adds exact zeros).
    const int64_t nh = row_ctx != nullptr ? std::min(n, row_ctx[h] - j0) : n;
    float mx = s[0], sum = 0;
    for (int64_t j = 1; j < nh; ++j) mx = std::max(mx, s[j]);
    for (int64_t j = 0; j < nh; ++j) sum += (s[j] = std::exp(s[j] - mx));
    std::fill(s + nh, s + n, 0.0f);
    part.m[h] = mx;
    part.l[h] = sum;
    std::memset(part.o + h * part.o_stride, 0, static_cast<size_t>(d_lat) * 4);
  }
  const int64_t VS = std::max(D, d_lat);  // row stride of `rows` in the P.V loop
  for (int64_t jb = 0; jb < n; jb += kTile) {
    const int64_t nb = std::min(kTile, n - jb);
    for (int64_t t = 0; t < nb; ++t) load_row(vr, j0 + jb + t, d_lat, &rows[t * VS]);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* oh = part.o + h * part.o_stride;
      for (int64_t t = 0; t < nb; ++t) {
        const float p = sc[h * n + jb + t];
        const float* r = &rows[t * VS];
        for (int64_t i = 0; i < d_lat; ++i) oh[i] += p * r[i];
      }
    }
  }
}

}  // namespace

const char* mla_decode_path_name(DType kv_dtype) {
  const Isa isa = active_isa();
  if (isa == Isa::avx512 && kv_dtype == DType::bf16) return "avx512_bf16_dp";
  if (isa == Isa::avx512 || isa == Isa::avx2) return "avx2_f32";
  return "scalar_f32";
}

void mqa_decode_segment(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                        int64_t v_dim, int64_t n_ctx, int64_t seg, float scale, const MqaPartial& part,
                        ScratchSlot& scratch, const int64_t* row_ctx) {
  AFD_CHECK(n_ctx >= 1 && (v != nullptr ? v->row_dim == v_dim && v->dtype == k.dtype && v->block_size == k.block_size
                                        : v_dim <= k.row_dim),
            "mqa_decode_attend: bad shape");
  AFD_CHECK(seg >= 0 && seg < mqa_decode_segments(n_ctx), "mqa_decode_segment: segment out of range");
  const int64_t j0 = seg * kMqaSegment, j1 = std::min(n_ctx, j0 + kMqaSegment);
  // Rows whose end is at or past the segment's see all of it: no mask needed.
  if (row_ctx != nullptr) {
    bool masked = false;
    for (int64_t h = 0; h < n_heads; ++h) {
      AFD_CHECK(row_ctx[h] >= 1 && row_ctx[h] <= n_ctx && mqa_decode_segments(row_ctx[h]) == mqa_decode_segments(n_ctx),
                "mqa_decode_attend: row_ctx outside the call's last segment");
      masked = masked || row_ctx[h] < j1;
    }
    if (!masked) row_ctx = nullptr;
  }
  const Isa isa = active_isa();
  if (isa == Isa::avx512 && k.dtype == DType::bf16 && v_dim % 32 == 0 && k.row_dim % 2 == 0)
    return detail::mqa_decode_avx512_bf16(q, q_stride, n_heads, k, v, v_dim, j0, j1, scale, part, scratch, row_ctx);
  if (isa == Isa::avx512 || isa == Isa::avx2)
    return detail::mqa_decode_avx2(q, q_stride, n_heads, k, v, v_dim, j0, j1, scale, part, scratch, row_ctx);
  tiled_portable(q, q_stride, n_heads, k, v, v_dim, j0, j1, scale, part, scratch, row_ctx);
}

void mqa_decode_combine(int64_t n_heads, int64_t v_dim, const MqaPartial* parts, int64_t n_parts, float* out,
                        int64_t out_stride, ScratchSlot& scratch) {
  ScratchSlot::Frame frame(scratch);
  float* const w = scratch.take<float>(static_cast<size_t>(n_parts));
  for (int64_t h = 0; h < n_heads; ++h) {
    float mx = parts[0].m[h];
    for (int64_t s = 1; s < n_parts; ++s) mx = std::max(mx, parts[s].m[h]);
    float sum = 0;
    for (int64_t s = 0; s < n_parts; ++s) sum += (w[s] = std::exp(parts[s].m[h] - mx)) * parts[s].l[h];
    const float inv = 1.0f / sum;
    float* oh = out + h * out_stride;
    for (int64_t c = 0; c < v_dim; ++c) {
      float acc = 0;
      for (int64_t s = 0; s < n_parts; ++s) acc += w[s] * parts[s].o[h * parts[s].o_stride + c];
      oh[c] = acc * inv;
    }
  }
}

void mqa_decode_attend(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                       int64_t v_dim, int64_t n_ctx, float scale, float* out, int64_t out_stride,
                       ScratchSlot& scratch, const int64_t* row_ctx) {
  const int64_t ns = n_ctx >= 1 ? mqa_decode_segments(n_ctx) : 1;
  // One segment: its unnormalised result goes straight into out and is combined in place.
  // Several: each into a partial taken from scratch, combined in order.
  ScratchSlot::Frame frame(scratch);
  float* const ml = scratch.take<float>(static_cast<size_t>(2 * ns * n_heads));
  float* const os = ns > 1 ? scratch.take<float>(static_cast<size_t>(ns * n_heads * v_dim)) : nullptr;
  MqaPartial* const parts = scratch.take<MqaPartial>(static_cast<size_t>(ns));
  for (int64_t s = 0; s < ns; ++s) {
    parts[s] = ns == 1 ? MqaPartial{out, out_stride, &ml[0], &ml[n_heads]}
                       : MqaPartial{&os[s * n_heads * v_dim], v_dim, &ml[2 * s * n_heads], &ml[(2 * s + 1) * n_heads]};
    mqa_decode_segment(q, q_stride, n_heads, k, v, v_dim, n_ctx, s, scale, parts[s], scratch, row_ctx);
  }
  mqa_decode_combine(n_heads, v_dim, parts, ns, out, out_stride, scratch);
}

namespace ref {
void mqa_decode_attend(const float* q, int64_t q_stride, int64_t n_heads, const PagedRows& k, const PagedRows* v,
                       int64_t v_dim, int64_t n_ctx, float scale, float* out, int64_t out_stride) {
  const int64_t D = k.row_dim;
  const PagedRows& vr = v != nullptr ? *v : k;
  std::vector<float> rows(static_cast<size_t>(n_ctx * D)), vals(static_cast<size_t>(n_ctx * v_dim)),
      s(static_cast<size_t>(n_ctx));
  for (int64_t j = 0; j < n_ctx; ++j) {
    load_row(k, j, D, &rows[j * D]);
    load_row(vr, j, v_dim, &vals[j * v_dim]);
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * q_stride;
    for (int64_t j = 0; j < n_ctx; ++j) {
      float a = 0;
      for (int64_t i = 0; i < D; ++i) a += qh[i] * rows[j * D + i];
      s[j] = a * scale;
    }
    ref::softmax(s.data(), n_ctx);
    float* oh = out + h * out_stride;
    for (int64_t i = 0; i < v_dim; ++i) oh[i] = 0;
    for (int64_t j = 0; j < n_ctx; ++j)
      for (int64_t i = 0; i < v_dim; ++i) oh[i] += s[j] * vals[j * v_dim + i];
  }
}
}  // namespace ref

}  // namespace afd::kernels
