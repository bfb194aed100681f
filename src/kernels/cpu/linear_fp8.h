// Matrix products with FP8 block-quantized weights (the DeepSeek-V3 / Hugging Face "fp8"
// checkpoint format: float8_e4m3fn weights, one float32 `weight_scale_inv` per 128 x 128
// block), dequantized on the fly: the weights stay 1 byte per element in memory.
//
// Layout of a quantized [rows, cols] weight (nn.Linear's [out_features, in_features]):
//   q     [rows, cols] e4m3fn bytes, row-major
//   scale block scales, W[r, c] = fp8_e4m3_to_f32(q[r * cols + c]) * scale[br * scale_stride + c / 128]
//         with br = (r + row_offset) / 128. A checkpoint's own tensor has scale_stride =
//         ceil(cols / 128) and row_offset 0; views of part of a tensor (the up half of a fused
//         gate_up_proj whose gate half is not a whole number of blocks) use row_offset to say
//         where row 0 sits inside its block. Edge blocks may be partial (rows or cols not a
//         multiple of 128): nothing is padded, the last block simply covers fewer elements.
// q must not hold the NaN encodings 0x7f / 0xff (quantize_fp8_blocks never writes them).
#pragma once

#include <cstdint>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace afd::kernels {

constexpr int64_t kFp8Block = 128;

struct Fp8BlockWeights {
  const uint8_t* q = nullptr;
  const float* scale = nullptr;
  int64_t scale_stride = 0;  // >= ceil(cols / 128)
  int64_t row_offset = 0;    // in [0, 128)
};

// y[i, r] = sum_c x[i, c] * W[r, c] for i < n, r < rows, with linear()'s conventions (ops.h):
// x [n, x_stride], y [n, y_stride], accumulate adds into y, pool may be null.
// Precision: f32 activations use the exact fp8 values, with one f32 rounding where the block
// scale is applied (to the weight, fp8 * scale, or on AVX2 to the activation, x * scale).
// bf16 activations round x to bf16; on AVX-512 BF16 they also use W rounded to bf16 after
// scaling (round_bf16(fp8 * scale)), as a bf16 checkpoint of the dequantized weights would hold,
// on every path.
// The result for a row never depends on the pool's size, so every FFN sharding computes the
// same numbers. With order = batch_invariant it depends only on the row, its x and the ISA
// level, not on n, the token's index or the other tokens (linear_fp8_kernels.h states the
// orders): the many-token AVX-512 bf16 tiles take linear()'s canonical pairs kernel, and f32
// activations on AVX-512 take the tiles at every n (the gemv, which scales block partial sums,
// only in the fastest order). With order = fastest that holds for bf16 activations below
// linear()'s pairs threshold and on AVX2.
// scratch: as linear()'s (ops.h): at least pool->size() slots (1 without a pool); slot 0 is the
// calling thread's and holds the prepared activations until the call returns; a task on pool
// thread t takes from slot t, while it runs, its dequantized tile (tile_rows x cols, f32 or bf16)
// or the gemv's tables and prescaled activations.
void linear_fp8(const float* x, int64_t n, int64_t x_stride, const Fp8BlockWeights& w, int64_t rows, int64_t cols,
                float* y, int64_t y_stride, ActPrecision prec, ThreadPool* pool, ScratchArena& scratch,
                bool accumulate = false, LinearOrder order = LinearOrder::fastest);

// Name of the implementation linear_fp8() uses for this call shape, e.g. "avx512_fp8_gemv_lut8",
// "avx512_fp8_tile_bf16", "avx512_fp8_tile_pairs", "avx2_fp8_gemv", "scalar_fp8" (benchmarks and reports).
const char* linear_fp8_path_name(int64_t n, int64_t cols, ActPrecision prec);

// Block quantization of a row-major f32 matrix w [rows, cols] into the layout above
// (row_offset 0, scale_stride = ceil(cols / 128)): per block, s = amax / 448 (1 for an all-zero
// block), q = f32_to_fp8_e4m3(w / s) (round to nearest even, saturating at +-448; core/dtype.h),
// scale = s. q [rows, cols], scale [ceil(rows / 128), ceil(cols / 128)]. Non-finite inputs are
// the caller's to reject (a NaN or inf makes its block's scale non-finite).
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale);

// W [rows, cols] f32 = the dequantized weights, exactly fp8 * scale in f32 (SIMD where the CPU
// has it, the same values as the scalar definition; rows of FP8 weights read one at a time,
// checkpoint conversion).
void dequantize_fp8_blocks(const Fp8BlockWeights& w, int64_t rows, int64_t cols, float* out);

namespace ref {
// Scalar reference of linear_fp8: exact dequantization, x rounded to bf16 in bf16 mode, f32 sums.
void linear_fp8(const float* x, int64_t n, int64_t x_stride, const Fp8BlockWeights& w, int64_t rows,
                int64_t cols, float* y, int64_t y_stride, ActPrecision prec, bool accumulate = false);
}  // namespace ref

}  // namespace afd::kernels
