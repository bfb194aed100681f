// The FFN half of a decoder layer: what an FFN worker computes. Stateless.
//
// Contract (the unit that crosses the A->F wire): for n tokens of one layer,
//   h       [n, hidden]  the post-attention RMSNorm output (normalised hidden states)
//   ids     [n, top_k]   routed expert ids (int32), empty for dense layers
//   weights [n, top_k]   routing weights (f32), empty for dense layers
// ffn_part returns out [n, hidden] = sum_j weights[i,j] * expert_{ids[i,j]}(h[i])
//   (+ shared expert, gated by sigmoid(shared_gate . h), when the model has one)
// restricted to the experts in `experts_mask` when given (expert parallelism: each FFN
// worker returns a partial sum over the experts it holds; the attention side adds them).
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"
#include "model/weights.h"

namespace afd {

struct FfnPartOptions {
  kernels::ActPrecision prec = kernels::ActPrecision::f32;
  // When non-empty, experts_mask[e] says whether this worker computes expert e.
  std::vector<uint8_t> experts_mask;
  bool include_shared = true;  // this worker computes the shared expert / dense MLP
};

// Scratch reused across calls (not thread-safe; one per worker thread).
struct FfnScratch {
  std::vector<float> buf;
  std::vector<int32_t> idx;
};

// out [n, hidden] is overwritten.
void ffn_part(const ModelWeights& w, int64_t layer, const float* h, int64_t n, const int32_t* ids,
              const float* weights, float* out, const FfnPartOptions& opt, FfnScratch* scratch,
              ThreadPool* pool);

}  // namespace afd
