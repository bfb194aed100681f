// The AVX-512 kernel of causal_attention (contract and dispatch: causal_attention.h).
//
// Tasks of (block of qb query tokens, KV head g), most expensive (last) blocks first. A task's
// rows are its (token, head of g) pairs, token-major, so positions never decrease with the row
// index. Each task writes its rows of out and nothing else. Per row the arithmetic is the
// canonical per-query order of gqa_attention.h, so every output row is bit-identical to
// gqa_decode_attend's (avx512_tiled path) for that query over the same rows:
//   - scores: for each tile of 16 positions and each row whose causal range meets it,
//     S[r][j - jlo] = score16 (score_tile_avx512.h) of the row's query against the tile's key
//     rows (read in place; the tile past the last position from a zero-padded copy);
//   - kernels::softmax over each row's range [lo_r, pos_r], every other entry of the row set
//     to 0;
//   - P.V: register tiles of kRB rows x CB 16-value chunks, each output element one fma chain
//     over the positions in ascending order starting from +0 (the tile's other rows' positions
//     contribute fma(0, v, acc) = acc), written to out once.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/causal_attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/score_tile_avx512.h"

namespace afd::kernels::detail {

namespace {

constexpr int64_t kPB = 64;   // positions per row of S are padded to a multiple of kPB
constexpr int64_t kST = 16;   // positions per score tile (score16)
constexpr int kRB = 4;        // rows per register tile
constexpr int64_t kQB = 16;   // query tokens per task at most
// Score floats one task may hold (rows x padded positions); fewer tokens per task beyond it.
constexpr int64_t kScoreBudget = int64_t{1} << 18;

#define AFD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), always_inline)) inline

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
  const float* k;
  int64_t n_ctx;
};

// Rows of query tokens [i0, i0 + nb) and the heads of KV head g.
AFD_AVX512_FN void run_task(const Call& c, int64_t i0, int64_t nb, int64_t g) {
  const int64_t hd = c.s.head_dim, G = c.s.n_heads / c.s.n_kv_heads, R = nb * G, W = c.s.window;
  const int64_t hi = c.p0 + i0 + nb;  // one past the last position of the block
  const int64_t lo0 = W > 0 ? std::max<int64_t>(0, c.p0 + i0 + 1 - W) : 0;
  const int64_t jlo = lo0 / kPB * kPB, ns = (hi - jlo + kPB - 1) / kPB * kPB;
  thread_local std::vector<float> S;
  thread_local std::vector<const float*> qr;
  thread_local std::vector<float*> orow;
  thread_local std::vector<int64_t> pos, lo;
  S.resize(static_cast<size_t>(R * ns));
  qr.resize(static_cast<size_t>(R));
  orow.resize(static_cast<size_t>(R));
  pos.resize(static_cast<size_t>(R));
  lo.resize(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = i0 + r / G, h = g * G + r % G;
    qr[r] = c.q + i * c.q_stride + h * hd;
    orow[r] = c.out + i * c.out_stride + h * hd;
    pos[r] = c.p0 + i;
    lo[r] = W > 0 ? std::max<int64_t>(0, pos[r] + 1 - W) : 0;
  }
  // Scores, tile by tile: the tile's key rows in place, or (past the last position) copied
  // into kpad with the missing rows zero.
  thread_local std::vector<float> kpad;
  const __m512 vs = _mm512_set1_ps(c.scale);
  for (int64_t jb = jlo; jb < hi; jb += kST) {
    const float* K = c.k + jb * c.kv_stride + g * hd;
    int64_t k_stride = c.kv_stride;
    if (jb + kST > c.n_ctx) {
      kpad.assign(static_cast<size_t>(kST * hd), 0.0f);
      for (int64_t j = jb; j < c.n_ctx; ++j)
        std::memcpy(&kpad[(j - jb) * hd], c.k + j * c.kv_stride + g * hd, static_cast<size_t>(hd) * 4);
      K = kpad.data();
      k_stride = hd;
    }
    for (int64_t r = 0; r < R; ++r) {
      if (jb > pos[r] || jb + kST <= lo[r]) continue;
      _mm512_storeu_ps(&S[r * ns + (jb - jlo)], score16(qr[r], K, k_stride, hd, vs));
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

void causal_attention_avx512(const float* q, int64_t q_stride, int64_t nq, int64_t p0, const float* k,
                             const float* v, int64_t kv_stride, const CausalAttnShape& s, float scale, float* out,
                             int64_t out_stride, ThreadPool* pool) {
  const int64_t KVH = s.n_kv_heads, G = s.n_heads / KVH, n_ctx = p0 + nq;
  const int64_t ncp = (n_ctx + kPB - 1) / kPB * kPB;
  const int64_t qb = std::clamp<int64_t>(kScoreBudget / (G * ncp), 1, kQB);
  const Call c{q, q_stride, nq, p0, v, kv_stride, s, scale, out, out_stride, k, n_ctx};
  const int64_t nqb = (nq + qb - 1) / qb;
  auto task = [&](int t, int) {
    const int64_t b = nqb - 1 - t / KVH, g = t % KVH, i0 = b * qb;
    run_task(c, i0, std::min(qb, nq - i0), g);
  };
  const int n_tasks = static_cast<int>(nqb * KVH);
  if (pool != nullptr) pool->run(n_tasks, task);
  else for (int t = 0; t < n_tasks; ++t) task(t, 0);
}

}  // namespace afd::kernels::detail
