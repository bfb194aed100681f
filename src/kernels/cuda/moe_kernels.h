// CUDA kernels of the MoE FFN half (runtime/cuda/cuda_ffn.cpp drives them with cuBLAS
// GEMMs in between). Plain device pointers, no orchestration types; every launcher enqueues
// on `stream` and returns cudaGetLastError() of the launch. Only built with AFD_CUDA.
//
// Layouts (row-major; bf16 = __nv_bfloat16 stored as uint16_t on the host side):
//   h        [n, hidden]  f32  FFN input of n tokens
//   rows     [m]          i32  token index of each gathered row (nullptr: rows 0..m-1)
//   xs       [m, hidden]  bf16 gathered, rounded input of one expert group
//   gu       [m, 2*inter] f32  [gate | up] products of those rows
//   act      [m, inter]   bf16 silu(gate) * up, rounded: the down projection's input
//   y        [m, hidden]  f32  down-projection output
//   slot_out [n*k, hidden] f32 weight * y of every (token, slot); slots not computed here are 0
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace afd::kernels::cuda {

// xs[r] = bf16(h[rows ? rows[r] : r]) for r < m.
cudaError_t gather_rows_bf16(const float* h, int64_t hidden, const int32_t* rows, int64_t m, uint16_t* xs,
                             cudaStream_t stream);

// act[r, i] = bf16(silu(gu[r, i]) * gu[r, inter + i]).
cudaError_t silu_mul_bf16(const float* gu, int64_t m, int64_t inter, uint16_t* act, cudaStream_t stream);

// slot_out[slots[r]] = weights[r] * y[r] for r < m (slots: flat token*k + slot index).
cudaError_t scatter_weighted(const float* y, int64_t m, int64_t hidden, const int32_t* slots, const float* weights,
                             float* slot_out, cudaStream_t stream);

// out[t] = sum_{j < k} slot_out[t*k + j], j ascending (the order is part of the contract:
// results are deterministic run to run).
cudaError_t sum_slots(const float* slot_out, int64_t n, int64_t k, int64_t hidden, float* out, cudaStream_t stream);

// out[t] += g_t * ys[t] with g_t = sigmoid(h[t] . gate_w) when gate_w != nullptr, else 1.
// gate_w [hidden] f32. The dot product is a fixed-order tree reduction (deterministic).
cudaError_t add_gated(const float* h, const float* gate_w, const float* ys, int64_t n, int64_t hidden, float* out,
                      cudaStream_t stream);

// Expert-grouped skinny product for decode shapes (few tokens per expert), one launch for
// all groups: for group g and r < m[g], y[(off[g] + r), o] = sum_i x[off[g] + r, i] * W_g[o, i]
// for o < out, with W_g = w[g] ([out, in] bf16 row-major), x [*, in] bf16, y [*, out] f32, f32
// accumulation. Each warp computes one output row o of one group, streaming W_g's row once
// per 32 tokens (so the weights are read ~once while m[g] <= 32). Requires in % 8 == 0 and
// 16-byte aligned rows; w / off / m are device arrays of length groups.
cudaError_t grouped_skinny_gemm(const uint16_t* const* w, const int32_t* off, const int32_t* m, int32_t groups,
                                int64_t out, int64_t in, const uint16_t* x, float* y, cudaStream_t stream);

}  // namespace afd::kernels::cuda
