#include "model/attention_variant.h"

namespace afd {

KvLayout kv_layout(const ModelConfig& c) {
  if (c.attention == AttentionKind::mla) return KvLayout{1, c.kv_lora_rank + c.qk_rope_head_dim, 0};
  return KvLayout{c.n_kv_heads, c.head_dim, c.head_dim};
}

std::unique_ptr<AttentionVariant> make_attention_variant(std::shared_ptr<const ModelWeights> w, PagedKvCache* kv,
                                                         AttentionOptions opt, ThreadPool* pool) {
  switch (w->config.attention) {
    case AttentionKind::gqa: return make_gqa_attention(std::move(w), kv, opt, pool);
    case AttentionKind::mla: return make_mla_attention(std::move(w), kv, opt, pool);
  }
  return nullptr;
}

}  // namespace afd
