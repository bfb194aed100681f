// Rotary position embedding with precomputed inverse frequencies: YaRN (DeepSeek) frequency
// tables and the attention-scale corrections, and rotation of either pair layout on a slice
// of each row. Plain numbers in, no model types (MODELS.md B6 for the formulas).
#pragma once

#include <cstdint>

namespace afd::kernels {

// yarn_get_mscale: 0.1 * mscale * ln(factor) + 1, or 1 when factor <= 1.
double yarn_mscale(double factor, double mscale);

// The YaRN correction range over the rot_dim/2 rotary pairs, for rot_dim rotary dims, base
// theta and the pre-extension context orig_max_pos:
//   corr(r) = rot_dim * ln(orig_max_pos / (2 pi r)) / (2 ln theta)
//   low = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), rot_dim - 1).
void yarn_correction_range(int64_t rot_dim, double theta, double orig_max_pos, double beta_fast, double beta_slow,
                           int64_t* low, int64_t* high);

// inv_freq[i], i < rot_dim / 2. Plain RoPE when factor <= 0 (no scaling): theta^(-2i/rot_dim).
// YaRN otherwise: f_ext = theta^(-2i/rot_dim), f_int = f_ext / factor,
// ramp = clamp((i - low) / (high - low), 0, 1) (high + 0.001 when low == high),
// inv_freq = f_int * ramp + f_ext * (1 - ramp).
void rope_inv_freq(int64_t rot_dim, double theta, double factor, double orig_max_pos, double beta_fast,
                   double beta_slow, double* inv_freq);

// Magnitude of YaRN's cos/sin: yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim).
double yarn_attention_factor(double factor, double mscale, double mscale_all_dim);

// Softmax scale of attention with qk_head_dim-wide q/k heads: qk_head_dim^-0.5, times
// yarn_mscale(factor, mscale_all_dim)^2 when mscale_all_dim != 0.
double yarn_softmax_scale(int64_t qk_head_dim, double factor, double mscale_all_dim);

// cos[i] = mag * cos(pos * inv_freq[i]), sin[i] = mag * sin(pos * inv_freq[i]) for i < half,
// computed in double and rounded to float.
void rope_cos_sin(int64_t pos, const double* inv_freq, int64_t half, double mag, float* cos, float* sin);

// Rotates in place x[r * stride + 0 .. rot_dim) for r < n_rows with the cos/sin of
// rope_cos_sin (half = rot_dim / 2 entries):
//   interleaved (GPT-J, DeepSeek): pairs (2i, 2i+1);  otherwise (NEOX): pairs (i, i + half):
//   (a, b) <- (a cos_i - b sin_i, b cos_i + a sin_i).
void rope_rotate(float* x, int64_t n_rows, int64_t stride, int64_t rot_dim, const float* cos, const float* sin,
                 bool interleaved);

}  // namespace afd::kernels
