// TokenBatch: the activations of one (micro-)batch of tokens as it moves through the
// layers. The attention side owns it; only h / topk_ids / topk_w go to the FFN side and
// only ffn_out comes back (see ffn_part.h for that contract).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace afd {

struct TokenBatch {
  int64_t n = 0;                  // tokens in the batch
  std::vector<int32_t> tokens;    // [n]
  std::vector<int64_t> seq;       // [n] KV-cache sequence id of each token
  std::vector<int64_t> pos;       // [n] position of each token in its sequence
  std::vector<float> x;           // [n, hidden] residual stream
  std::vector<float> h;           // [n, hidden] FFN input: post-attention RMSNorm of x
  std::vector<int32_t> topk_ids;  // [n, top_k] routed experts (MoE layers)
  std::vector<float> topk_w;      // [n, top_k] routing weights
  std::vector<float> ffn_out;     // [n, hidden] FFN result for the current layer

  // Attention-side scratch.
  std::vector<float> hn;          // [n, hidden]
  std::vector<float> q;           // [n, q_dim]
  std::vector<float> k, v;        // [n, kv_dim]; mla: k [n, kv_lora_rank + qk_rope_head_dim], v empty
  std::vector<float> attn;        // [n, o_in_dim] attention output (o_proj input)
  std::vector<float> router;      // [n, n_experts]

  // Sizes every buffer for n tokens; tokens/seq/pos must be filled by the caller.
  void resize(const ModelConfig& c, int64_t n_tokens);
};

}  // namespace afd
