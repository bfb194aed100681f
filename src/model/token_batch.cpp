#include "model/token_batch.h"

#include <algorithm>

namespace afd {

void TokenBatch::resize(const ModelConfig& c, int64_t n_tokens) {
  n = n_tokens;
  const size_t nn = static_cast<size_t>(n_tokens);
  tokens.resize(nn);
  seq.resize(nn);
  pos.resize(nn);
  x.resize(nn * c.hidden_size);
  h.resize(nn * c.hidden_size);
  const int64_t top_k = std::max<int64_t>(1, c.n_experts_per_tok);
  topk_ids.resize(nn * top_k);
  topk_w.resize(nn * top_k);
  ffn_out.resize(nn * c.hidden_size);
  hn.resize(nn * c.hidden_size);
  q.resize(nn * c.q_dim());
  if (c.attention == AttentionKind::mla) {
    // k: the cache row of each token (latent, then the rope key); v unused.
    k.resize(nn * (c.kv_lora_rank + c.qk_rope_head_dim));
    v.clear();
  } else {
    k.resize(nn * c.kv_dim());
    v.resize(nn * c.kv_dim());
  }
  attn.resize(nn * c.o_in_dim());
  router.resize(nn * std::max<int64_t>(1, c.n_experts));
}

}  // namespace afd
