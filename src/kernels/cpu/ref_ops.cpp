// Scalar references: plain loops, one thread, written for clarity. Every SIMD kernel is
// tested against these (tests/unit/kernels).
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/cpu/ops.h"

namespace afd::kernels::ref {

void linear(const float* x, int64_t n, int64_t x_stride, const void* w, DType w_dtype, int64_t rows,
            int64_t cols, float* y, int64_t y_stride, ActPrecision prec, bool accumulate) {
  AFD_CHECK(w_dtype == DType::bf16 || w_dtype == DType::f32);
  const uint16_t* wb = static_cast<const uint16_t*>(w);
  const float* wf = static_cast<const float*>(w);
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        float xv = prec == ActPrecision::bf16 ? round_bf16(xi[c]) : xi[c];
        float wv = w_dtype == DType::bf16 ? bf16_to_f32(wb[r * cols + c]) : wf[r * cols + c];
        acc += xv * wv;
      }
      float* out = y + i * y_stride + r;
      *out = accumulate ? *out + acc : acc;
    }
  }
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    double ss = 0.0;
    for (int64_t c = 0; c < dim; ++c) ss += static_cast<double>(xi[c]) * xi[c];
    float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    float* yi = y + i * dim;
    for (int64_t c = 0; c < dim; ++c) yi[c] = xi[c] * inv * w[c];
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void matmul_f32(const float* a, int64_t m, int64_t k, int64_t lda, const float* b, int64_t n, int64_t ldb, float* c,
                int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t l = 0; l < k; ++l) acc += static_cast<double>(a[i * lda + l]) * b[l * ldb + j];
      c[i * ldc + j] = static_cast<float>(acc);
    }
}

float scale_max(float* x, int64_t n, float s) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i] *= s);
  return m;
}

float exp_sub_sum(float* x, int64_t n, float m) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] = std::exp(x[i] - m);
  return static_cast<float>(sum);
}

void axpy(float a, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void f32_to_bf16_row(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]).bits;
}

void bf16_to_f32_row(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

void quantize_fp8_e4m3(const float* x, int64_t n, int64_t group, uint8_t* q, float* scales) {
  AFD_CHECK(group > 0 && n % group == 0);
  for (int64_t g = 0; g < n / group; ++g) {
    const float* xg = x + g * group;
    float amax = 0.0f;
    for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(xg[i]));
    float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
    scales[g] = scale;
    for (int64_t i = 0; i < group; ++i) q[g * group + i] = f32_to_fp8_e4m3(xg[i] / scale);
  }
}

void dequantize_fp8_e4m3(const uint8_t* q, const float* scales, int64_t n, int64_t group, float* x) {
  AFD_CHECK(group > 0 && n % group == 0);
  for (int64_t i = 0; i < n; ++i) x[i] = fp8_e4m3_to_f32(q[i]) * scales[i / group];
}

}  // namespace afd::kernels::ref
