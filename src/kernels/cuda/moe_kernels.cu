#include "kernels/cuda/moe_kernels.h"

#include <cuda_bf16.h>

namespace afd::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline uint16_t to_bf16_bits(float f) {
  const __nv_bfloat16 b = __float2bfloat16_rn(f);  // round to nearest even, NaN kept
  return *reinterpret_cast<const uint16_t*>(&b);
}

__global__ void gather_rows_bf16_kernel(const float* h, int64_t hidden, const int32_t* rows, int64_t m, uint16_t* xs) {
  const int64_t r = blockIdx.x;
  if (r >= m) return;
  const float* src = h + (rows ? static_cast<int64_t>(rows[r]) : r) * hidden;
  uint16_t* dst = xs + r * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = to_bf16_bits(src[i]);
}

__global__ void silu_mul_bf16_kernel(const float* gu, int64_t inter, uint16_t* act) {
  const int64_t r = blockIdx.x;
  const float* g = gu + r * 2 * inter;
  const float* u = g + inter;
  uint16_t* a = act + r * inter;
  for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) {
    const float x = g[i];
    a[i] = to_bf16_bits(x / (1.0f + __expf(-x)) * u[i]);
  }
}

__global__ void scatter_weighted_kernel(const float* y, int64_t hidden, const int32_t* slots, const float* weights,
                                        float* slot_out) {
  const int64_t r = blockIdx.x;
  const float w = weights[r];
  const float* src = y + r * hidden;
  float* dst = slot_out + static_cast<int64_t>(slots[r]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = w * src[i];
}

__global__ void sum_slots_kernel(const float* slot_out, int64_t k, int64_t hidden, float* out) {
  const int64_t t = blockIdx.x;
  const float* src = slot_out + t * k * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += src[j * hidden + i];
    out[t * hidden + i] = s;
  }
}

__global__ void add_gated_kernel(const float* h, const float* gate_w, const float* ys, int64_t hidden, float* out) {
  __shared__ float part[kThreads];
  __shared__ float g;
  const int64_t t = blockIdx.x;
  if (gate_w != nullptr) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) s += h[t * hidden + i] * gate_w[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0) g = 1.0f / (1.0f + expf(-part[0]));
  } else if (threadIdx.x == 0) {
    g = 1.0f;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] += g * ys[t * hidden + i];
}

// A grid of one block per row; rows beyond the 2^31-1 grid limit cannot occur (m is a token
// count bounded by the wire's max_tokens * top_k).
cudaError_t launched() { return cudaGetLastError(); }

}  // namespace

cudaError_t gather_rows_bf16(const float* h, int64_t hidden, const int32_t* rows, int64_t m, uint16_t* xs,
                             cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  gather_rows_bf16_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(h, hidden, rows, m, xs);
  return launched();
}

cudaError_t silu_mul_bf16(const float* gu, int64_t m, int64_t inter, uint16_t* act, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  silu_mul_bf16_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(gu, inter, act);
  return launched();
}

cudaError_t scatter_weighted(const float* y, int64_t m, int64_t hidden, const int32_t* slots, const float* weights,
                             float* slot_out, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  scatter_weighted_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(y, hidden, slots, weights, slot_out);
  return launched();
}

cudaError_t sum_slots(const float* slot_out, int64_t n, int64_t k, int64_t hidden, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sum_slots_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(slot_out, k, hidden, out);
  return launched();
}

cudaError_t add_gated(const float* h, const float* gate_w, const float* ys, int64_t n, int64_t hidden, float* out,
                      cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_gated_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(h, gate_w, ys, hidden, out);
  return launched();
}

}  // namespace afd::kernels::cuda
