// ModelWeights: typed views of a checkpoint's tensors, bound by name and checked against
// ModelConfig. Views (model/matrix.h) point into the memory-mapped safetensors files: bf16 /
// f32 in place, FP8 block-quantized e4m3 in place with its float32 scales (never widened);
// f16 tensors (and misaligned data or non-f32 scales) are converted once at load into owned
// f32 storage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"
#include "model/matrix.h"

namespace afd {

class Checkpoint;  // model/checkpoint.h

// A vector [n] (norm weights, biases); always f32, owned by ModelWeights.
struct Vector {
  const float* data = nullptr;
  int64_t n = 0;
  bool empty() const { return data == nullptr; }
};

// One SwiGLU FFN: down( silu(gate x) * up x ).
// gate/up [inter, hidden], down [hidden, inter]. For fused checkpoints, gate and up are
// views of rows [0, inter) and [inter, 2*inter) of gate_up_proj[e].
struct FfnWeights {
  Matrix gate, up, down;
  bool empty() const { return gate.empty(); }
};

struct AttentionWeights {
  // q [q_dim, hidden], or [q_dim, q_lora_rank] when the query is low-rank (then it is MLA's
  // q_b_proj / MFA's wq, applied after q_a and q_a_norm).
  Matrix q;
  Matrix k, v;           // gqa: [kv_dim, hidden] each; empty for mla
  Matrix o;              // [hidden, o_in_dim]
  Vector q_bias, k_bias, v_bias;  // qwen2_moe only
  Vector q_norm, k_norm;          // [head_dim], qwen3_moe only
  // Low-rank query (q_lora_rank > 0): q_a [q_lora_rank, hidden] (MLA q_a_proj, MFA q_proj),
  // q_a_norm [q_lora_rank] (MLA q_a_layernorm, MFA inter_norm).
  Matrix q_a;
  Vector q_a_norm;
  // MLA: kv_a [kv_lora_rank + qk_rope_head_dim, hidden] (kv_a_proj_with_mqa: latent, then the
  // pre-RoPE shared rope key), kv_a_norm [kv_lora_rank], kv_b [n_heads*(qk_nope+v_head_dim),
  // kv_lora_rank] (per head: qk_nope rows of W_UK, then v_head_dim rows of W_UV).
  Matrix kv_a;
  Vector kv_a_norm;
  Matrix kv_b;
};

struct MoeWeights {
  Matrix router;                    // [n_experts, hidden]  (mlp.gate.weight)
  std::vector<FfnWeights> experts;  // n_experts
  FfnWeights shared;                // empty when no shared expert
  Matrix shared_gate;               // [1, hidden], sigmoid gate of the shared expert (may be empty)
  Vector score_bias;                // [n_experts] e_score_correction_bias (noaux_tc), else empty
};

struct LayerWeights {
  Vector input_norm;          // [hidden]
  Vector post_attention_norm; // [hidden]
  AttentionWeights attn;
  bool is_moe = true;
  MoeWeights moe;             // when is_moe
  FfnWeights dense;           // when !is_moe
};

struct ModelWeights {
  ModelConfig config;
  Matrix embed;               // [vocab, hidden]
  Matrix lm_head;             // [vocab, hidden]; equals embed when tied
  Vector final_norm;          // [hidden]
  std::vector<LayerWeights> layers;

  // Calls fn on every non-empty weight matrix: embed, lm_head (the same view twice when tied),
  // per layer the attention projections, then the router, experts, shared expert and its gate
  // (MoE layers) or the dense FFN.
  void for_each_matrix(const std::function<void(const Matrix&)>& fn) const;
  // Total bytes of all weight matrices, FP8 block scales included (what a full pass could read).
  size_t matrix_bytes() const;

  // Keeps mmaps and converted buffers alive.
  std::shared_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<float[]>> owned_f32;
  // A derived view (e.g. a tensor-parallel slice, model/ffn_part.h slice_ffn_tp) keeps the
  // model it points into alive, and owns the bytes it had to copy (down-projection slices).
  std::shared_ptr<const ModelWeights> base;
  std::vector<std::unique_ptr<uint8_t[]>> owned_bytes;
};

// Expert re-homing (an FFN worker taking over experts outside its start-up shard): every
// expert's weights are views into the checkpoint's mmap, so holding more experts needs no
// load step; this asks the kernel to read the FFN weights of the routed experts with
// experts[e] != 0 (and of the shared expert / dense MLPs when `shared`) ahead of their first
// use (madvise WILLNEED on their pages). Empty views are skipped. Returns the bytes covered.
size_t prefetch_ffn_weights(const ModelWeights& w, const std::vector<uint8_t>& experts, bool shared);

// DeepSeek's multi-token-prediction module m (MODELS.md B7), the tensors under
// model.layers.(n_layers + m).*, as a one-layer model plus its input projection:
//   u = eh_proj([rmsnorm(embed(t[i+1]), enorm); rmsnorm(h[i], hnorm)])   (embedding half first)
//   z = block's layer 0 at position i over u; logits = block's lm_head(rmsnorm(z, final_norm))
// predict t[i+2], h[i] being the main model's final-normed hidden state at position i.
struct MtpModule {
  // embed = the module's embed_tokens, layers[0] = its decoder layer, final_norm =
  // shared_head.norm, lm_head = shared_head.head; embed / lm_head are the main model's when
  // the checkpoint leaves the module's out. config = the main model's with n_layers 1 (layer 0
  // MoE exactly when the module's layer is) and no MTP layers. Keeps `main` alive.
  std::shared_ptr<const ModelWeights> block;
  Vector enorm, hnorm;  // [hidden], owned by block
  Matrix eh_proj;       // [hidden, 2*hidden]
};

// Binds MTP module m of a loaded DeepSeek model (errors: not DeepSeek, m outside
// [0, num_nextn_predict_layers), a missing or misshapen tensor, named; a missing
// embed_tokens / shared_head.head is the main model's embedding / LM head).
Result<MtpModule> load_mtp_module(std::shared_ptr<const ModelWeights> main, int64_t m);

// Loads DIR (config.json + safetensors, single or sharded). Every expected tensor must be
// present with the shape config.json implies; errors name the file, tensor and field.
Result<std::shared_ptr<const ModelWeights>> load_model(const std::string& model_dir);

}  // namespace afd
