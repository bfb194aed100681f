// Internal: AVX-512 versions of the element-wise ops (elementwise_avx512.cpp); ops.h
// dispatches to them when active_isa() == Isa::avx512, else to the scalar references.
#pragma once

#include <cstdint>

namespace afd::kernels::detail {

void rmsnorm_avx512(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y);
void silu_mul_avx512(const float* gate, const float* up, int64_t n, float* out);
void softmax_avx512(float* x, int64_t n);
float scale_max_avx512(float* x, int64_t n, float s);
float exp_sub_sum_avx512(float* x, int64_t n, float m);
void axpy_avx512(float a, const float* x, int64_t n, float* y);
void f32_to_bf16_row_avx512(const float* x, int64_t n, uint16_t* y);
void bf16_to_f32_row_avx512(const uint16_t* x, int64_t n, float* y);
// max |x[i]| over i < n.
float amax_avx512(const float* x, int64_t n);
// x[i] = fp8_e4m3_to_f32(q[i]) * scale for i < n (core/dtype.h), bit for bit.
void dequantize_fp8_avx512(const uint8_t* q, float scale, int64_t n, float* x);
// q[i] = f32_to_fp8_e4m3(x[i] / scale) for i < n (core/dtype.h), bit for bit.
void quantize_fp8_avx512(const float* x, float scale, int64_t n, uint8_t* q);
// q[i] = f32_to_fp8_e4m3(x[i] * mul) for i < n, bit for bit.
void scale_to_fp8_avx512(const float* x, float mul, int64_t n, uint8_t* q);

}  // namespace afd::kernels::detail
