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

constexpr int kSkinnyTokens = 32;  // tokens per pass (accumulators per lane)
constexpr int kSkinnyWarps = 8;    // output rows per block

__device__ inline void bf16x8_to_f32(const uint4& v, float* f) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__global__ void grouped_skinny_gemm_kernel(const uint16_t* const* w, const int32_t* off, const int32_t* m, int64_t out,
                                           int64_t in, const uint16_t* x, float* y) {
  const int g = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kSkinnyWarps + (threadIdx.x >> 5);
  if (o >= out) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(w[g] + o * in);
  const int64_t in8 = in / 8;
  const int rows = m[g];
  const int64_t base = off[g];
  for (int t0 = 0; t0 < rows; t0 += kSkinnyTokens) {
    const int mt = min(kSkinnyTokens, rows - t0);
    float acc[kSkinnyTokens];
#pragma unroll
    for (int t = 0; t < kSkinnyTokens; ++t) acc[t] = 0.0f;
    for (int64_t k = lane; k < in8; k += 32) {
      float wf[8];
      bf16x8_to_f32(__ldg(wrow + k), wf);
#pragma unroll
      for (int t = 0; t < kSkinnyTokens; ++t) {
        if (t < mt) {
          float xf[8];
          bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(x + (base + t0 + t) * in) + k), xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[t] = fmaf(wf[i], xf[i], acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kSkinnyTokens; ++t) {
      if (t < mt) {
        float v = acc[t];
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
        if (lane == t) y[(base + t0 + t) * out + o] = v;
      }
    }
  }
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

cudaError_t grouped_skinny_gemm(const uint16_t* const* w, const int32_t* off, const int32_t* m, int32_t groups,
                                int64_t out, int64_t in, const uint16_t* x, float* y, cudaStream_t stream) {
  if (groups <= 0 || out <= 0) return cudaSuccess;
  if (in % 8 != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((out + kSkinnyWarps - 1) / kSkinnyWarps), static_cast<unsigned>(groups));
  grouped_skinny_gemm_kernel<<<grid, kSkinnyWarps * 32, 0, stream>>>(w, off, m, out, in, x, y);
  return launched();
}

}  // namespace afd::kernels::cuda
