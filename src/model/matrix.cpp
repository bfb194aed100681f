#include "model/matrix.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/linear_fp8.h"

namespace afd {

namespace {

using kernels::kFp8Block;

int64_t blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

kernels::Fp8BlockWeights fp8_view(const Matrix& m) {
  return {static_cast<const uint8_t*>(m.data), m.scale, m.scale_stride, m.row_offset};
}

}  // namespace

size_t Matrix::scale_bytes() const {
  if (!is_fp8()) return 0;
  return static_cast<size_t>(blocks(rows + row_offset) * blocks(cols)) * sizeof(float);
}

void linear(const Matrix& m, const float* x, int64_t n, int64_t x_stride, float* y, int64_t y_stride,
            kernels::ActPrecision prec, ThreadPool* pool, ScratchArena& scratch, bool accumulate,
            kernels::LinearOrder order) {
  if (m.is_fp8()) {
    kernels::linear_fp8(x, n, x_stride, fp8_view(m), m.rows, m.cols, y, y_stride, prec, pool, scratch, accumulate,
                        order);
  } else {
    kernels::linear(x, n, x_stride, m.data, m.dtype, m.rows, m.cols, y, y_stride, prec, pool, scratch, accumulate,
                    order);
  }
}

void matrix_row_f32(const Matrix& m, int64_t r, float* out) {
  switch (m.dtype) {
    case DType::f32: std::memcpy(out, m.row_ptr(r), static_cast<size_t>(m.cols) * sizeof(float)); break;
    case DType::bf16: kernels::bf16_to_f32_row(reinterpret_cast<const uint16_t*>(m.row_ptr(r)), m.cols, out); break;
    case DType::f8_e4m3: {
      const Matrix row = matrix_rows(m, r, r + 1);
      kernels::dequantize_fp8_blocks(fp8_view(row), 1, m.cols, out);
      break;
    }
    default: AFD_CHECK(false, "matrix_row_f32: unsupported weight dtype");
  }
}

Matrix matrix_rows(const Matrix& m, int64_t r0, int64_t r1) {
  AFD_CHECK(r0 >= 0 && r0 <= r1 && r1 <= m.rows, "matrix_rows: range outside the matrix");
  Matrix s = m;
  s.data = m.row_ptr(r0);
  s.rows = r1 - r0;
  if (m.is_fp8()) {
    const int64_t at = m.row_offset + r0;  // position of row r0 in the block grid
    s.scale = m.scale + at / kFp8Block * m.scale_stride;
    s.row_offset = at % kFp8Block;
  }
  return s;
}

bool column_slice_aligned(const Matrix& m, int64_t c0) { return !m.is_fp8() || c0 % kFp8Block == 0; }

Matrix matrix_cols_copy(const Matrix& m, int64_t c0, int64_t c1, std::vector<std::unique_ptr<uint8_t[]>>* owned,
                        int64_t keep0, int64_t keep1) {
  if (keep0 < 0) keep0 = c0;
  if (keep1 < 0) keep1 = c1;
  AFD_CHECK(c0 >= 0 && c0 <= c1 && c1 <= m.cols, "matrix_cols_copy: range outside the matrix");
  AFD_CHECK(c0 <= keep0 && keep0 <= keep1 && keep1 <= c1, "matrix_cols_copy: kept columns outside the copy");
  AFD_CHECK(column_slice_aligned(m, c0), "matrix_cols_copy: FP8 column slice not on a block boundary");
  const size_t es = dtype_size(m.dtype);
  const int64_t w = c1 - c0;
  const size_t row_bytes = static_cast<size_t>(w) * es;
  // Value-initialised: zero bytes are 0.0 in every format.
  auto buf = std::make_unique<uint8_t[]>(std::max<size_t>(1, static_cast<size_t>(m.rows) * row_bytes));
  const size_t keep_bytes = static_cast<size_t>(keep1 - keep0) * es, skip = static_cast<size_t>(keep0 - c0) * es;
  for (int64_t i = 0; i < m.rows; ++i)
    std::memcpy(buf.get() + static_cast<size_t>(i) * row_bytes + skip, m.row_ptr(i) + static_cast<size_t>(keep0) * es,
                keep_bytes);
  Matrix s = m;
  s.data = buf.get();
  s.cols = w;
  owned->push_back(std::move(buf));
  if (m.is_fp8()) {
    // The copy's scales: block columns [c0 / 128, ceil(c1 / 128)) of every block row.
    const int64_t br = blocks(m.rows + m.row_offset), b0 = c0 / kFp8Block, bw = blocks(c1) - b0;
    auto sb = std::make_unique<uint8_t[]>(static_cast<size_t>(br * bw) * sizeof(float));
    float* sp = reinterpret_cast<float*>(sb.get());
    for (int64_t r = 0; r < br; ++r)
      std::memcpy(sp + r * bw, m.scale + r * m.scale_stride + b0, static_cast<size_t>(bw) * sizeof(float));
    s.scale = sp;
    s.scale_stride = bw;
    owned->push_back(std::move(sb));
  }
  return s;
}

}  // namespace afd
