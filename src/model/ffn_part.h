// The FFN half of a decoder layer: what an FFN worker computes. Stateless.
//
// Contract (the unit that crosses the A->F wire): for n tokens of one layer,
//   h       [n, hidden]  the post-attention RMSNorm output (normalised hidden states)
//   ids     [n, top_k]   routed expert ids (int32), empty for dense layers
//   weights [n, top_k]   routing weights (f32), empty for dense layers
// ffn_part returns out [n, hidden] = sum_j weights[i,j] * expert_{ids[i,j]}(h[i])
//   (+ shared expert: gated by sigmoid(shared_gate . h) when the model has that gate
//    (qwen2_moe), added unweighted otherwise (DeepSeek shared_experts, Step-3 share_expert))
// restricted to the experts in `experts_mask` when given (expert parallelism: each FFN
// worker returns a partial sum over the experts it holds; the attention side adds them).
//
// Tensor parallelism: with weights from slice_ffn_tp (rank r of t), every SwiGLU FFN holds
// only rows [r*I/t, (r+1)*I/t) of gate/up and the same columns of down, so ffn_part returns
// the rank's partial down-projection. SwiGLU is elementwise in I, so the sum over the t
// ranks is the full output (exact in real arithmetic); the shared expert's sigmoid gate is
// a per-token scalar applied to each partial (linear, so also exact).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/scratch_arena.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"
#include "model/weights.h"

namespace afd {

struct FfnPartOptions {
  kernels::ActPrecision prec = kernels::ActPrecision::f32;
  // batch_invariant: every product in the canonical order (kernels/cpu/ops.h LinearOrder), so a
  // token's result does not depend on how many tokens an expert gets (--deterministic).
  kernels::LinearOrder order = kernels::LinearOrder::fastest;
  // When non-empty, experts_mask[e] says whether this worker computes expert e.
  std::vector<uint8_t> experts_mask;
  bool include_shared = true;  // this worker computes the shared expert / dense MLP
};

// Scratch reused across calls (not thread-safe; one per worker thread).
struct FfnScratch {
  std::vector<float> buf;
  std::vector<int32_t> idx, idx_pos;
  // Expert-parallel mode: one buffer per pool thread, then the experts' output rows.
  std::vector<std::vector<float>> per_thread;
  // The matrix products' working memory (kernels::linear): `arena` has a slot per thread of the
  // pool ffn_part is given (grown to its size on use), for products spread over the pool;
  // task_arenas[t], one slot each, for the products a task on pool thread t runs alone
  // (expert-parallel mode).
  ScratchArena arena;
  std::vector<ScratchArena> task_arenas;
};

// What one tensor-parallel FFN worker holds (runtime/topology.h): TP rank `rank` of
// `degree` of the routed experts [expert_begin, expert_end) and, when include_shared, of the
// shared expert and the dense layers.
struct FfnTpSlice {
  int rank = 0;
  int degree = 1;
  int64_t expert_begin = 0;
  int64_t expert_end = -1;  // < 0: every expert
  bool include_shared = true;
};

// invalid_argument naming the config field (moe_intermediate_size,
// shared_expert_intermediate_size, intermediate_size) when a layer's FFN intermediate size is
// not divisible by `degree`, or when degree is outside [1, 64].
Status check_ffn_tp_degree(const ModelWeights& w, int degree);

// A copy of w's views in which every held FFN is TP-sliced: gate/up are views of their rows
// [r*I/t, (r+1)*I/t) (contiguous in the row-major [I, hidden] matrix: an offset pointer), down
// [hidden, I/t] is a copy of the matching columns into memory the result owns (columns of a
// row-major [hidden, I] matrix are not contiguous) — made once, here. FP8 block-quantized
// weights whose slice does not start on a 128-column block keep the block-aligned superset of
// rows/columns, with the down columns of other ranks zeroed (exactly the same output). Routed experts outside
// the held range, and the shared expert / dense layers when !include_shared, are left empty
// (ffn_part must not be asked for them: mask them out). Attention, router, embedding and norm
// views are shared unchanged. The result keeps `w` alive. degree 1 returns `w` itself.
Result<std::shared_ptr<const ModelWeights>> slice_ffn_tp(std::shared_ptr<const ModelWeights> w, const FfnTpSlice& s);

// out [n, hidden] is overwritten.
void ffn_part(const ModelWeights& w, int64_t layer, const float* h, int64_t n, const int32_t* ids,
              const float* weights, float* out, const FfnPartOptions& opt, FfnScratch* scratch,
              ThreadPool* pool);

// Expert placement (docs/PROTOCOL.md): routed expert `expert` of MoE layer `layer` on m
// gathered tokens, each pair its own result: out [m, hidden] row i = weights[i] *
// expert(h[i]) (overwritten). Under a batch-invariant order (opt.order) row i depends on h[i]
// alone. opt.experts_mask and include_shared are not read.
void ffn_expert_rows(const ModelWeights& w, int64_t layer, int64_t expert, const float* h, int64_t m,
                     const float* weights, float* out, const FfnPartOptions& opt, FfnScratch* scratch,
                     ThreadPool* pool);

}  // namespace afd
