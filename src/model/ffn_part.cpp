#include "model/ffn_part.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace afd {

namespace {

using kernels::ActPrecision;

// y [n, m.rows] = x [n, m.cols] . m^T
void linear(const Matrix& m, const float* x, int64_t n, float* y, ActPrecision prec, ThreadPool* pool) {
  kernels::linear(x, n, m.cols, m.data, m.dtype, m.rows, m.cols, y, m.rows, prec, pool);
}

// y [n, hidden] = swiglu_ffn(x [n, hidden]) using scratch (2 * n * inter floats).
void swiglu(const FfnWeights& f, const float* x, int64_t n, float* y, float* scratch, ActPrecision prec,
            ThreadPool* pool) {
  const int64_t inter = f.gate.rows;
  float* g = scratch;
  float* u = scratch + n * inter;
  linear(f.gate, x, n, g, prec, pool);
  linear(f.up, x, n, u, prec, pool);
  kernels::silu_mul(g, u, n * inter, g);
  linear(f.down, g, n, y, prec, pool);
}

}  // namespace

void ffn_part(const ModelWeights& w, int64_t layer, const float* h, int64_t n, const int32_t* ids,
              const float* weights, float* out, const FfnPartOptions& opt, FfnScratch* scratch,
              ThreadPool* pool) {
  const ModelConfig& c = w.config;
  const LayerWeights& L = w.layers[layer];
  const int64_t hid = c.hidden_size;
  std::memset(out, 0, static_cast<size_t>(n * hid) * sizeof(float));
  if (n == 0) return;

  if (!L.is_moe) {
    if (!opt.include_shared) return;
    const int64_t inter = L.dense.gate.rows;
    scratch->buf.resize(static_cast<size_t>(2 * n * inter));
    swiglu(L.dense, h, n, out, scratch->buf.data(), opt.prec, pool);
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

  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue;
    if (!opt.experts_mask.empty() && !opt.experts_mask[e]) continue;
    const int32_t* sel = order + start[e];
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(xs + r * hid, h + (sel[r] / K) * hid, static_cast<size_t>(hid) * sizeof(float));
    swiglu(L.moe.experts[e], xs, m, ys, tmp, opt.prec, pool);
    for (int64_t r = 0; r < m; ++r) kernels::axpy(weights[sel[r]], ys + r * hid, hid, out + (sel[r] / K) * hid);
  }

  if (opt.include_shared && shared_inter > 0) {
    swiglu(L.moe.shared, h, n, ys, tmp, opt.prec, pool);
    std::vector<float> gate(static_cast<size_t>(n), 1.0f);
    if (!L.moe.shared_gate.empty()) {
      linear(L.moe.shared_gate, h, n, gate.data(), ActPrecision::f32, pool);
      for (auto& g : gate) g = 1.0f / (1.0f + std::exp(-g));
    }
    for (int64_t i = 0; i < n; ++i) kernels::axpy(gate[i], ys + i * hid, hid, out + i * hid);
  }
}

}  // namespace afd
