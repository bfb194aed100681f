#include "model/ffn_part.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/check.h"
#include "kernels/cpu/linear_fp8.h"

namespace afd {

namespace {

using kernels::ActPrecision;

// Expert buckets of at least this many rows gather and scatter them on the pool.
constexpr int64_t kParallelRows = 32;

// y [n, hidden] = swiglu_ffn(x [n, hidden]) using scratch (2 * n * inter floats); arena: the
// products' working memory (linear(), model/matrix.h).
void swiglu(const FfnWeights& f, const float* x, int64_t n, float* y, float* scratch, ActPrecision prec,
            kernels::LinearOrder order, ThreadPool* pool, ScratchArena& arena) {
  const int64_t inter = f.gate.rows;
  float* g = scratch;
  float* u = scratch + n * inter;
  linear(f.gate, x, n, g, prec, pool, arena, order);
  linear(f.up, x, n, u, prec, pool, arena, order);
  kernels::silu_mul(g, u, n * inter, g);
  linear(f.down, g, n, y, prec, pool, arena, order);
}

// Expert-parallel mode (decode: many experts of few tokens each): each pool thread runs whole
// experts (gather, gate, up, SwiGLU, down) on its own, largest buckets first, writing the
// bucket's rows into ys_all [n * K, hidden] at the bucket's place in `order`; then every token
// adds its experts' rows in increasing expert id. One pool region per layer instead of three per
// expert, and each thread streams whole expert matrices. The numbers equal the per-expert path:
// linear() computes every output element the same way on any row split, and the scatter keeps
// the per-token order of additions (ascending expert id).
constexpr int64_t kExpertParallelMaxRows = 64;

// max_m: the largest bucket of `active`.
void experts_in_parallel(const MoeWeights& moe, const std::vector<int32_t>& active, int64_t max_m,
                         const int32_t* start, const int32_t* order, const float* h, int64_t n, int64_t K,
                         int64_t hid, int64_t width, const float* weights, float* out, const FfnPartOptions& opt,
                         FfnScratch* scratch, ThreadPool* pool) {
  std::vector<int32_t> tasks = active;
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](int32_t a, int32_t b) { return start[a + 1] - start[a] > start[b + 1] - start[b]; });
  const int threads = pool->size();
  scratch->per_thread.resize(static_cast<size_t>(threads + 1));
  if (scratch->task_arenas.size() < static_cast<size_t>(threads))
    scratch->task_arenas.resize(static_cast<size_t>(threads));
  std::vector<float>& ys_all = scratch->per_thread[static_cast<size_t>(threads)];
  ys_all.resize(static_cast<size_t>(n * K * hid));
  pool->run(static_cast<int>(tasks.size()), [&](int task, int thread) {
    const int32_t e = tasks[static_cast<size_t>(task)];
    const int64_t m = start[e + 1] - start[e];
    const int32_t* sel = order + start[e];
    std::vector<float>& buf = scratch->per_thread[static_cast<size_t>(thread)];
    buf.resize(static_cast<size_t>(max_m * hid + 2 * max_m * width));
    float* xs = buf.data();
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(xs + r * hid, h + (sel[r] / K) * hid, static_cast<size_t>(hid) * sizeof(float));
    swiglu(moe.experts[e], xs, m, ys_all.data() + start[e] * hid, xs + max_m * hid, opt.prec, opt.order, nullptr,
           scratch->task_arenas[static_cast<size_t>(thread)]);
  });
  // pos[t * K + j]: the row of ys_all holding token t's slot j (-1: expert not run here).
  std::vector<int32_t>& pos = scratch->idx_pos;
  pos.assign(static_cast<size_t>(n * K), -1);
  for (int32_t e : active)
    for (int32_t p = start[e]; p < start[e + 1]; ++p) pos[order[p]] = p;
  pool->parallel_for(n, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      // The slots' rows in ascending bucket position = ascending expert id (the token's own
      // entries of pos, sorted in place; -1, the experts not run here, first).
      int32_t* p = pos.data() + t * K;
      std::sort(p, p + K);
      for (int64_t j = 0; j < K; ++j)
        if (p[j] >= 0) kernels::axpy(weights[order[p[j]]], ys_all.data() + p[j] * hid, hid, out + t * hid);
    }
  });
}

}  // namespace

void ffn_expert_rows(const ModelWeights& w, int64_t layer, int64_t expert, const float* h, int64_t m,
                     const float* weights, float* out, const FfnPartOptions& opt, FfnScratch* scratch,
                     ThreadPool* pool) {
  const LayerWeights& L = w.layers[layer];
  AFD_CHECK(L.is_moe && expert >= 0 && expert < static_cast<int64_t>(L.moe.experts.size()) &&
                !L.moe.experts[expert].empty(),
            "ffn_expert_rows: not a held routed expert");
  if (m == 0) return;
  const int n_threads = pool != nullptr ? pool->size() : 1;
  scratch->arena.reserve_slots(n_threads);
  const int64_t hid = w.config.hidden_size;
  const FfnWeights& f = L.moe.experts[expert];
  scratch->buf.resize(static_cast<size_t>(2 * m * f.gate.rows));
  swiglu(f, h, m, out, scratch->buf.data(), opt.prec, opt.order, pool, scratch->arena);
  for (int64_t i = 0; i < m; ++i) {
    float* row = out + i * hid;
    for (int64_t c = 0; c < hid; ++c) row[c] *= weights[i];
  }
}

void ffn_part(const ModelWeights& w, int64_t layer, const float* h, int64_t n, const int32_t* ids,
              const float* weights, float* out, const FfnPartOptions& opt, FfnScratch* scratch,
              ThreadPool* pool) {
  const ModelConfig& c = w.config;
  const LayerWeights& L = w.layers[layer];
  const int64_t hid = c.hidden_size;
  std::memset(out, 0, static_cast<size_t>(n * hid) * sizeof(float));
  if (n == 0) return;
  const int n_threads = pool != nullptr ? pool->size() : 1;
  scratch->arena.reserve_slots(n_threads);

  if (!L.is_moe) {
    if (!opt.include_shared) return;
    AFD_CHECK(!L.dense.empty(), "ffn_part: dense layer not held by these weights");
    const int64_t inter = L.dense.gate.rows;
    scratch->buf.resize(static_cast<size_t>(2 * n * inter));
    swiglu(L.dense, h, n, out, scratch->buf.data(), opt.prec, opt.order, pool, scratch->arena);
    return;
  }

  const int64_t K = c.n_experts_per_tok, E = c.n_experts, inter = c.moe_intermediate_size;
  const int64_t shared_inter = L.moe.shared.empty() ? 0 : L.moe.shared.gate.rows;
  const int64_t width = std::max(inter, shared_inter);
  // Layout of scratch->buf: xs [n, hid] | ys [n, hid] | swiglu scratch [2, n, width].
  scratch->buf.resize(static_cast<size_t>(2 * n * hid + 2 * n * width));
  float* xs = scratch->buf.data();
  float* ys = xs + n * hid;
  float* tmp = ys + n * hid;

  // Bucket (token, slot) pairs by expert: counting sort keeps token order inside a bucket.
  std::vector<int32_t>& idx = scratch->idx;
  idx.assign(static_cast<size_t>(E + 1 + n * K), 0);
  int32_t* start = idx.data();          // [E + 1]
  int32_t* order = idx.data() + E + 1;  // [n * K] flat (token * K + slot)
  for (int64_t t = 0; t < n * K; ++t) start[ids[t] + 1]++;
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  {
    std::vector<int32_t> fill(start, start + E);
    for (int64_t t = 0; t < n * K; ++t) order[fill[ids[t]]++] = static_cast<int32_t>(t);
  }

  auto held = [&](int64_t e) {
    if (start[e + 1] == start[e]) return false;
    if (!opt.experts_mask.empty() && !opt.experts_mask[e]) return false;
    AFD_CHECK(!L.moe.experts[e].empty(), "ffn_part: expert not held by these weights was not masked out");
    return true;
  };
  std::vector<int32_t> active;
  int64_t max_m = 0;
  for (int64_t e = 0; e < E; ++e)
    if (held(e)) {
      active.push_back(static_cast<int32_t>(e));
      max_m = std::max<int64_t>(max_m, start[e + 1] - start[e]);
    }

  if (pool != nullptr && pool->size() > 1 && max_m <= kExpertParallelMaxRows &&
      static_cast<int64_t>(active.size()) >= pool->size()) {
    experts_in_parallel(L.moe, active, max_m, start, order, h, n, K, hid, width, weights, out, opt, scratch,
                        pool);
  } else {
    for (int32_t e : active) {
      const int64_t m = start[e + 1] - start[e];
      const int32_t* sel = order + start[e];
      // Gather and scatter rows: one token occurs at most once in a bucket (its top-k experts
      // are distinct), so many rows are split over the pool without write conflicts.
      auto rows = [&](const std::function<void(int64_t, int64_t, int)>& fn) {
        if (pool != nullptr && m >= kParallelRows) pool->parallel_for(m, fn);
        else fn(0, m, 0);
      };
      rows([&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          std::memcpy(xs + r * hid, h + (sel[r] / K) * hid, static_cast<size_t>(hid) * sizeof(float));
      });
      swiglu(L.moe.experts[e], xs, m, ys, tmp, opt.prec, opt.order, pool, scratch->arena);
      rows([&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          kernels::axpy(weights[sel[r]], ys + r * hid, hid, out + (sel[r] / K) * hid);
      });
    }
  }

  if (opt.include_shared && shared_inter > 0) {
    swiglu(L.moe.shared, h, n, ys, tmp, opt.prec, opt.order, pool, scratch->arena);
    std::vector<float> gate(static_cast<size_t>(n), 1.0f);
    if (!L.moe.shared_gate.empty()) {
      linear(L.moe.shared_gate, h, n, gate.data(), ActPrecision::f32, pool, scratch->arena, opt.order);
      for (auto& g : gate) g = 1.0f / (1.0f + std::exp(-g));
    }
    for (int64_t i = 0; i < n; ++i) kernels::axpy(gate[i], ys + i * hid, hid, out + i * hid);
  }
}

}  // namespace afd

namespace afd {

namespace {

// Rank r of t of one SwiGLU FFN (see slice_ffn_tp). inter % t == 0 was checked.
// FP8 weights whose slice [r0, r1) does not start on a 128 block: the rank holds the block
// aligned superset [a0, a1) of gate/up rows and down columns, with down's columns outside
// [r0, r1) zero — those intermediate values are computed but contribute exactly 0, so the
// rank's output is still exactly its share.
FfnWeights slice_one(const FfnWeights& f, int r, int t, ModelWeights* out) {
  const int64_t inter = f.gate.rows, part = inter / t, r0 = r * part, r1 = r0 + part;
  int64_t a0 = r0, a1 = r1;
  if (!column_slice_aligned(f.down, r0)) {
    a0 = r0 / kernels::kFp8Block * kernels::kFp8Block;
    a1 = std::min(inter, (r1 + kernels::kFp8Block - 1) / kernels::kFp8Block * kernels::kFp8Block);
  }
  FfnWeights s;
  s.gate = matrix_rows(f.gate, a0, a1);
  s.up = matrix_rows(f.up, a0, a1);
  s.down = matrix_cols_copy(f.down, a0, a1, &out->owned_bytes, r0, r1);
  return s;
}

}  // namespace

Status check_ffn_tp_degree(const ModelWeights& w, int degree) {
  if (degree < 1 || degree > 64) return invalid_argument("FFN TP degree must be in [1, 64], got " + std::to_string(degree));
  auto check = [&](const FfnWeights& f, const char* field) -> Status {
    if (f.empty() || f.gate.rows % degree == 0) return Status();
    return invalid_argument("FFN TP degree " + std::to_string(degree) + " does not divide " + field + " = " +
                            std::to_string(f.gate.rows) + " (each TP rank holds I/t intermediate rows)");
  };
  for (const LayerWeights& L : w.layers) {
    if (L.is_moe) {
      if (!L.moe.experts.empty()) AFD_RETURN_IF_ERROR(check(L.moe.experts[0], "moe_intermediate_size"));
      AFD_RETURN_IF_ERROR(check(L.moe.shared, "shared_expert_intermediate_size"));
    } else {
      AFD_RETURN_IF_ERROR(check(L.dense, "intermediate_size"));
    }
  }
  return Status();
}

Result<std::shared_ptr<const ModelWeights>> slice_ffn_tp(std::shared_ptr<const ModelWeights> w, const FfnTpSlice& s) {
  if (!w) return invalid_argument("slice_ffn_tp: no model");
  AFD_RETURN_IF_ERROR(check_ffn_tp_degree(*w, s.degree));
  if (s.rank < 0 || s.rank >= s.degree)
    return invalid_argument("FFN TP rank " + std::to_string(s.rank) + " outside [0, " + std::to_string(s.degree) + ")");
  const int64_t E = w->config.n_experts;
  const int64_t eb = s.expert_end < 0 ? 0 : s.expert_begin, ee = s.expert_end < 0 ? E : s.expert_end;
  if (eb < 0 || eb > ee || ee > E)
    return invalid_argument("slice_ffn_tp: expert range [" + std::to_string(eb) + ", " + std::to_string(ee) +
                            ") outside the model's " + std::to_string(E) + " experts");
  if (s.degree == 1) return w;
  auto out = std::make_shared<ModelWeights>();
  out->config = w->config;
  out->embed = w->embed;
  out->lm_head = w->lm_head;
  out->final_norm = w->final_norm;
  out->checkpoint = w->checkpoint;
  out->base = w;
  out->layers = w->layers;  // views; the FFN ones are replaced below
  for (LayerWeights& L : out->layers) {
    if (L.is_moe) {
      for (int64_t e = 0; e < static_cast<int64_t>(L.moe.experts.size()); ++e) {
        FfnWeights& f = L.moe.experts[static_cast<size_t>(e)];
        f = e >= eb && e < ee ? slice_one(f, s.rank, s.degree, out.get()) : FfnWeights{};
      }
      if (!L.moe.shared.empty()) L.moe.shared = s.include_shared ? slice_one(L.moe.shared, s.rank, s.degree, out.get()) : FfnWeights{};
      if (!s.include_shared) L.moe.shared_gate = Matrix{};
    } else {
      L.dense = s.include_shared ? slice_one(L.dense, s.rank, s.degree, out.get()) : FfnWeights{};
    }
  }
  return std::shared_ptr<const ModelWeights>(std::move(out));
}

}  // namespace afd
