// The AVX-512 kernel of causal_attention (contract and dispatch: causal_attention.h).
//
// 1. Keys transposed once per call, block by block: kt[g][b][d][t] = k[64 b + t][g][d]
//    (positions padded with zeros to a multiple of kPB = 64), so a key block's scores are
//    broadcast-FMAs with no horizontal sums and a block's [hd][64] values are contiguous.
// 2. Tasks of (block of qb query tokens, KV head g), most expensive (last) blocks first. A
//    task's rows are its (token, head of g) pairs, token-major, so positions never decrease
//    with the row index. Each task writes its rows of out and nothing else.
//    - scores, only over the position blocks that meet some row's causal range:
//      CausalOrder::fast: register tiles of kRB rows x kPB positions (16 accumulators; per
//      head_dim element 4 key vectors and kRB broadcast query values), each score one fma
//      chain over head_dim; CausalOrder::decode: per row and block score64_t
//      (score_tile_avx512.h: the scores of gqa_decode_attend, bit for bit);
//    - kernels::softmax over each row's range [lo_r, pos_r], every other entry of the row
//      set to 0;
//    - P.V: register tiles of kRB rows x CB 16-value chunks, each output element one fma chain
//      over the positions of the tile's rows' ranges in ascending order from +0 (another row's
//      positions contribute fma(0, v, acc) = acc), written to out once — the decode kernel's
//      P.V order.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/causal_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/score_tile_avx512.h"

namespace afd::kernels::detail {

namespace {

constexpr int64_t kPB = 64;   // positions per score block (4 vectors)
constexpr int kRB = 4;        // rows per register tile
constexpr int64_t kQB = 16;   // query tokens per task at most
// Score floats one task may hold (rows x padded positions); fewer tokens per task beyond it.
constexpr int64_t kScoreBudget = int64_t{1} << 18;

#define AFD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), always_inline)) inline

// sr[r][0 .. kPB) = scale * sum_d qr[r][d] * kt[d * kPB + 0 .. kPB) for RB rows.
template <int RB>
AFD_AVX512 void score_block(const float* const* qr, const float* kt, int64_t hd, float scale, float* const* sr) {
  __m512 acc[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const float* kd = kt + d * kPB;
    const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16), k2 = _mm512_loadu_ps(kd + 32),
                 k3 = _mm512_loadu_ps(kd + 48);
    for (int r = 0; r < RB; ++r) {
      const __m512 qv = _mm512_set1_ps(qr[r][d]);
      acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qv, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(qv, k3, acc[r][3]);
    }
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(sr[r] + 16 * c, _mm512_mul_ps(acc[r][c], sv));
}

// o[r][0 .. 16 CB) = sum_{t < nt} p[r][t] * vt[t * kv_stride + 0 .. 16 CB) for RB rows.
template <int RB, int CB>
AFD_AVX512 void pv_block(const float* const* p, const float* vt, int64_t kv_stride, int64_t nt, float* const* o) {
  __m512 acc[RB][CB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < nt; ++t) {
    const float* vr = vt + t * kv_stride;
    __m512 x[CB];
    for (int c = 0; c < CB; ++c) x[c] = _mm512_loadu_ps(vr + 16 * c);
    for (int r = 0; r < RB; ++r) {
      const __m512 pv = _mm512_set1_ps(p[r][t]);
      for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_fmadd_ps(pv, x[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) _mm512_storeu_ps(o[r] + 16 * c, acc[r][c]);
}

#undef AFD_AVX512

#define AFD_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))

AFD_AVX512_FN void score_rows(int rb, const float* const* qr, const float* kt, int64_t hd, float scale,
                              float* const* sr) {
  switch (rb) {
    case 1: score_block<1>(qr, kt, hd, scale, sr); break;
    case 2: score_block<2>(qr, kt, hd, scale, sr); break;
    case 3: score_block<3>(qr, kt, hd, scale, sr); break;
    default: score_block<4>(qr, kt, hd, scale, sr); break;
  }
}

template <int CB>
AFD_AVX512_FN void pv_rows_cb(int rb, const float* const* p, const float* vt, int64_t kv_stride, int64_t nt,
                              float* const* o) {
  switch (rb) {
    case 1: pv_block<1, CB>(p, vt, kv_stride, nt, o); break;
    case 2: pv_block<2, CB>(p, vt, kv_stride, nt, o); break;
    case 3: pv_block<3, CB>(p, vt, kv_stride, nt, o); break;
    default: pv_block<4, CB>(p, vt, kv_stride, nt, o); break;
  }
}

AFD_AVX512_FN void pv_rows(int rb, int cb, const float* const* p, const float* vt, int64_t kv_stride, int64_t nt,
                           float* const* o) {
  if (cb == 4) return pv_rows_cb<4>(rb, p, vt, kv_stride, nt, o);
  if (cb == 2) return pv_rows_cb<2>(rb, p, vt, kv_stride, nt, o);
  pv_rows_cb<1>(rb, p, vt, kv_stride, nt, o);
}

struct Call {
  const float* q;
  int64_t q_stride, nq, p0;
  const float* v;
  int64_t kv_stride;
  CausalAttnShape s;
  float scale;
  float* out;
  int64_t out_stride;
  const float* kt;  // [n_kv_heads][ncp / kPB][head_dim][kPB]
  int64_t ncp;
  CausalOrder order;
};

// Rows of query tokens [i0, i0 + nb) and the heads of KV head g. scratch: the running thread's
// slot; the task's scores S [R][ns], query and output row pointers, positions and window starts,
// for the task.
AFD_AVX512_FN void run_task(const Call& c, int64_t i0, int64_t nb, int64_t g, ScratchSlot& scratch) {
  const int64_t hd = c.s.head_dim, G = c.s.n_heads / c.s.n_kv_heads, R = nb * G, W = c.s.window;
  const int64_t hi = c.p0 + i0 + nb;  // one past the last position of the block
  const int64_t lo0 = W > 0 ? std::max<int64_t>(0, c.p0 + i0 + 1 - W) : 0;
  const int64_t jlo = lo0 / kPB * kPB, ns = (hi - jlo + kPB - 1) / kPB * kPB;
  ScratchSlot::Frame frame(scratch);
  float* const S = scratch.take<float>(static_cast<size_t>(R * ns));
  const float** const qr = scratch.take<const float*>(static_cast<size_t>(R));
  float** const orow = scratch.take<float*>(static_cast<size_t>(R));
  int64_t* const pos = scratch.take<int64_t>(static_cast<size_t>(R));
  int64_t* const lo = scratch.take<int64_t>(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = i0 + r / G, h = g * G + r % G;
    qr[r] = c.q + i * c.q_stride + h * hd;
    orow[r] = c.out + i * c.out_stride + h * hd;
    pos[r] = c.p0 + i;
    lo[r] = W > 0 ? std::max<int64_t>(0, pos[r] + 1 - W) : 0;
  }
  const float* ktg = c.kt + g * c.ncp * hd;  // this head's position blocks [ncp / kPB][hd][kPB]
  if (c.order == CausalOrder::decode) {
    const __m512 vs = _mm512_set1_ps(c.scale);
    __m512 sc[4];
    for (int64_t jb = jlo; jb < hi; jb += kPB) {
      for (int64_t r = 0; r < R; ++r) {
        if (jb > pos[r] || jb + kPB <= lo[r]) continue;
        score64_t(qr[r], ktg + jb * hd, kPB, hd, vs, sc);
        for (int b = 0; b < 4; ++b) _mm512_storeu_ps(&S[r * ns + (jb - jlo) + 16 * b], sc[b]);
      }
    }
  } else {
    float* sr[kRB];
    for (int64_t r0 = 0; r0 < R; r0 += kRB) {
      const int rb = static_cast<int>(std::min<int64_t>(kRB, R - r0));
      const int64_t maxpos = pos[r0 + rb - 1], minlo = lo[r0];
      for (int64_t jb = jlo; jb <= maxpos; jb += kPB) {
        if (jb + kPB <= minlo) continue;
        for (int r = 0; r < rb; ++r) sr[r] = &S[(r0 + r) * ns + (jb - jlo)];
        score_rows(rb, &qr[r0], ktg + jb * hd, hd, c.scale, sr);
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* row = &S[r * ns];
    const int64_t a = lo[r] - jlo, b = pos[r] - jlo + 1;
    softmax(row + a, b - a);
    std::memset(row, 0, static_cast<size_t>(a) * 4);
    std::memset(row + b, 0, static_cast<size_t>(ns - b) * 4);
  }
  const int64_t nv = hd / 16, cb = nv % 4 == 0 ? 4 : nv % 2 == 0 ? 2 : 1;
  const float* pr[kRB];
  float* orr[kRB];
  for (int64_t r0 = 0; r0 < R; r0 += kRB) {
    const int rb = static_cast<int>(std::min<int64_t>(kRB, R - r0));
    const int64_t tlo = lo[r0], thi = pos[r0 + rb - 1] + 1;
    for (int r = 0; r < rb; ++r) pr[r] = &S[(r0 + r) * ns + (tlo - jlo)];
    for (int64_t c0 = 0; c0 < nv; c0 += cb) {
      for (int r = 0; r < rb; ++r) orr[r] = orow[r0 + r] + 16 * c0;
      pv_rows(rb, static_cast<int>(cb), pr, c.v + tlo * c.kv_stride + g * hd + 16 * c0, c.kv_stride, thi - tlo, orr);
    }
  }
}

}  // namespace

void causal_attention_avx512(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k, const float* v,
                             int64_t kv_stride, const CausalAttnShape& s, float scale, float* out, int64_t out_stride,
                             ThreadPool* pool, ScratchArena& scratch, CausalOrder order) {
  AFD_CHECK(scratch.size() >= (pool != nullptr ? pool->size() : 1),
            "causal_attention: fewer scratch slots than threads");
  const int64_t hd = s.head_dim, KVH = s.n_kv_heads, G = s.n_heads / KVH, n_ctx = p0 + nq;
  const int64_t ncp = (n_ctx + kPB - 1) / kPB * kPB;
  // The transposed keys, in the calling thread's slot (0) for the call; the pool's tasks read them.
  ScratchSlot& own = scratch.slot(0);
  ScratchSlot::Frame frame(own);
  float* const ktp = own.take<float>(static_cast<size_t>(KVH * hd * ncp));
  const int64_t pblocks = ncp / kPB;
  auto transpose = [&](int task, int) {
    const int64_t g = task / pblocks, jb = (task % pblocks) * kPB;
    for (int64_t d = 0; d < hd; ++d) {
      float* dst = ktp + (g * ncp + jb) * hd + d * kPB;
      const float* src = k + jb * kv_stride + g * hd + d;
      for (int64_t t = 0; t < kPB; ++t) dst[t] = jb + t < n_ctx ? src[t * kv_stride] : 0.0f;
    }
  };
  const int n_tr = static_cast<int>(KVH * pblocks);
  if (pool != nullptr) pool->run(n_tr, transpose);
  else
    for (int t = 0; t < n_tr; ++t) transpose(t, 0);

  const int64_t qb = std::clamp<int64_t>(kScoreBudget / (G * ncp), 1, kQB);
  const Call c{q, q_stride, nq, p0, v, kv_stride, s, scale, out, out_stride, ktp, ncp, order};
  const int64_t nqb = (nq + qb - 1) / qb;
  auto task = [&](int t, int thread) {
    const int64_t b = nqb - 1 - t / KVH, g = t % KVH, i0 = b * qb;
    run_task(c, i0, std::min(qb, nq - i0), g, scratch.slot(thread));
  };
  const int n_tasks = static_cast<int>(nqb * KVH);
  if (pool != nullptr) pool->run(n_tasks, task);
  else for (int t = 0; t < n_tasks; ++t) task(t, 0);
}

}  // namespace afd::kernels::detail
