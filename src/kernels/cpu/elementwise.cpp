// Element-wise ops of ops.h: run-time dispatch to the AVX-512 versions, scalar references
// otherwise. rope_neox has a single implementation (its cost is the sin/cos, done once per call).
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/elementwise_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace afd::kernels {

namespace {
bool use_avx512() { return active_isa() == Isa::avx512; }

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}
}  // namespace

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y) {
  if (use_avx512()) return detail::rmsnorm_avx512(x, w, n, dim, eps, y);
  ref::rmsnorm(x, w, n, dim, eps, y);
}

void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, double theta) {
  AFD_CHECK(head_dim % 2 == 0, "rope_neox: head_dim must be even");
  const int64_t half = head_dim / 2;
  // One frequency at a time, applied to every head (no table of cos / sin).
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double ang = static_cast<double>(pos) * inv_freq;
    const float cs = static_cast<float>(std::cos(ang));
    const float sn = static_cast<float>(std::sin(ang));
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + h * head_dim;
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * cs - b * sn;
      xh[i + half] = b * cs + a * sn;
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (use_avx512()) return detail::silu_mul_avx512(gate, up, n, out);
  ref::silu_mul(gate, up, n, out);
}

void softmax(float* x, int64_t n) {
  if (use_avx512()) return detail::softmax_avx512(x, n);
  ref::softmax(x, n);
}

float scale_max(float* x, int64_t n, float s) {
  if (use_avx512()) return detail::scale_max_avx512(x, n, s);
  return ref::scale_max(x, n, s);
}

float exp_sub_sum(float* x, int64_t n, float m) {
  if (use_avx512()) return detail::exp_sub_sum_avx512(x, n, m);
  return ref::exp_sub_sum(x, n, m);
}

void axpy(float a, const float* x, int64_t n, float* y) {
  if (use_avx512()) return detail::axpy_avx512(a, x, n, y);
  ref::axpy(a, x, n, y);
}

void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y) {
  if (use_avx512()) return detail::f32_to_bf16_row_avx512(x, n, y);
  ref::f32_to_bf16_row(x, n, y);
}

void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y) {
  if (use_avx512()) return detail::bf16_to_f32_row_avx512(x, n, y);
  ref::bf16_to_f32_row(x, n, y);
}

void quantize_fp8_e4m3(const float* x, int64_t n, int64_t group, uint8_t* q, float* scales) {
  if (!use_avx512()) return ref::quantize_fp8_e4m3(x, n, group, q, scales);
  AFD_CHECK(group > 0 && n % group == 0, "quantize_fp8_e4m3: n must be a multiple of group");
  // Vector amax (exact in any order) and a vector form of core/dtype.h's rounding: the
  // result is bit-identical to the reference.
  for (int64_t g = 0; g < n / group; ++g) {
    const float* xg = x + g * group;
    float amax = detail::amax_avx512(xg, group);
    float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
    scales[g] = scale;
    detail::quantize_fp8_avx512(xg, scale, group, q + g * group);
  }
}

float abs_max(const float* x, int64_t n) {
  if (use_avx512() && n > 0) return detail::amax_avx512(x, n);
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

void scale_to_fp8_e4m3(const float* x, int64_t n, float mul, uint8_t* q) {
  if (use_avx512()) return detail::scale_to_fp8_avx512(x, mul, n, q);
  for (int64_t i = 0; i < n; ++i) q[i] = f32_to_fp8_e4m3(x[i] * mul);
}

void dequantize_fp8_e4m3(const uint8_t* q, const float* scales, int64_t n, int64_t group, float* x) {
  AFD_CHECK(group > 0 && n % group == 0, "dequantize_fp8_e4m3: n must be a multiple of group");
  const std::array<float, 256>& t = fp8_table();
  for (int64_t g = 0; g < n / group; ++g) {
    const uint8_t* qg = q + g * group;
    float* xg = x + g * group;
    if (use_avx512()) {
      detail::dequantize_fp8_avx512(qg, scales[g], group, xg);
    } else {
      for (int64_t i = 0; i < group; ++i) xg[i] = t[qg[i]] * scales[g];
    }
  }
}

}  // namespace afd::kernels
