// causal_attention: the scalar reference and the dispatch to the AVX-512 kernel
// (causal_attention_avx512.cpp).
#include "kernels/cpu/causal_attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace afd::kernels {

namespace ref {

void causal_attention(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k, const float* v,
                      int64_t kv_stride, const CausalAttnShape& s, float scale, float* out, int64_t out_stride) {
  const int64_t hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
  std::vector<float> sc(static_cast<size_t>(p0 + nq));
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t p = p0 + i, j0 = s.window > 0 ? std::max<int64_t>(0, p + 1 - s.window) : 0;
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t g = h / G;
      const float* qh = q + i * q_stride + h * hd;
      for (int64_t j = j0; j <= p; ++j) {
        const float* kj = k + j * kv_stride + g * hd;
        float acc = 0;
        for (int64_t d = 0; d < hd; ++d) acc += qh[d] * kj[d];
        sc[j] = acc * scale;
      }
      softmax(&sc[j0], p - j0 + 1);
      float* oh = out + i * out_stride + h * hd;
      std::memset(oh, 0, static_cast<size_t>(hd) * 4);
      for (int64_t j = j0; j <= p; ++j) {
        const float* vj = v + j * kv_stride + g * hd;
        for (int64_t d = 0; d < hd; ++d) oh[d] += sc[j] * vj[d];
      }
    }
  }
}

}  // namespace ref

bool causal_attention_blocked(int64_t head_dim) { return active_isa() == Isa::avx512 && head_dim % 16 == 0; }

void causal_attention(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k, const float* v,
                      int64_t kv_stride, const CausalAttnShape& s, float scale, float* out, int64_t out_stride,
                      ThreadPool* pool, ScratchArena& scratch, CausalOrder order) {
  if (nq <= 0) return;
  if (causal_attention_blocked(s.head_dim))
    return detail::causal_attention_avx512(q, q_stride, nq, p0, k, v, kv_stride, s, scale, out, out_stride, pool,
                                           scratch, order);
  ref::causal_attention(q, q_stride, nq, p0, k, v, kv_stride, s, scale, out, out_stride);
}

}  // namespace afd::kernels
