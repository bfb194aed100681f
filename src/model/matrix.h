// Matrix: the one view of a weight matrix that the model code computes with, whatever its
// storage format. Every matrix product of the model goes through linear(Matrix, ...) below,
// and the places that cut or copy weights (tensor-parallel slices) through the helpers here,
// so a storage format plugs in at this file and at the loader (model/weights.cpp), not at the
// call sites.
//
// Formats (dtype):
//   f32, bf16  dense row-major [rows, cols]
//   f8_e4m3    FP8 block quantization (HF "fp8", weight_block_size [128, 128]): e4m3 bytes
//              [rows, cols] plus float32 block scales, W[r, c] = fp8(data[r, c]) *
//              scale[((r + row_offset) / 128) * scale_stride + c / 128] (kernels/cpu/linear_fp8.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/scratch_arena.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace afd {

// A row-major matrix [rows, cols]: nn.Linear's (out_features, in_features). Nothing is owned.
struct Matrix {
  DType dtype = DType::bf16;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // f8_e4m3 only: block scales (weight_scale_inv), see above.
  const float* scale = nullptr;
  int64_t scale_stride = 0;
  int64_t row_offset = 0;

  bool empty() const { return data == nullptr; }
  bool is_fp8() const { return dtype == DType::f8_e4m3; }
  // Bytes of the elements (what streaming the matrix reads, scales aside).
  size_t nbytes() const { return static_cast<size_t>(rows * cols) * dtype_size(dtype); }
  // Bytes of the block scales a product reads (0 unless FP8).
  size_t scale_bytes() const;
  // Start of row r's elements.
  const uint8_t* row_ptr(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r * cols) * dtype_size(dtype);
  }
};

// y [n, m.rows] (row stride y_stride) = x [n, m.cols] (row stride x_stride) . m^T, or += with
// accumulate; the kernels' precision and order contracts (kernels/cpu/ops.h, linear_fp8.h).
// scratch: the kernels' working memory, as kernels::linear's (ops.h): at least pool->size()
// slots (1 without a pool), slot 0 the calling thread's.
void linear(const Matrix& m, const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride,
            kernels::ActPrecision prec, ThreadPool* pool, ScratchArena& scratch, bool accumulate = false,
            kernels::LinearOrder order = kernels::LinearOrder::fastest);
// The common case: x and y dense.
inline void linear(const Matrix& m, const float* x, int64_t n, float* y, kernels::ActPrecision prec, ThreadPool* pool,
                   ScratchArena& scratch, kernels::LinearOrder order = kernels::LinearOrder::fastest) {
  linear(m, x, n, m.cols, y, m.rows, prec, pool, scratch, false, order);
}

// Row r of m as f32 (embedding lookups).
void matrix_row_f32(const Matrix& m, int64_t r, float* out);

// Rows [r0, r1) of m as a view (no copy). For FP8 the view keeps its block scales through
// scale / row_offset, so any r0 works.
Matrix matrix_rows(const Matrix& m, int64_t r0, int64_t r1);

// Columns [c0, c1) of m copied into a matrix of the same format whose bytes are appended to
// `owned` (columns of a row-major matrix are not contiguous). Columns outside [keep0, keep1)
// (default: all kept) are zero in the copy. FP8 keeps whole blocks: c0 must be a multiple of
// 128 (the copy's block columns are the source's), which column_slice_aligned() tells.
Matrix matrix_cols_copy(const Matrix& m, int64_t c0, int64_t c1, std::vector<std::unique_ptr<uint8_t[]>>* owned,
                        int64_t keep0 = -1, int64_t keep1 = -1);
// Whether matrix_cols_copy(m, c0, ...) keeps m's block structure (always for dense formats).
bool column_slice_aligned(const Matrix& m, int64_t c0);

}  // namespace afd
