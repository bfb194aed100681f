// Shared helpers for the kernel tests: ISA levels to test, random data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/scratch_arena.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/paged_rows.h"

namespace afd::kernels::testing {

// The kernels' working memory in these tests: more slots than any test's pool has threads
// (kernels check that), reused from call to call as a caller's arena is.
inline ScratchArena& test_scratch() {
  static ScratchArena arena(8);
  return arena;
}

// Every level up to what this process may use (after AFD_CPU_DISABLE masking).
inline std::vector<Isa> isa_levels() {
  std::vector<Isa> v;
  for (int i = 0; i <= static_cast<int>(detected_isa()); ++i) v.push_back(static_cast<Isa>(i));
  return v;
}

// Restores the ISA limit when a test ends, even on failure.
struct IsaLimitGuard {
  explicit IsaLimitGuard(Isa isa) { set_isa_limit(isa); }
  ~IsaLimitGuard() { set_isa_limit(Isa::avx512); }
};

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A paged cache of n_ctx rows of D values (rows [n_ctx, D] f32, stored in dt; fp8 with a scale
// per row) in blocks of block_size rows, the blocks in a shuffled order with two spare ones;
// view points into the other members.
struct Paged {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::vector<float>> scale_storage;
  std::vector<const uint8_t*> blocks;
  std::vector<const float*> scales;
  PagedRows view;
};

inline Paged make_paged(const std::vector<float>& rows, int64_t n_ctx, int64_t D, int64_t block_size, DType dt) {
  const int64_t nb = (n_ctx + block_size - 1) / block_size;
  Paged p;
  p.storage.resize(static_cast<size_t>(nb + 2));
  p.scale_storage.resize(p.storage.size());
  for (size_t k = 0; k < p.storage.size(); ++k) {
    p.storage[k].assign(static_cast<size_t>(block_size * D) * dtype_size(dt), 0xff);
    p.scale_storage[k].assign(static_cast<size_t>(block_size), 1.0f);
  }
  std::vector<int64_t> order(p.storage.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (int64_t j = 0; j < n_ctx; ++j) {
    const int64_t blk = order[j / block_size], slot = j % block_size;
    uint8_t* dst = p.storage[blk].data() + slot * D * dtype_size(dt);
    const float* x = &rows[j * D];
    if (dt == DType::f32) {
      std::memcpy(dst, x, static_cast<size_t>(D) * 4);
    } else if (dt == DType::bf16) {
      for (int64_t i = 0; i < D; ++i) reinterpret_cast<uint16_t*>(dst)[i] = f32_to_bf16(x[i]).bits;
    } else {
      float amax = 0;
      for (int64_t i = 0; i < D; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float s = amax / kFp8E4M3Max;
      p.scale_storage[blk][slot] = s;
      for (int64_t i = 0; i < D; ++i) dst[i] = f32_to_fp8_e4m3(x[i] / s);
    }
  }
  for (int64_t k = 0; k < nb; ++k) {
    p.blocks.push_back(p.storage[order[k]].data());
    p.scales.push_back(p.scale_storage[order[k]].data());
  }
  p.view.blocks = p.blocks.data();
  p.view.scales = dt == DType::f8_e4m3 ? p.scales.data() : nullptr;
  p.view.block_size = block_size;
  p.view.row_dim = D;
  p.view.dtype = dt;
  return p;
}

}  // namespace afd::kernels::testing
