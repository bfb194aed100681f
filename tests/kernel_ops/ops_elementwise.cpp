// Element-wise kernels (ops.h, elementwise_kernels.h) and the FP8 block dequantization
// (linear_fp8.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "kernel_ops.h"
#include "kernels/cpu/linear_fp8.h"
#include "kernels/cpu/linear_fp8_kernels.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace afd::kernels::ops {
namespace {

using testing::random_vec;

std::vector<float> codes(const std::vector<uint16_t>& v) { return {v.begin(), v.end()}; }
std::vector<float> codes(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// Bounds rel * |want| + abs for every element.
std::vector<double> rel_abs(const std::vector<float>& want, double rel, double abs) {
  std::vector<double> b(want.size());
  for (size_t i = 0; i < want.size(); ++i) b[i] = rel * std::fabs(want[i]) + abs;
  return b;
}

// x [n, dim] in [-3, 3], w [dim] in [0.5, 1.5], eps 1e-6; in_place: y aliases x.
class RmsnormCase : public OpCase {
 public:
  // d: n, dim, in_place
  explicit RmsnormCase(const Shape& s) : n_(s[0]), dim_(s[1]), in_place_(s[2] != 0) {
    x_ = random_vec(static_cast<size_t>(n_ * dim_), 1, -3, 3);
    w_ = random_vec(static_cast<size_t>(dim_), 2, 0.5, 1.5);
    bytes = 4.0 * static_cast<double>(2 * n_ * dim_ + dim_);
    flops = 4.0 * static_cast<double>(n_ * dim_);
  }
  void reset() override { y_ = in_place_ ? x_ : std::vector<float>(x_.size()); }
  void run(ThreadPool*) override { rmsnorm(in_place_ ? y_.data() : x_.data(), w_.data(), n_, dim_, 1e-6f, y_.data()); }
  void reference() override {
    want_.resize(x_.size());
    ref::rmsnorm(x_.data(), w_.data(), n_, dim_, 1e-6f, want_.data());
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return rel_abs(want_, 1e-6, 1e-7); }

 private:
  int64_t n_, dim_;
  bool in_place_;
  std::vector<float> x_, w_, y_, want_;
};

// gate in [-20, 20] with -100, 100, 0, -88 first (n > 4), up in [-2, 2]; alias: out aliases gate.
class SiluMulCase : public OpCase {
 public:
  // d: n, alias
  explicit SiluMulCase(const Shape& s) : n_(s[0]), alias_(s[1] != 0) {
    gate_ = random_vec(static_cast<size_t>(n_), 3, -20, 20);
    up_ = random_vec(static_cast<size_t>(n_), 4, -2, 2);
    if (n_ > 4) gate_[0] = -100.0f, gate_[1] = 100.0f, gate_[2] = 0.0f, gate_[3] = -88.0f;
    bytes = 12.0 * static_cast<double>(n_);
    flops = 4.0 * static_cast<double>(n_);
  }
  void reset() override { out_ = alias_ ? gate_ : std::vector<float>(gate_.size()); }
  void run(ThreadPool*) override { silu_mul(alias_ ? out_.data() : gate_.data(), up_.data(), n_, out_.data()); }
  void reference() override {
    want_.resize(gate_.size());
    ref::silu_mul(gate_.data(), up_.data(), n_, want_.data());
  }
  std::vector<float> got() const override { return out_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return rel_abs(want_, 1e-6, 1e-30); }

 private:
  int64_t n_;
  bool alias_;
  std::vector<float> gate_, up_, out_, want_;
};

// x in [-30, 30], in place.
class SoftmaxCase : public OpCase {
 public:
  // d: n
  explicit SoftmaxCase(const Shape& s) : n_(s[0]) {
    x_ = random_vec(static_cast<size_t>(n_), 5, -30, 30);
    bytes = 8.0 * static_cast<double>(n_);
    flops = 4.0 * static_cast<double>(n_);
  }
  void reset() override { y_ = x_; }
  void run(ThreadPool*) override { softmax(y_.data(), n_); }
  void reference() override {
    want_ = x_;
    ref::softmax(want_.data(), n_);
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return rel_abs(want_, 1e-6, 1e-9); }

 private:
  int64_t n_;
  std::vector<float> x_, y_, want_;
};

// scale_max in place on x in [-30, 30] by s = s_milli / 1000 (the bench shapes take s = -1, so
// that repeated calls on their own output stay in range); outputs x then the maximum.
class ScaleMaxCase : public OpCase {
 public:
  // d: n, s_milli
  explicit ScaleMaxCase(const Shape& s) : n_(s[0]), s_(static_cast<float>(s[1]) / 1000.0f) {
    x_ = random_vec(static_cast<size_t>(n_), 6, -30, 30);
    bytes = 8.0 * static_cast<double>(n_);
    flops = 2.0 * static_cast<double>(n_);
  }
  void reset() override { y_ = x_; }
  void run(ThreadPool*) override { m_ = scale_max(y_.data(), n_, s_); }
  void reference() override {
    want_ = x_;
    want_m_ = ref::scale_max(want_.data(), n_, s_);
  }
  std::vector<float> got() const override { return with(y_, m_); }
  std::vector<float> want() const override { return with(want_, want_m_); }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size() + 1, 0.0); }

 private:
  static std::vector<float> with(std::vector<float> v, float m) {
    v.push_back(m);
    return v;
  }
  int64_t n_;
  float s_, m_ = 0, want_m_ = 0;
  std::vector<float> x_, y_, want_;
};

// abs_max of x in [-30, 30] with one element of each sign forced to the extremes; outputs the
// maximum. The reference is the definition, a sequential max of |x[i]|.
class AbsMaxCase : public OpCase {
 public:
  // d: n
  explicit AbsMaxCase(const Shape& s) : n_(s[0]) {
    x_ = random_vec(static_cast<size_t>(n_), 11, -30, 30);
    if (n_ > 2) x_[static_cast<size_t>(n_ / 2)] = -31.5f, x_[static_cast<size_t>(n_ - 1)] = 31.25f;
    bytes = 4.0 * static_cast<double>(n_);
    flops = static_cast<double>(n_);
  }
  void reset() override { m_ = -1; }
  void run(ThreadPool*) override { m_ = abs_max(x_.data(), n_); }
  void reference() override {
    want_ = 0;
    for (float v : x_) want_ = std::max(want_, std::fabs(v));
  }
  std::vector<float> got() const override { return {m_}; }
  std::vector<float> want() const override { return {want_}; }
  std::vector<double> bounds() const override { return {0.0}; }

 private:
  int64_t n_;
  float m_ = -1, want_ = 0;
  std::vector<float> x_;
};

// exp_sub_sum in place on x in [-30, 30] with m = max x + 0.5; outputs x then the sum.
class ExpSubSumCase : public OpCase {
 public:
  // d: n
  explicit ExpSubSumCase(const Shape& s) : n_(s[0]) {
    x_ = random_vec(static_cast<size_t>(n_), 7, -30, 30);
    m_ = (n_ ? *std::max_element(x_.begin(), x_.end()) : 0.0f) + 0.5f;
    bytes = 8.0 * static_cast<double>(n_);
    flops = 3.0 * static_cast<double>(n_);
  }
  void reset() override { y_ = x_; }
  void run(ThreadPool*) override { sum_ = exp_sub_sum(y_.data(), n_, m_); }
  void reference() override {
    want_ = x_;
    want_sum_ = ref::exp_sub_sum(want_.data(), n_, m_);
  }
  std::vector<float> got() const override { return with(y_, sum_); }
  std::vector<float> want() const override { return with(want_, want_sum_); }
  // Each element within the exp approximation (1e-6 relative + 1e-9), the sum 1e-5 relative.
  std::vector<double> bounds() const override {
    std::vector<double> b = rel_abs(want_, 1e-6, 1e-9);
    b.push_back(1e-5 * std::fabs(want_sum_));
    return b;
  }

 private:
  static std::vector<float> with(std::vector<float> v, float x) {
    v.push_back(x);
    return v;
  }
  int64_t n_;
  float m_, sum_ = 0, want_sum_ = 0;
  std::vector<float> x_, y_, want_;
};

// y += 0.37 x, x and y in [-1, 1].
class AxpyCase : public OpCase {
 public:
  // d: n
  explicit AxpyCase(const Shape& s) : n_(s[0]) {
    x_ = random_vec(static_cast<size_t>(n_), 8);
    y0_ = random_vec(static_cast<size_t>(n_), 9);
    bytes = 12.0 * static_cast<double>(n_);
    flops = 2.0 * static_cast<double>(n_);
  }
  void reset() override { y_ = y0_; }
  void run(ThreadPool*) override { axpy(0.37f, x_.data(), n_, y_.data()); }
  void reference() override {
    want_ = y0_;
    ref::axpy(0.37f, x_.data(), n_, want_.data());
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size(), 0.0); }

 private:
  int64_t n_;
  std::vector<float> x_, y0_, y_, want_;
};

// specials = 1: zeros, infinities, NaNs (quiet and signalling), subnormals, the largest
// finite values, rounding ties, and a sweep of bit patterns (n ignored); else n values in
// [-1, 1]. The input starts at `offset` (unaligned rows); one output past the end must stay.
class F32ToBf16Case : public OpCase {
 public:
  // d: n, offset, specials
  explicit F32ToBf16Case(const Shape& s) : off_(s[1]) {
    if (s[2]) {
      x_ = {0.0f,
            -0.0f,
            1.0f,
            -1.0f,
            INFINITY,
            -INFINITY,
            NAN,
            -NAN,
            1e-40f,
            -1e-45f,
            3.4e38f,
            -3.4e38f,
            f32_from_bits(0x3f808000u),
            f32_from_bits(0x3f818000u),
            f32_from_bits(0x7f7fffffu),
            f32_from_bits(0x7fc00001u),
            f32_from_bits(0x7f800001u)};
      for (uint32_t u = 0; u < 0xffffffffu - 65521u * 7; u += 65521u * 7) x_.push_back(f32_from_bits(u));
    } else {
      x_ = random_vec(static_cast<size_t>(s[0] + off_), 10);
    }
    n_ = static_cast<int64_t>(x_.size()) - off_;
    bytes = 6.0 * static_cast<double>(n_);
    flops = static_cast<double>(n_);
  }
  void reset() override { y_.assign(static_cast<size_t>(n_ + 1), 0xabcd); }
  void run(ThreadPool*) override { f32_to_bf16_row(x_.data() + off_, n_, y_.data()); }
  void reference() override {
    want_.assign(static_cast<size_t>(n_ + 1), 0xabcd);
    ref::f32_to_bf16_row(x_.data() + off_, n_, want_.data());
  }
  std::vector<float> got() const override { return codes(y_); }
  std::vector<float> want() const override { return codes(want_); }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size(), 0.0); }

 private:
  int64_t off_, n_;
  std::vector<float> x_;
  std::vector<uint16_t> y_, want_;
};

// Codes i * 7919 mod 65536 for i = offset .. offset + n - 1 (offset 1, n 65535: every code but 0,
// once); one output past the end must stay.
class Bf16ToF32Case : public OpCase {
 public:
  // d: n, offset
  explicit Bf16ToF32Case(const Shape& s) : n_(s[0]), off_(s[1]) {
    x_.resize(static_cast<size_t>(n_ + off_));
    for (size_t i = 0; i < x_.size(); ++i) x_[i] = static_cast<uint16_t>(i * 7919u);
    bytes = 6.0 * static_cast<double>(n_);
    flops = static_cast<double>(n_);
  }
  void reset() override { y_.assign(static_cast<size_t>(n_ + 1), 7.0f); }
  void run(ThreadPool*) override { bf16_to_f32_row(x_.data() + off_, n_, y_.data()); }
  void reference() override {
    want_.assign(static_cast<size_t>(n_ + 1), 7.0f);
    ref::bf16_to_f32_row(x_.data() + off_, n_, want_.data());
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size(), 0.0); }

 private:
  int64_t n_, off_;
  std::vector<uint16_t> x_;
  std::vector<float> y_, want_;
};

// x [tokens, dim] in [-4, 4] with a zero, a tiny value, an outlier -300 in the first group and
// the second group all zero (scale 1).
std::vector<float> fp8_input(int64_t n, int64_t group) {
  std::vector<float> x = random_vec(static_cast<size_t>(n), 8, -4, 4);
  if (n > 9) x[5] = 0.0f, x[7] = 1e-6f, x[9] = -300.0f;
  if (n >= 2 * group) std::fill(x.begin() + group, x.begin() + 2 * group, 0.0f);
  return x;
}

// quantize_fp8_e4m3 with one scale per group (group = dim: per token); outputs q then scales.
class QuantizeFp8Case : public OpCase {
 public:
  // d: tokens, dim, group
  explicit QuantizeFp8Case(const Shape& s) : n_(s[0] * s[1]), group_(s[2]) {
    x_ = fp8_input(n_, group_);
    bytes = 5.0 * static_cast<double>(n_);
    flops = 3.0 * static_cast<double>(n_);
  }
  void reset() override {
    q_.assign(static_cast<size_t>(n_), 0);
    s_.assign(static_cast<size_t>(n_ / group_), 0.0f);
  }
  void run(ThreadPool*) override { quantize_fp8_e4m3(x_.data(), n_, group_, q_.data(), s_.data()); }
  void reference() override {
    want_q_.assign(static_cast<size_t>(n_), 0);
    want_s_.assign(static_cast<size_t>(n_ / group_), 0.0f);
    ref::quantize_fp8_e4m3(x_.data(), n_, group_, want_q_.data(), want_s_.data());
  }
  std::vector<float> got() const override { return join(q_, s_); }
  std::vector<float> want() const override { return join(want_q_, want_s_); }
  std::vector<double> bounds() const override { return std::vector<double>(want_q_.size() + want_s_.size(), 0.0); }

 private:
  static std::vector<float> join(const std::vector<uint8_t>& q, const std::vector<float>& s) {
    std::vector<float> v = codes(q);
    v.insert(v.end(), s.begin(), s.end());
    return v;
  }
  int64_t n_, group_;
  std::vector<float> x_, s_, want_s_;
  std::vector<uint8_t> q_, want_q_;
};

// dequantize_fp8_e4m3 of the reference quantization of fp8_input.
class DequantizeFp8Case : public OpCase {
 public:
  // d: tokens, dim, group
  explicit DequantizeFp8Case(const Shape& s) : n_(s[0] * s[1]), group_(s[2]) {
    const std::vector<float> x = fp8_input(n_, group_);
    q_.resize(static_cast<size_t>(n_));
    s_.resize(static_cast<size_t>(n_ / group_));
    ref::quantize_fp8_e4m3(x.data(), n_, group_, q_.data(), s_.data());
    bytes = 5.0 * static_cast<double>(n_);
    flops = static_cast<double>(n_);
  }
  void reset() override { y_.assign(static_cast<size_t>(n_), 0.0f); }
  void run(ThreadPool*) override { dequantize_fp8_e4m3(q_.data(), s_.data(), n_, group_, y_.data()); }
  void reference() override {
    want_.assign(static_cast<size_t>(n_), 0.0f);
    ref::dequantize_fp8_e4m3(q_.data(), s_.data(), n_, group_, want_.data());
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size(), 0.0); }

 private:
  int64_t n_, group_;
  std::vector<uint8_t> q_;
  std::vector<float> s_, y_, want_;
};

// dequantize_fp8_blocks of random codes (no NaN encodings) with block scales 10^U(-3, -1), a
// scale_stride one wider than needed and a block-row offset. Its reference is the scalar path
// it falls back to (detail::fp8_dequant_rows_f32_scalar: fp8 * scale in f32).
class DequantizeFp8BlocksCase : public OpCase {
 public:
  // d: rows, cols, row_offset
  explicit DequantizeFp8BlocksCase(const Shape& s) : rows_(s[0]), cols_(s[1]), row_offset_(s[2]) {
    scale_stride_ = (cols_ + kFp8Block - 1) / kFp8Block + 1;
    std::mt19937 rng(41);
    q_.resize(static_cast<size_t>(rows_ * cols_));
    for (auto& b : q_) {
      do b = static_cast<uint8_t>(rng() & 0xff);
      while ((b & 0x7f) == 0x7f);
    }
    std::uniform_real_distribution<float> ds(-3.0f, -1.0f);
    scale_.resize(static_cast<size_t>((rows_ + row_offset_ + kFp8Block - 1) / kFp8Block * scale_stride_));
    for (auto& v : scale_) v = std::pow(10.0f, ds(rng));
    bytes = 5.0 * static_cast<double>(rows_ * cols_);
    flops = static_cast<double>(rows_ * cols_);
  }
  void reset() override { y_.assign(static_cast<size_t>(rows_ * cols_), 0.0f); }
  void run(ThreadPool*) override { dequantize_fp8_blocks(w(), rows_, cols_, y_.data()); }
  void reference() override {
    want_.assign(static_cast<size_t>(rows_ * cols_), 0.0f);
    detail::fp8_dequant_rows_f32_scalar(w(), cols_, 0, rows_, want_.data());
  }
  std::vector<float> got() const override { return y_; }
  std::vector<float> want() const override { return want_; }
  std::vector<double> bounds() const override { return std::vector<double>(want_.size(), 0.0); }

 private:
  Fp8BlockWeights w() const { return {q_.data(), scale_.data(), scale_stride_, row_offset_}; }
  int64_t rows_, cols_, row_offset_, scale_stride_ = 0;
  std::vector<uint8_t> q_;
  std::vector<float> scale_, y_, want_;
};

template <class C>
std::function<std::unique_ptr<OpCase>(const Shape&)> factory() {
  return [](const Shape& s) { return std::make_unique<C>(s); };
}

}  // namespace

void add_elementwise_ops(std::vector<KernelOp>& ops) {
  // Lengths around the 16-lane vectors and their tails.
  const std::vector<int64_t> lengths = {1, 3, 15, 16, 17, 31, 33, 64, 100, 127, 128, 129, 1000, 2048};
  auto each = [&](auto f) {
    std::vector<Shape> v;
    for (int64_t n : lengths) v.push_back(f(n));
    return v;
  };
  auto n_only = [](int64_t n) { return shape({{"n", n}}); };

  auto rms = [](int64_t n, int64_t dim, int64_t in_place = 0) {
    return shape({{"n", n}, {"dim", dim}, {"in_place", in_place}});
  };
  std::vector<Shape> rms_test = each([&](int64_t dim) { return rms(3, dim); });
  for (int64_t dim : lengths) rms_test.push_back(rms(3, dim, 1));
  ops.push_back({"rmsnorm",
                 "|y - ref| <= 1e-6 |ref| + 1e-7 (sum of squares in f32 lanes instead of f64)",
                 rms_test,
                 {rms(1, 256), rms(64, 256)},
                 {rms(1, 2048), rms(64, 2048)},
                 factory<RmsnormCase>()});

  auto silu = [](int64_t n, int64_t alias = 0) { return shape({{"n", n}, {"alias", alias}}); };
  std::vector<Shape> silu_test = each([&](int64_t n) { return silu(n); });
  for (int64_t n : lengths) silu_test.push_back(silu(n, 1));
  ops.push_back({"silu_mul",
                 "|out - ref| <= 1e-6 |ref| + 1e-30 (vector exp ~2 ulp, one division, one multiply)",
                 silu_test,
                 {silu(192), silu(192 * 64)},
                 {silu(512), silu(512 * 64)},
                 factory<SiluMulCase>()});

  ops.push_back({"softmax",
                 "|p - ref| <= 1e-6 ref + 1e-9 (vector exp)",
                 each(n_only),
                 {n_only(512), n_only(4096)},
                 {n_only(512), n_only(4096)},
                 factory<SoftmaxCase>()});

  auto sm = [](int64_t n, int64_t s_milli) { return shape({{"n", n}, {"s_milli", s_milli}}); };
  std::vector<Shape> sm_test = each([&](int64_t n) { return sm(n, 370); });
  sm_test.insert(sm_test.begin(), sm(0, 2000));
  ops.push_back({"scale_max",
                 "bit-exact (one multiply per element, a maximum); n = 0 gives -inf",
                 sm_test,
                 {sm(512, -1000), sm(4096, -1000)},
                 {sm(512, -1000), sm(4096, -1000)},
                 factory<ScaleMaxCase>()});
  std::vector<Shape> es_test = each(n_only);
  es_test.insert(es_test.begin(), n_only(0));
  ops.push_back({"exp_sub_sum",
                 "each |x - ref| <= 1e-6 ref + 1e-9 (vector exp), the sum 1e-5 relative; n = 0 gives 0",
                 es_test,
                 {n_only(512), n_only(4096)},
                 {n_only(512), n_only(4096)},
                 factory<ExpSubSumCase>()});

  std::vector<Shape> am_test = each(n_only);
  am_test.insert(am_test.begin(), n_only(0));
  ops.push_back({"abs_max",
                 "bit-exact (a maximum does not depend on the order); n = 0 gives 0",
                 am_test,
                 {n_only(4096)},
                 {n_only(7168)},
                 factory<AbsMaxCase>()});

  ops.push_back({"axpy",
                 "bit-exact (a multiply then an add, as the reference)",
                 each(n_only),
                 {n_only(256)},
                 {n_only(2048)},
                 factory<AxpyCase>()});

  auto cvt = [](int64_t n, int64_t offset, int64_t specials = 0) {
    return shape({{"n", n}, {"offset", offset}, {"specials", specials}});
  };
  ops.push_back({"f32_to_bf16_row",
                 "bit-exact (round to nearest even; NaNs stay NaN, quiet); nothing written past n",
                 {cvt(0, 0, 1), cvt(0, 1, 1), cvt(0, 5, 1), cvt(17, 3)},
                 {cvt(256 * 64, 0)},
                 {cvt(2048 * 64, 0)},
                 factory<F32ToBf16Case>()});
  auto b2f = [](int64_t n, int64_t offset) { return shape({{"n", n}, {"offset", offset}}); };
  ops.push_back({"bf16_to_f32_row",
                 "bit-exact (every one of the 65536 codes); nothing written past n",
                 {b2f(65535, 1), b2f(17, 0)},
                 {b2f(256 * 64, 0)},
                 {b2f(2048 * 64, 0)},
                 factory<Bf16ToF32Case>()});

  auto q8 = [](int64_t tokens, int64_t dim, int64_t group) {
    return shape({{"tokens", tokens}, {"dim", dim}, {"group", group}});
  };
  std::vector<Shape> q8_test;
  for (int64_t dim : {128, 256, 2048, 384})
    for (int64_t group : {dim, int64_t{128}}) q8_test.push_back(q8(3, dim, group));
  ops.push_back({"quantize_fp8_e4m3",
                 "bit-exact codes and scales",
                 q8_test,
                 {q8(64, 256, 256), q8(64, 256, 128)},
                 {q8(64, 2048, 2048), q8(64, 2048, 128)},
                 factory<QuantizeFp8Case>()});
  ops.push_back({"dequantize_fp8_e4m3",
                 "bit-exact",
                 q8_test,
                 {q8(64, 256, 256)},
                 {q8(64, 2048, 128)},
                 factory<DequantizeFp8Case>()});

  auto blk = [](int64_t rows, int64_t cols, int64_t row_offset) {
    return shape({{"rows", rows}, {"cols", cols}, {"row_offset", row_offset}});
  };
  ops.push_back({"dequantize_fp8_blocks",
                 "bit-exact against the scalar path (fp8 * scale in f32)",
                 {blk(1, 1, 0), blk(5, 17, 0), blk(37, 100, 5), blk(130, 300, 0), blk(64, 256, 64), blk(129, 2048, 1),
                  blk(33, 15, 100)},
                 {blk(192, 256, 0), blk(256, 192, 0)},
                 {blk(512, 2048, 0), blk(2048, 512, 0)},
                 factory<DequantizeFp8BlocksCase>()});
}

}  // namespace afd::kernels::ops
