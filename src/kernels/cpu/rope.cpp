// Scalar only: the work is rot_dim/2 sin/cos per token plus a few multiplies per rotated row.
#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace afd::kernels {

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

namespace {
double correction_dim(int64_t rot_dim, double theta, double orig_max_pos, double rotations) {
  return static_cast<double>(rot_dim) * std::log(orig_max_pos / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}
}  // namespace

void yarn_correction_range(int64_t rot_dim, double theta, double orig_max_pos, double beta_fast, double beta_slow,
                           int64_t* low, int64_t* high) {
  *low = std::max<int64_t>(static_cast<int64_t>(std::floor(correction_dim(rot_dim, theta, orig_max_pos, beta_fast))), 0);
  *high = std::min<int64_t>(static_cast<int64_t>(std::ceil(correction_dim(rot_dim, theta, orig_max_pos, beta_slow))),
                            rot_dim - 1);
}

void rope_inv_freq(int64_t rot_dim, double theta, double factor, double orig_max_pos, double beta_fast,
                   double beta_slow, double* inv_freq) {
  AFD_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope_inv_freq: rot_dim must be even and positive");
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  if (factor <= 0.0) return;
  int64_t low = 0, high = 0;
  yarn_correction_range(rot_dim, theta, orig_max_pos, beta_fast, beta_slow, &low, &high);
  const double lo = static_cast<double>(low), hi = low == high ? static_cast<double>(high) + 0.001 : high;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    const double f_ext = inv_freq[i], f_int = f_ext / factor;
    inv_freq[i] = f_int * ramp + f_ext * (1.0 - ramp);
  }
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
}

double yarn_softmax_scale(int64_t qk_head_dim, double factor, double mscale_all_dim) {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  if (mscale_all_dim != 0.0) {
    const double m = yarn_mscale(factor, mscale_all_dim);
    s *= m * m;
  }
  return s;
}

void rope_cos_sin(int64_t pos, const double* inv_freq, int64_t half, double mag, float* cos, float* sin) {
  for (int64_t i = 0; i < half; ++i) {
    const double ang = static_cast<double>(pos) * inv_freq[i];
    cos[i] = static_cast<float>(std::cos(ang) * mag);
    sin[i] = static_cast<float>(std::sin(ang) * mag);
  }
}

void rope_rotate(float* x, int64_t n_rows, int64_t stride, int64_t rot_dim, const float* cos, const float* sin,
                 bool interleaved) {
  const int64_t half = rot_dim / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    float* xr = x + r * stride;
    for (int64_t i = 0; i < half; ++i) {
      float* pa = interleaved ? xr + 2 * i : xr + i;
      float* pb = interleaved ? xr + 2 * i + 1 : xr + i + half;
      const float a = *pa, b = *pb;
      *pa = a * cos[i] - b * sin[i];
      *pb = b * cos[i] + a * sin[i];
    }
  }
}

}  // namespace afd::kernels
