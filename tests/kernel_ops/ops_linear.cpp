// Matrix products: linear (ops.h) per weight dtype and activation precision, linear_fp8
// (linear_fp8.h) per activation precision, matmul_f32 (ops.h).
#include <cmath>
#include <random>
#include <string>

#include "core/dtype.h"
#include "kernel_ops.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels::ops {
namespace {

using testing::random_vec;

// Summation bound of two f32 dot products of the same terms in different orders (the kernel's
// and the reference's sequential one): each within 8 * 2^-24 * sqrt(cols) * sum |terms| of the
// exact value on random data, a factor 8 sqrt(cols) above the typical error, which still
// catches one missing or doubled term (~ sum |terms| / cols) for cols <= 1000.
double sum_bound(int64_t cols, double sum_abs) {
  return 16.0 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(cols)) * sum_abs + 1e-30;
}

// x [n, cols + 3] and y [n, rows + 5]: strides wider than the rows; y starts as random values
// (accumulate adds into them) and its padding must stay as it was.
class LinearCase : public OpCase {
 public:
  // d: n, rows, cols, accumulate
  LinearCase(const Shape& s, DType w_dtype, ActPrecision prec)
      : n_(s[0]),
        rows_(s[1]),
        cols_(s[2]),
        xs_(s[2] + 3),
        ys_(s[1] + 5),
        acc_(s[3] != 0),
        w_dtype_(w_dtype),
        prec_(prec) {
    x_ = random_vec(static_cast<size_t>(n_ * xs_), 11);
    w32_ = random_vec(static_cast<size_t>(rows_ * cols_), 12);
    if (w_dtype == DType::bf16) {
      wb_.resize(w32_.size());
      for (size_t i = 0; i < w32_.size(); ++i) {
        wb_[i] = f32_to_bf16(w32_[i]).bits;
        w32_[i] = bf16_to_f32(wb_[i]);
      }
    }
    y_init_ = random_vec(static_cast<size_t>(n_ * ys_), 13);
    bytes = static_cast<double>(rows_ * cols_ * dtype_size(w_dtype) + 4 * n_ * cols_ + 4 * n_ * rows_ * (acc_ ? 2 : 1));
    flops = 2.0 * static_cast<double>(n_ * rows_ * cols_);
  }
  void reset() override { y_ = y_init_; }
  void run(ThreadPool* pool) override {
    linear(x_.data(), n_, xs_, w(), w_dtype_, rows_, cols_, y_.data(), ys_, prec_, pool, scratch(pool), acc_);
  }
  void reference() override {
    want_ = y_init_;
    ref::linear(x_.data(), n_, xs_, w(), w_dtype_, rows_, cols_, want_.data(), ys_, prec_, acc_);
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override {
    std::vector<double> b(want_.size(), 0.0);
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t r = 0; r < rows_; ++r) {
        double sa = 0;
        for (int64_t c = 0; c < cols_; ++c) {
          const float xv = x_[static_cast<size_t>(i * xs_ + c)];
          sa += std::fabs(static_cast<double>(prec_ == ActPrecision::bf16 ? round_bf16(xv) : xv) *
                          w32_[static_cast<size_t>(r * cols_ + c)]);
        }
        const size_t at = static_cast<size_t>(i * ys_ + r);
        // accumulate: one more rounding on each side, of the sum with y.
        b[at] = sum_bound(cols_, sa) + (acc_ ? std::ldexp(std::fabs(want_[at]) + std::fabs(y_init_[at]), -23) : 0);
      }
    return b;
  }

 private:
  const void* w() const { return w_dtype_ == DType::bf16 ? static_cast<const void*>(wb_.data()) : w32_.data(); }
  int64_t n_, rows_, cols_, xs_, ys_;
  bool acc_;
  DType w_dtype_;
  ActPrecision prec_;
  std::vector<float> x_, w32_, y_init_, y_, want_;
  std::vector<uint16_t> wb_;
};

// FP8 block weights: random e4m3 codes (no NaN encodings), block scales 10^U(-3, -1) so a wrong
// block shows, scale_stride one wider than needed (a view's), and a block-row offset.
class LinearFp8Case : public OpCase {
 public:
  // d: n, rows, cols, row_offset, accumulate
  LinearFp8Case(const Shape& s, ActPrecision prec)
      : n_(s[0]),
        rows_(s[1]),
        cols_(s[2]),
        row_offset_(s[3]),
        xs_(s[2] + 3),
        ys_(s[1] + 5),
        acc_(s[4] != 0),
        prec_(prec) {
    scale_stride_ = (cols_ + kFp8Block - 1) / kFp8Block + 1;
    const int64_t block_rows = (rows_ + row_offset_ + kFp8Block - 1) / kFp8Block;
    x_ = random_vec(static_cast<size_t>(n_ * xs_), 21);
    std::mt19937 rng(22);
    q_.resize(static_cast<size_t>(rows_ * cols_));
    for (auto& b : q_) {
      do b = static_cast<uint8_t>(rng() & 0xff);
      while ((b & 0x7f) == 0x7f);
    }
    std::uniform_real_distribution<float> ds(-3.0f, -1.0f);
    scale_.resize(static_cast<size_t>(block_rows * scale_stride_));
    for (auto& v : scale_) v = std::pow(10.0f, ds(rng));
    y_init_ = random_vec(static_cast<size_t>(n_ * ys_), 23);
    bytes = static_cast<double>(rows_ * cols_ + 4 * n_ * cols_ + 4 * n_ * rows_ * (acc_ ? 2 : 1));
    flops = 2.0 * static_cast<double>(n_ * rows_ * cols_);
  }
  void reset() override { y_ = y_init_; }
  void run(ThreadPool* pool) override {
    linear_fp8(x_.data(), n_, xs_, w(), rows_, cols_, y_.data(), ys_, prec_, pool, scratch(pool), acc_);
    path_ = linear_fp8_path_name(n_, cols_, prec_);
  }
  void reference() override {
    want_ = y_init_;
    ref::linear_fp8(x_.data(), n_, xs_, w(), rows_, cols_, want_.data(), ys_, prec_, acc_);
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  // The summation bound, plus on the AVX-512 paths whose contract rounds the dequantized weight
  // to bf16 (bf16 activations) the difference of the two contracts' exact values,
  // |sum_c x'_c (bf16(W_c) - W_c)| (in f64).
  std::vector<double> bounds() const override {
    const bool round_w = path_ == "avx512_fp8_tile_bf16" || path_ == "avx512_fp8_tile_pairs" ||
                         path_ == "avx512_fp8_gemv_lut8";
    std::vector<double> b(want_.size(), 0.0);
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t r = 0; r < rows_; ++r) {
        const float* srow = scale_.data() + (r + row_offset_) / kFp8Block * scale_stride_;
        double sa = 0, dw = 0;
        for (int64_t c = 0; c < cols_; ++c) {
          const float xv = x_[static_cast<size_t>(i * xs_ + c)];
          const double xr = prec_ == ActPrecision::bf16 ? round_bf16(xv) : xv;
          const float wv = fp8_e4m3_to_f32(q_[static_cast<size_t>(r * cols_ + c)]) * srow[c / kFp8Block];
          sa += std::fabs(xr * wv);
          dw += xr * (static_cast<double>(round_bf16(wv)) - wv);
        }
        const size_t at = static_cast<size_t>(i * ys_ + r);
        b[at] = sum_bound(cols_, sa) + (round_w ? std::fabs(dw) : 0.0) +
                (acc_ ? std::ldexp(std::fabs(want_[at]) + std::fabs(y_init_[at]), -23) : 0);
      }
    return b;
  }

 private:
  Fp8BlockWeights w() const { return {q_.data(), scale_.data(), scale_stride_, row_offset_}; }
  int64_t n_, rows_, cols_, row_offset_, xs_, ys_, scale_stride_ = 0;
  bool acc_;
  ActPrecision prec_;
  std::string path_;
  std::vector<float> x_, scale_, y_init_, y_, want_;
  std::vector<uint8_t> q_;
};

// c [m, n] with strides wider than the rows (a: k + 3, b: n + 5, c: n + 2), c's padding
// (initially 5) untouched.
class MatmulCase : public OpCase {
 public:
  // d: m, k, n
  explicit MatmulCase(const Shape& s) : m_(s[0]), k_(s[1]), n_(s[2]), lda_(s[1] + 3), ldb_(s[2] + 5), ldc_(s[2] + 2) {
    a_ = random_vec(static_cast<size_t>(m_ * lda_), 31);
    b_ = random_vec(static_cast<size_t>(std::max<int64_t>(k_, 1) * ldb_), 32);
    bytes = 4.0 * static_cast<double>(m_ * k_ + k_ * n_ + m_ * n_);
    flops = 2.0 * static_cast<double>(m_ * k_ * n_);
  }
  void reset() override { c_.assign(static_cast<size_t>(m_ * ldc_), 5.0f); }
  void run(ThreadPool*) override { matmul_f32(a_.data(), m_, k_, lda_, b_.data(), n_, ldb_, c_.data(), ldc_); }
  void reference() override {
    want_.assign(static_cast<size_t>(m_ * ldc_), 5.0f);
    ref::matmul_f32(a_.data(), m_, k_, lda_, b_.data(), n_, ldb_, want_.data(), ldc_);
  }
  std::vector<float> got() const override { return c_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override {
    std::vector<double> b(want_.size(), 0.0);
    for (int64_t i = 0; i < m_; ++i)
      for (int64_t j = 0; j < n_; ++j) b[static_cast<size_t>(i * ldc_ + j)] = 1e-5 * static_cast<double>(1 + k_);
    return b;
  }

 private:
  int64_t m_, k_, n_, lda_, ldb_, ldc_;
  std::vector<float> a_, b_, c_, want_;
};

Shape lin(int64_t n, int64_t rows, int64_t cols, int64_t acc = 0) {
  return shape({{"n", n}, {"rows", rows}, {"cols", cols}, {"acc", acc}});
}
Shape fp8(int64_t n, int64_t rows, int64_t cols, int64_t row_offset = 0, int64_t acc = 0) {
  return shape({{"n", n}, {"rows", rows}, {"cols", cols}, {"row_offset", row_offset}, {"acc", acc}});
}

}  // namespace

void add_linear_ops(std::vector<KernelOp>& ops) {
  // Every path of linear(): single token (row streams / tiles), 2..48 tokens (small-n tiles and
  // row streams), the pairs kernel from 32 tokens on rows of > 768 columns, many-token tiles and
  // OpenBLAS (f32 activations); columns off the 8 / 16 / 32 steps; accumulate.
  const std::vector<Shape> lin_test = {lin(1, 5, 17),    lin(2, 13, 33, 1), lin(3, 37, 100),     lin(7, 64, 129),
                                       lin(1, 70, 1000), lin(16, 36, 257),  lin(5, 3, 2048),     lin(64, 40, 96, 1),
                                       lin(65, 33, 47),  lin(100, 21, 65),  lin(1, 130, 513, 1), lin(4, 21, 300),
                                       lin(40, 9, 1100), lin(200, 18, 130)};
  // Default model: expert gate/up [192, 256] and down [256, 192], the LM head [4096, 256].
  const std::vector<Shape> lin_default = {lin(1, 192, 256), lin(16, 192, 256), lin(64, 192, 256), lin(1, 256, 192),
                                          lin(1, 4096, 256)};
  // Bench model: experts [512, 2048] / [2048, 512], q_proj [4096, 2048], the LM head [32000, 2048].
  const std::vector<Shape> lin_bench = {lin(1, 512, 2048), lin(16, 512, 2048), lin(64, 512, 2048),
                                        lin(1, 2048, 512), lin(1, 4096, 2048), lin(1, 32000, 2048)};
  const char* lin_tol =
      "|y - ref| <= 16 * 2^-24 * sqrt(cols) * sum_c |x'_c w_c| (+ 2^-23 (|y| + |y0|) with accumulate; x' = x, or bf16(x) "
      "with bf16 activations): both sums within 8 sqrt(cols) typical f32 errors of the exact value; padding bit-exact";
  for (DType wt : {DType::bf16, DType::f32})
    for (ActPrecision prec : {ActPrecision::bf16, ActPrecision::f32}) {
      const std::string name = std::string("linear ") + (wt == DType::bf16 ? "bf16w" : "f32w") + " " +
                               (prec == ActPrecision::bf16 ? "bf16act" : "f32act");
      ops.push_back({name, lin_tol, lin_test, lin_default, lin_bench,
                     [wt, prec](const Shape& s) { return std::make_unique<LinearCase>(s, wt, prec); }});
    }

  // Partial edge blocks in rows and columns, block-row offsets, gemv and tile token counts.
  const std::vector<Shape> fp8_test = {fp8(1, 5, 17),          fp8(3, 37, 100, 5),  fp8(1, 128, 128),
                                       fp8(4, 130, 300, 0, 1), fp8(7, 64, 256, 64), fp8(16, 36, 257, 3),
                                       fp8(65, 33, 47, 100),   fp8(100, 21, 385),   fp8(2, 129, 2048, 1),
                                       fp8(1, 9, 2048, 0, 1),  fp8(40, 18, 130)};
  const std::vector<Shape> fp8_default = {fp8(1, 192, 256), fp8(16, 192, 256), fp8(64, 192, 256), fp8(1, 256, 192),
                                          fp8(1, 4096, 256)};
  const std::vector<Shape> fp8_bench = {fp8(1, 512, 2048), fp8(16, 512, 2048), fp8(64, 512, 2048),
                                        fp8(1, 2048, 512), fp8(1, 4096, 2048), fp8(1, 32000, 2048)};
  const char* fp8_tol =
      "|y - ref| <= 16 * 2^-24 * sqrt(cols) * S, S = sum_c |x'_c W_c| (exact dequantized W), + |sum_c x'_c (bf16(W_c) "
      "- W_c)| on the AVX-512 paths that round W to bf16 (bf16 activations), + 2^-23 (|y| + |y0|) with accumulate; "
      "padding bit-exact";
  for (ActPrecision prec : {ActPrecision::bf16, ActPrecision::f32}) {
    const std::string name = std::string("linear_fp8 ") + (prec == ActPrecision::bf16 ? "bf16act" : "f32act");
    ops.push_back({name, fp8_tol, fp8_test, fp8_default, fp8_bench,
                   [prec](const Shape& s) { return std::make_unique<LinearFp8Case>(s, prec); }});
  }

  auto mm = [](int64_t m, int64_t k, int64_t n) { return shape({{"m", m}, {"k", k}, {"n", n}}); };
  // The absorbed-MLA products that use it: per head [m tokens, k] x [k, n].
  ops.push_back({"matmul_f32",
                 "|c - ref| <= 1e-5 * (1 + k) (the library sgemm against f64 sums); padding bit-exact",
                 {mm(1, 128, 512), mm(7, 33, 17), mm(64, 128, 512), mm(3, 0, 5)},
                 {mm(3, 32, 64), mm(16, 32, 64)},
                 {mm(3, 128, 512), mm(16, 128, 512)},
                 [](const Shape& s) { return std::make_unique<MatmulCase>(s); }});
}

}  // namespace afd::kernels::ops
