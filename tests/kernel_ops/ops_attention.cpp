// Attention kernels: gqa_decode_attend (gqa_attention.h), mla_decode_attend / mqa_decode_attend
// (mla_attention.h), causal_attention in both orders (causal_attention.h).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "core/scratch_arena.h"
#include "kernel_ops.h"
#include "kernels/cpu/causal_attention.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/mla_attention.h"
#include "test_util.h"

namespace afd::kernels::ops {
namespace {

using testing::Paged;
using testing::random_vec;

// The KV dtype code of the shapes: 0 f32, 1 bf16, 2 f8_e4m3.
DType kv_dtype(int64_t code) { return code == 0 ? DType::f32 : code == 1 ? DType::bf16 : DType::f8_e4m3; }

// Shape with the KV dtype written by name in the label.
Shape with_kv(std::initializer_list<std::pair<const char*, int64_t>> dims, int64_t dt) {
  Shape s = shape(dims);
  s.label += std::string(" kv=") + dtype_name(kv_dtype(dt));
  s.d.push_back(dt);
  return s;
}

// One GQA group: q [heads, head_dim] in [-1, 1], K and V rows of a paged cache (shuffled blocks,
// the last one partial), scale 1 / sqrt(head_dim), positions [j0, n_ctx).
class GqaDecodeCase : public OpCase {
 public:
  // d: heads, head_dim, n_ctx, j0, block_size, kv dtype
  explicit GqaDecodeCase(const Shape& s)
      : heads_(s[0]),
        hd_(s[1]),
        n_ctx_(s[2]),
        j0_(s[3]),
        dt_(kv_dtype(s[5])),
        k_(testing::make_paged(random_vec(static_cast<size_t>(n_ctx_ * hd_), 22), n_ctx_, hd_, s[4], dt_)),
        v_(testing::make_paged(random_vec(static_cast<size_t>(n_ctx_ * hd_), 23), n_ctx_, hd_, s[4], dt_)) {
    q_ = random_vec(static_cast<size_t>(heads_ * hd_), 21);
    scale_ = 1.0f / std::sqrt(static_cast<float>(hd_));
    bytes = static_cast<double>(2 * (n_ctx_ - j0_) * hd_ * dtype_size(dt_) + 8 * heads_ * hd_);
    flops = 4.0 * static_cast<double>(heads_ * (n_ctx_ - j0_) * hd_);
  }
  void reset() override { out_.assign(q_.size(), -7.0f); }
  void run(ThreadPool*) override {
    gqa_decode_attend(q_.data(), heads_, k_.view, v_.view, j0_, n_ctx_, scale_, out_.data(), scratch_);
  }
  void reference() override {
    want_.assign(q_.size(), -7.0f);
    ref::gqa_decode_attend(q_.data(), heads_, k_.view, v_.view, j0_, n_ctx_, scale_, want_.data());
  }
  std::vector<float> got() const override { return out_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size(), 2e-5); }

 private:
  int64_t heads_, hd_, n_ctx_, j0_;
  DType dt_;
  Paged k_, v_;
  float scale_ = 0;
  ScratchSlot scratch_;
  std::vector<float> q_, out_, want_;
};

// Multi-query decode over shared rows: q [heads, D + 3 stride], D = d_lat + d_rope, rows [n_ctx, D]
// in [-1, 1] in a paged cache; values the keys' first d_lat (absorbed MLA, sep_v = 0) or rows of
// their own (MFA, sep_v = 1); out [heads, d_lat + 5 stride], padding untouched; scale 0.19.
class MqaDecodeCase : public OpCase {
 public:
  // d: heads, d_lat, d_rope, n_ctx, block_size, kv dtype
  MqaDecodeCase(const Shape& s, bool sep_v)
      : heads_(s[0]), d_lat_(s[1]), d_rope_(s[2]), n_ctx_(s[3]), dt_(kv_dtype(s[5])), sep_v_(sep_v) {
    const int64_t D = d_lat_ + d_rope_;
    qs_ = D + 3;
    os_ = d_lat_ + 5;
    q_ = random_vec(static_cast<size_t>(heads_ * qs_), 11);
    k_ = testing::make_paged(random_vec(static_cast<size_t>(n_ctx_ * D), 12), n_ctx_, D, s[4], dt_);
    if (sep_v_)
      v_ = testing::make_paged(random_vec(static_cast<size_t>(n_ctx_ * d_lat_), 13), n_ctx_, d_lat_, s[4], dt_);
    bytes = static_cast<double>(n_ctx_ * (D + (sep_v_ ? d_lat_ : 0)) * dtype_size(dt_) + 4 * heads_ * (D + d_lat_));
    flops = 2.0 * static_cast<double>(heads_ * n_ctx_ * (D + d_lat_));
  }
  void reset() override { out_.assign(static_cast<size_t>(heads_ * os_), -7.0f); }
  void run(ThreadPool*) override {
    if (sep_v_) mqa_decode_attend(q_.data(), qs_, heads_, k_.view, &v_.view, d_lat_, n_ctx_, 0.19f, out_.data(), os_, scratch_);
    else mla_decode_attend(q_.data(), qs_, heads_, d_lat_, d_rope_, k_.view, n_ctx_, 0.19f, out_.data(), os_, scratch_);
    path_ = mla_decode_path_name(dt_);
  }
  void reference() override {
    want_.assign(static_cast<size_t>(heads_ * os_), -7.0f);
    ref::mqa_decode_attend(q_.data(), qs_, heads_, k_.view, sep_v_ ? &v_.view : nullptr, d_lat_, n_ctx_, 0.19f,
                           want_.data(), os_);
  }
  std::vector<float> got() const override { return out_; }
  std::vector<float> want() const override { return want_; }
  // The f32 paths differ from the reference in the summation order only: 2e-5. The bf16
  // dot-product path rounds q and the probabilities to bf16: the exact (f64) effect of rounding q,
  // |o(bf16(q)) - o(q)|, plus 2^-8 sum_j p_j |V_j| for the probabilities (2^-9 relative each,
  // doubled for the normaliser), plus the 2e-5. Padding bit-exact.
  std::vector<double> bounds() const override {
    std::vector<double> b(want_.size(), 0.0);
    const bool bf16_dp = path_ == "avx512_bf16_dp";
    const int64_t D = d_lat_ + d_rope_;
    std::vector<float> krows, vrows;
    if (bf16_dp) {
      krows.resize(static_cast<size_t>(n_ctx_ * D));
      vrows.resize(static_cast<size_t>(n_ctx_ * d_lat_));
      for (int64_t j = 0; j < n_ctx_; ++j) {
        load_row(k_.view, j, D, &krows[j * D]);
        load_row(sep_v_ ? v_.view : k_.view, j, d_lat_, &vrows[j * d_lat_]);
      }
    }
    std::vector<double> o0(static_cast<size_t>(d_lat_)), o1(o0.size()), pv(o0.size());
    for (int64_t h = 0; h < heads_; ++h) {
      if (bf16_dp) {
        // Softmax-weighted values for q as given (round = false) and rounded to bf16.
        for (bool round : {false, true}) {
          std::vector<double> sc(static_cast<size_t>(n_ctx_));
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j < n_ctx_; ++j) {
            double a = 0;
            for (int64_t i = 0; i < D; ++i) {
              const float qv = q_[static_cast<size_t>(h * qs_ + i)];
              a += static_cast<double>(round ? round_bf16(qv) : qv) * krows[static_cast<size_t>(j * D + i)];
            }
            sc[j] = a * 0.19f;
            mx = std::max(mx, sc[j]);
          }
          for (double& x : sc) sum += (x = std::exp(x - mx));
          std::vector<double>& o = round ? o1 : o0;
          std::fill(o.begin(), o.end(), 0.0);
          if (!round) std::fill(pv.begin(), pv.end(), 0.0);
          for (int64_t j = 0; j < n_ctx_; ++j)
            for (int64_t i = 0; i < d_lat_; ++i) {
              const double v = vrows[static_cast<size_t>(j * d_lat_ + i)];
              o[i] += sc[j] / sum * v;
              if (!round) pv[i] += sc[j] / sum * std::fabs(v);
            }
        }
      }
      for (int64_t i = 0; i < d_lat_; ++i)
        b[static_cast<size_t>(h * os_ + i)] = 2e-5 + (bf16_dp ? std::fabs(o1[i] - o0[i]) + std::ldexp(pv[i], -8) : 0.0);
    }
    return b;
  }

 private:
  int64_t heads_, d_lat_, d_rope_, n_ctx_, qs_ = 0, os_ = 0;
  DType dt_;
  bool sep_v_;
  std::string path_;
  Paged k_, v_;
  std::vector<float> q_, out_, want_;
  ScratchSlot scratch_;
};

// A run of nq query tokens at positions p0 .. p0 + nq - 1 over contiguous f32 K / V rows, rows
// padded (q: + 3, K/V: + 5, out: + 7; out's padding untouched), q and K in [-2, 2], V in [-1, 1].
class CausalCase : public OpCase {
 public:
  // d: heads, kv_heads, head_dim, nq, p0, window
  CausalCase(const Shape& s, CausalOrder order) : s_{s[0], s[1], s[2], s[5]}, nq_(s[3]), p0_(s[4]), order_(order) {
    qs_ = s_.n_heads * s_.head_dim + 3;
    kvs_ = s_.n_kv_heads * s_.head_dim + 5;
    os_ = s_.n_heads * s_.head_dim + 7;
    const int64_t n_ctx = p0_ + nq_;
    q_ = random_vec(static_cast<size_t>(nq_ * qs_), 31, -2.0f, 2.0f);
    k_ = random_vec(static_cast<size_t>(n_ctx * kvs_), 32, -2.0f, 2.0f);
    v_ = random_vec(static_cast<size_t>(n_ctx * kvs_), 33);
    scale_ = 1.0f / std::sqrt(static_cast<float>(s_.head_dim));
    // Positions attended, summed over the queries.
    double pairs = 0;
    for (int64_t i = 0; i < nq_; ++i) {
      const int64_t p = p0_ + i;
      pairs += static_cast<double>(s_.window > 0 ? std::min<int64_t>(s_.window, p + 1) : p + 1);
    }
    bytes = 4.0 * static_cast<double>(2 * n_ctx * s_.n_kv_heads * s_.head_dim + 2 * nq_ * s_.n_heads * s_.head_dim);
    flops = 4.0 * pairs * static_cast<double>(s_.n_heads * s_.head_dim);
  }
  void reset() override { out_.assign(static_cast<size_t>(nq_ * os_), -7.0f); }
  void run(ThreadPool* pool) override {
    causal_attention(q_.data(), qs_, nq_, p0_, k_.data(), v_.data(), kvs_, s_, scale_, out_.data(), os_, pool, scratch(pool),
                     order_);
  }
  void reference() override {
    want_.assign(static_cast<size_t>(nq_ * os_), -7.0f);
    ref::causal_attention(q_.data(), qs_, nq_, p0_, k_.data(), v_.data(), kvs_, s_, scale_, want_.data(), os_);
  }
  std::vector<float> got() const override { return out_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override {
    std::vector<double> b(want_.size(), 0.0);
    for (int64_t i = 0; i < nq_; ++i)
      for (int64_t e = 0; e < s_.n_heads * s_.head_dim; ++e) {
        const size_t at = static_cast<size_t>(i * os_ + e);
        b[at] = 2e-5 * (1.0 + std::fabs(want_[at]));
      }
    return b;
  }

 private:
  CausalAttnShape s_;
  int64_t nq_, p0_, qs_ = 0, kvs_ = 0, os_ = 0;
  CausalOrder order_;
  float scale_ = 0;
  std::vector<float> q_, k_, v_, out_, want_;
};

}  // namespace

void add_attention_ops(std::vector<KernelOp>& ops) {
  auto gqa = [](int64_t heads, int64_t hd, int64_t n_ctx, int64_t j0, int64_t block, int64_t dt) {
    return with_kv({{"heads", heads}, {"head_dim", hd}, {"n_ctx", n_ctx}, {"j0", j0}, {"block", block}}, dt);
  };
  // Every path (tiled AVX-512, multi-query, loop nest): head_dim on and off the 16-value tiles,
  // groups past the 8 heads kept in registers, sliding windows starting inside a block, blocks
  // not a multiple of the tile.
  std::vector<Shape> gqa_test;
  for (int64_t dt : {0, 1, 2}) {
    for (int64_t hd : {16, 24, 128})
      for (int64_t heads : {1, 3, 8, 12})
        for (auto [n_ctx, j0] : {std::pair<int64_t, int64_t>{1, 0}, {37, 0}, {300, 0}, {300, 211}, {40, 3}})
          gqa_test.push_back(gqa(heads, hd, n_ctx, j0, 16, dt));
    gqa_test.push_back(gqa(4, 32, 61, 0, 5, dt));
  }
  // Bench model: a group of 32 / 4 = 8 query heads of 128 over 512 and 4096 positions.
  ops.push_back({"gqa_decode",
                 "|out - ref| <= 2e-5 (f32 on every path; summation order and exp only)",
                 gqa_test,
                 {},
                 {gqa(8, 128, 512, 0, 16, 1), gqa(8, 128, 4096, 0, 16, 1), gqa(8, 128, 4096, 0, 16, 2)},
                 [](const Shape& s) { return std::make_unique<GqaDecodeCase>(s); }});

  auto mqa = [](int64_t heads, int64_t d_lat, int64_t d_rope, int64_t n_ctx, int64_t block, int64_t dt) {
    return with_kv({{"heads", heads}, {"d_lat", d_lat}, {"d_rope", d_rope}, {"n_ctx", n_ctx}, {"block", block}}, dt);
  };
  const char* mqa_tol =
      "|out - ref| <= 2e-5 on the f32 paths; on the AVX-512 bf16 dot-product path (q and probabilities rounded to "
      "bf16) + |o(bf16(q)) - o(q)| (f64) + 2^-8 sum_j p_j |V_j|; padding bit-exact";
  // Partial last blocks, heads past one 32-head tile, DeepSeek-V3's row width, several online
  // softmax chunks, three split-K segments (the last partial).
  std::vector<Shape> mla_test;
  for (int64_t dt : {0, 1, 2})
    for (const Shape& s : {mqa(4, 128, 32, 1, 16, dt), mqa(4, 128, 32, 37, 16, dt), mqa(33, 64, 16, 70, 8, dt),
                           mqa(16, 512, 64, 45, 16, dt), mqa(8, 128, 32, 300, 16, dt), mqa(4, 512, 64, 1000, 16, dt),
                           mqa(16, 128, 32, 2 * kMqaSegment + 77, 16, dt)})
      mla_test.push_back(s);
  // Default model: 4 heads of latent 64 + rope 32. Bench preset of deepseek_v3 (the bench model,
  // qwen3_moe, has no MLA): 16 heads of 512 + 64.
  ops.push_back({"mla_decode",
                 mqa_tol,
                 mla_test,
                 {mqa(4, 64, 32, 512, 16, 1), mqa(4, 64, 32, 2048, 16, 1)},
                 {mqa(16, 512, 64, 512, 16, 1), mqa(16, 512, 64, 4096, 16, 1)},
                 [](const Shape& s) { return std::make_unique<MqaDecodeCase>(s, false); }});
  // Separate value rows: a one-position last segment, Step-3's MFA (K and V rows of 256, 64
  // heads), keys wider than the values.
  std::vector<Shape> mfa_test;
  for (int64_t dt : {0, 1, 2})
    for (const Shape& s :
         {mqa(8, 64, 0, kMqaSegment + 1, 16, dt), mqa(64, 256, 0, 300, 16, dt), mqa(5, 64, 32, 33, 8, dt)})
      mfa_test.push_back(s);
  // Bench preset of step3 (MFA): 16 query heads over one K/V head of 256.
  ops.push_back({"mqa_decode sep_v (MFA)",
                 mqa_tol,
                 mfa_test,
                 {},
                 {mqa(16, 256, 0, 512, 16, 1), mqa(16, 256, 0, 4096, 16, 1)},
                 [](const Shape& s) { return std::make_unique<MqaDecodeCase>(s, true); }});

  auto ca = [](int64_t heads, int64_t kv_heads, int64_t hd, int64_t nq, int64_t p0, int64_t window) {
    return shape(
        {{"heads", heads}, {"kv_heads", kv_heads}, {"head_dim", hd}, {"nq", nq}, {"p0", p0}, {"window", window}});
  };
  // Head dims that fill the P.V tiles fully or not, GQA groups 1 .. 8, runs from position 0 or
  // after earlier context, sliding windows, head_dim off the 16-value step (the reference then).
  const std::vector<Shape> ca_test = {ca(16, 4, 64, 100, 0, 0), ca(32, 4, 128, 37, 50, 0), ca(8, 8, 16, 70, 3, 0),
                                      ca(6, 2, 80, 33, 10, 0),  ca(12, 4, 96, 21, 0, 0),   ca(4, 1, 32, 129, 0, 20),
                                      ca(8, 2, 64, 90, 70, 64), ca(12, 3, 48, 1, 0, 0),    ca(16, 4, 64, 5, 200, 0),
                                      ca(4, 2, 24, 9, 2, 0)};
  // Bench model: 32 / 4 heads of 128, a 512-token prompt and a 128-token chunk after 1024.
  const std::vector<Shape> ca_bench = {ca(32, 4, 128, 512, 0, 0), ca(32, 4, 128, 128, 1024, 0)};
  const char* ca_tol = "|out - ref| <= 2e-5 (1 + |ref|) (f32 products; summation order only); padding bit-exact";
  ops.push_back({"causal_attention fast", ca_tol, ca_test, {}, ca_bench, [](const Shape& s) {
                   return std::make_unique<CausalCase>(s, CausalOrder::fast);
                 }});
  ops.push_back({"causal_attention decode", ca_tol, ca_test, {}, ca_bench, [](const Shape& s) {
                   return std::make_unique<CausalCase>(s, CausalOrder::decode);
                 }});
}

}  // namespace afd::kernels::ops
