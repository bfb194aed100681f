// Causal grouped-query attention of a run of query tokens at consecutive positions of one
// sequence (prefill), over contiguous f32 key / value rows:
//
//   for query i (0 <= i < nq) at position p = p0 + i and query head h of KV head g = h / G
//   (G = n_heads / n_kv_heads), with j0 = max(0, p + 1 - window) when window > 0, else 0:
//     s[i, h, j] = scale * q[i, h] . k[j, g]                       (j0 <= j <= p)
//     out[i, h]  = sum_{j0 <= j <= p} softmax_j(s[i, h, :]) * v[j, g]
//
// Layouts (f32): q row i at q + i * q_stride, head h at + h * head_dim; k and v row j
// (0 <= j < p0 + nq) at k + j * kv_stride, KV head g at + g * head_dim; out row i at
// out + i * out_stride, head h at + h * head_dim. out must not overlap q, k or v.
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"

namespace afd::kernels {

struct CausalAttnShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;
  int64_t window = 0;  // attend to the last `window` positions (Mixtral); 0 = all
};

// True when causal_attention runs its blocked kernel on this CPU for this head_dim (active ISA
// AVX-512 and head_dim % 16 == 0); otherwise it computes the scalar reference, which is much
// slower than a per-token decode kernel: callers keep their per-token path then.
bool causal_attention_blocked(int64_t head_dim);

// Summation order of the blocked kernel's scores.
enum class CausalOrder : uint8_t {
  // Keys transposed once per call; each score one fma chain over head_dim (the fastest).
  fast,
  // Each query row's scores, softmax and P.V in the canonical per-query order of
  // gqa_attention.h: every output row is bit-identical to gqa_decode_attend (its avx512_tiled
  // path) of that query over the same key / value rows and positions, whatever nq, p0, the
  // row's place in the run and the pool — a prompt position gets the same bits whether a run
  // or the per-token kernel attends it (batch invariance).
  decode,
};

// Dispatch: causal_attention_blocked(head_dim) -> the AVX-512 kernel: tasks of (block of up to
// 16 query tokens, KV head) on `pool`: scores of the block's (token, head) rows in `order`,
// kernels::softmax over each row's causal range in f32, P.V with register tiles of 4 rows x 64
// output values (each output value one fma chain over the positions in ascending order).
// Products in f32; the result differs from the reference only in the f32 summation order.
// Otherwise: ref::causal_attention. pool may be null (one thread).
// scratch: one slot per thread that runs the call, at least pool->size() (1 without a pool), as
// linear()'s (ops.h): slot 0 is the calling thread's and holds the transposed keys (n_kv_heads x
// head_dim x round_up(p0 + nq, 64) floats) until the call returns; a task on pool thread t takes
// from slot t its block's scores (up to 16 x n_heads / n_kv_heads rows of the context) while it
// runs.
void causal_attention(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k, const float* v,
                      int64_t kv_stride, const CausalAttnShape& s, float scale, float* out, int64_t out_stride,
                      ThreadPool* pool, ScratchArena& scratch, CausalOrder order = CausalOrder::fast);

namespace ref {
// Scalar reference: one (token, head) at a time, scores in f32, kernels::softmax, P.V in
// position order.
void causal_attention(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k, const float* v,
                      int64_t kv_stride, const CausalAttnShape& s, float scale, float* out, int64_t out_stride);
}  // namespace ref

namespace detail {
// The AVX-512 kernel of causal_attention (head_dim % 16 == 0; causal_attention_avx512.cpp).
void causal_attention_avx512(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k, const float* v,
                             int64_t kv_stride, const CausalAttnShape& s, float scale, float* out, int64_t out_stride,
                             ThreadPool* pool, ScratchArena& scratch, CausalOrder order);
}  // namespace detail

}  // namespace afd::kernels
