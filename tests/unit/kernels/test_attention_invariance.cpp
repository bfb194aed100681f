// Batch invariance of the attention kernels: one query's output bits do not depend on how it
// is attended.
//   - causal_attention in CausalOrder::decode (a prompt run of nq tokens from position p0, any
//     pool) gives every query row the bits gqa_decode_attend gives that query alone over the
//     same rows: runs of 1 .. 40
//     tokens, starts on and off the 16-position tiles and 64-position score blocks, GQA groups
//     of 1, 3 and 4, head_dim 16 .. 128, sliding windows, K/V rows stored in f32, bf16 and fp8
//     e4m3 (the prefill kernel reads them widened, as the cache gives them);
//   - gqa_decode_attend and mqa_decode_attend: a head's bits do not depend on which other heads
//     share the call (the group sizes MqaDecodeRunner's callers choose from the pool size and
//     the batch), at contexts crossing the chunk and split-K segment edges, on every ISA level;
//   - mqa_decode_attend with per-row ends (row_ctx, the rows of a run of consecutive tokens in
//     one call): each row's bits are those of a call for that row alone over its own positions.
// Bits are compared with memcmp (the sign of zero counts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"
#include "kernels/cpu/causal_attention.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/mla_attention.h"
#include "test_util.h"

namespace afd::kernels {
namespace {

using testing::isa_levels;
using testing::IsaLimitGuard;
using testing::make_paged;
using testing::Paged;
using testing::random_vec;
using testing::test_scratch;

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * 4) == 0; }

struct GqaCase {
  int64_t heads, kv_heads, hd, window;
};

// Positions 0 .. n_ctx - 1 of n_kv_heads K and V heads, stored paged in dt (one view per head)
// and as the f32 rows [n_ctx, n_kv_heads * hd] the cache reads back (what the prefill kernel
// gets).
struct KvRows {
  std::vector<Paged> k, v;
  std::vector<float> k_f32, v_f32;
};

KvRows make_kv_rows(const GqaCase& c, int64_t n_ctx, DType dt, uint32_t seed) {
  KvRows r;
  const int64_t kvd = c.kv_heads * c.hd;
  r.k_f32.resize(static_cast<size_t>(n_ctx * kvd));
  r.v_f32.resize(r.k_f32.size());
  for (int64_t g = 0; g < c.kv_heads; ++g) {
    r.k.push_back(make_paged(random_vec(static_cast<size_t>(n_ctx * c.hd), seed + 2 * g, -2, 2), n_ctx, c.hd, 16, dt));
    r.v.push_back(make_paged(random_vec(static_cast<size_t>(n_ctx * c.hd), seed + 2 * g + 1), n_ctx, c.hd, 16, dt));
    for (int64_t j = 0; j < n_ctx; ++j) {
      load_row(r.k.back().view, j, c.hd, &r.k_f32[j * kvd + g * c.hd]);
      load_row(r.v.back().view, j, c.hd, &r.v_f32[j * kvd + g * c.hd]);
    }
  }
  return r;
}

// The decode kernel's output for query row q (all heads) at position p: [heads * hd].
std::vector<float> decode_one(const GqaCase& c, const KvRows& kv, const float* q, int64_t p) {
  const int64_t G = c.heads / c.kv_heads, n_ctx = p + 1;
  const int64_t j0 = c.window > 0 && n_ctx > c.window ? n_ctx - c.window : 0;
  std::vector<float> out(static_cast<size_t>(c.heads * c.hd));
  ScratchSlot scratch;
  for (int64_t g = 0; g < c.kv_heads; ++g)
    gqa_decode_attend(q + g * G * c.hd, G, kv.k[g].view, kv.v[g].view, j0, n_ctx,
                      1.0f / std::sqrt(static_cast<float>(c.hd)), &out[g * G * c.hd], scratch);
  return out;
}

const GqaCase kGqaCases[] = {
    {8, 2, 64, 0},   // G = 4
    {3, 3, 16, 0},   // G = 1, one 16-value chunk
    {6, 2, 80, 0},   // G = 3 (register tiles straddle tokens), head_dim not a multiple of 32
    {4, 1, 128, 0},  // bench-model head_dim
    {4, 2, 32, 21},  // sliding window, not a multiple of 16
};

TEST(AttentionInvariance, PrefillRunRowsEqualTheDecodeKernel) {
  if (!causal_attention_blocked(64))
    GTEST_SKIP() << "no blocked prefill kernel on this CPU (every token decodes alone)";
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  const int64_t max_ctx = 140;
  uint32_t seed = 100;
  for (const GqaCase& c : kGqaCases) {
    const int64_t qd = c.heads * c.hd, kvd = c.kv_heads * c.hd;
    const auto q = random_vec(static_cast<size_t>(max_ctx * qd), seed += 10, -2, 2);
    for (DType dt : {DType::f32, DType::bf16, DType::f8_e4m3}) {
      const KvRows kv = make_kv_rows(c, max_ctx, dt, seed + 1);
      std::vector<std::vector<float>> want;
      for (int64_t p = 0; p < max_ctx; ++p) want.push_back(decode_one(c, kv, &q[p * qd], p));
      const CausalAttnShape s{c.heads, c.kv_heads, c.hd, c.window};
      for (int64_t p0 : {0, 1, 15, 16, 17, 47, 63, 64, 65, 99}) {
        for (int64_t nq = 1; nq <= 40 && p0 + nq <= max_ctx; ++nq) {
          // Every other run length on the later starts keeps the test short.
          if (p0 > 17 && nq > 4 && nq % 3 != 0 && nq != 40) continue;
          for (size_t pi = 0; pi <= pools.size(); ++pi) {
            ThreadPool* pool = pi < pools.size() ? pools[pi].get() : nullptr;
            std::vector<float> out(static_cast<size_t>(nq * qd), -7.0f);
            causal_attention(&q[p0 * qd], qd, nq, p0, kv.k_f32.data(), kv.v_f32.data(), kvd, s,
                             1.0f / std::sqrt(static_cast<float>(c.hd)), out.data(), qd, pool, test_scratch(),
                             CausalOrder::decode);
            for (int64_t i = 0; i < nq; ++i)
              ASSERT_TRUE(same_bits(&out[i * qd], want[p0 + i].data(), qd))
                  << "position " << p0 + i << " in a run of " << nq << " from " << p0 << ", " << dtype_name(dt)
                  << " heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " window " << c.window << " pool "
                  << (pool != nullptr ? pool->size() : 0);
          }
        }
      }
    }
  }
}

TEST(AttentionInvariance, GqaDecodeHeadsDoNotDependOnTheirGroup) {
  const int64_t hd = 64, heads = 5;
  for (Isa isa : isa_levels()) {
    IsaLimitGuard guard(isa);
    for (DType dt : {DType::f32, DType::bf16, DType::f8_e4m3}) {
      for (int64_t n_ctx : {1, 15, 16, 17, 64, 65, 130}) {
        for (int64_t j0 : {int64_t{0}, n_ctx / 3}) {
          const auto q = random_vec(static_cast<size_t>(heads * hd), 5, -2, 2);
          Paged k = make_paged(random_vec(static_cast<size_t>(n_ctx * hd), 6, -2, 2), n_ctx, hd, 16, dt);
          Paged v = make_paged(random_vec(static_cast<size_t>(n_ctx * hd), 7), n_ctx, hd, 16, dt);
          ScratchSlot scratch;
          std::vector<float> all(q.size()), one(static_cast<size_t>(hd));
          gqa_decode_attend(q.data(), heads, k.view, v.view, j0, n_ctx, 0.125f, all.data(), scratch);
          for (int64_t h = 0; h < heads; ++h) {
            gqa_decode_attend(&q[h * hd], 1, k.view, v.view, j0, n_ctx, 0.125f, one.data(), scratch);
            ASSERT_TRUE(same_bits(one.data(), &all[h * hd], hd))
                << isa_name(isa) << " " << dtype_name(dt) << " ctx " << n_ctx << " j0 " << j0 << " head " << h;
          }
        }
      }
    }
  }
}

TEST(AttentionInvariance, MqaDecodeHeadsDoNotDependOnTheirGroup) {
  // Absorbed-MLA shape (values = the first d_lat key values) and MFA shape (separate V rows).
  struct Shape {
    int64_t D, v_dim;
    bool separate_v;
  };
  const int64_t heads = 40;
  for (const Shape& sh : {Shape{80, 64, false}, Shape{64, 64, true}}) {
    for (Isa isa : isa_levels()) {
      IsaLimitGuard guard(isa);
      for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3}) {
        for (int64_t n_ctx : {int64_t{1}, int64_t{63}, int64_t{129}, kMqaSegment, kMqaSegment + 7}) {
          const auto q = random_vec(static_cast<size_t>(heads * sh.D), 8, -2, 2);
          Paged k = make_paged(random_vec(static_cast<size_t>(n_ctx * sh.D), 9, -2, 2), n_ctx, sh.D, 16, dt);
          Paged v = make_paged(random_vec(static_cast<size_t>(n_ctx * sh.v_dim), 10), n_ctx, sh.v_dim, 16, dt);
          const PagedRows* vp = sh.separate_v ? &v.view : nullptr;
          std::vector<float> all(static_cast<size_t>(heads * sh.v_dim));
          mqa_decode_attend(q.data(), sh.D, heads, k.view, vp, sh.v_dim, n_ctx, 0.1f, all.data(), sh.v_dim,
                            test_scratch().slot(0));
          // Groups of 1, 8, 32 and 33 heads (MqaDecodeRunner's callers use multiples of 32, and
          // everything below 32 for small models).
          for (int64_t hg : {1, 8, 32, 33}) {
            std::vector<float> got(all.size(), -7.0f);
            for (int64_t h0 = 0; h0 < heads; h0 += hg) {
              const int64_t nh = std::min(hg, heads - h0);
              mqa_decode_attend(&q[h0 * sh.D], sh.D, nh, k.view, vp, sh.v_dim, n_ctx, 0.1f, &got[h0 * sh.v_dim],
                                sh.v_dim, test_scratch().slot(0));
            }
            ASSERT_TRUE(same_bits(got.data(), all.data(), heads * sh.v_dim))
                << isa_name(isa) << " path " << mla_decode_path_name(dt) << " " << dtype_name(dt) << " ctx " << n_ctx
                << " group " << hg << " D " << sh.D;
          }
        }
      }
    }
  }
}

TEST(AttentionInvariance, MqaDecodeRowEndsGiveEachRowItsOwnBits) {
  // A run of m tokens with `heads` query heads each, stacked: row h belongs to token h / heads,
  // which sees positions [0, n_last - m + 1 + h / heads). Shapes: the default model's absorbed MLA
  // (latent 64 + rope 32) and MFA (separate V rows).
  struct Shape {
    int64_t D, v_dim;
    bool separate_v;
  };
  for (const Shape& sh : {Shape{96, 64, false}, Shape{64, 64, true}}) {
    for (Isa isa : isa_levels()) {
      IsaLimitGuard guard(isa);
      for (DType dt : {DType::bf16, DType::f32, DType::f8_e4m3}) {
        for (int64_t heads : {4, 5}) {
          for (int64_t m : {2, 5, 9}) {
            for (int64_t n_last : {m, int64_t{64}, int64_t{66}, int64_t{129}, int64_t{133}, kMqaSegment + m + 2}) {
              const int64_t rows = m * heads;
              const auto q = random_vec(static_cast<size_t>(rows * sh.D), 11, -2, 2);
              Paged k = make_paged(random_vec(static_cast<size_t>(n_last * sh.D), 12, -2, 2), n_last, sh.D, 16, dt);
              Paged v = make_paged(random_vec(static_cast<size_t>(n_last * sh.v_dim), 13), n_last, sh.v_dim, 16, dt);
              const PagedRows* vp = sh.separate_v ? &v.view : nullptr;
              std::vector<int64_t> ends(static_cast<size_t>(rows));
              for (int64_t h = 0; h < rows; ++h) ends[h] = n_last - m + 1 + h / heads;
              std::vector<float> all(static_cast<size_t>(rows * sh.v_dim), -7.0f), one(static_cast<size_t>(sh.v_dim));
              mqa_decode_attend(q.data(), sh.D, rows, k.view, vp, sh.v_dim, n_last, 0.1f, all.data(), sh.v_dim,
                                test_scratch().slot(0), ends.data());
              for (int64_t h = 0; h < rows; ++h) {
                mqa_decode_attend(&q[h * sh.D], sh.D, 1, k.view, vp, sh.v_dim, ends[h], 0.1f, one.data(), sh.v_dim,
                                  test_scratch().slot(0));
                ASSERT_TRUE(same_bits(one.data(), &all[h * sh.v_dim], sh.v_dim))
                    << isa_name(isa) << " path " << mla_decode_path_name(dt) << " " << dtype_name(dt) << " heads "
                    << heads << " run " << m << " last ctx " << n_last << " row " << h << " D " << sh.D;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace afd::kernels
