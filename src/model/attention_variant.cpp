#include "model/attention_variant.h"

namespace afd {

KvLayout kv_layout(const ModelConfig& c) {
  if (c.attention == AttentionKind::mla) return KvLayout{1, c.kv_lora_rank + c.qk_rope_head_dim, 0};
  return KvLayout{c.n_kv_heads, c.head_dim, c.head_dim};
}

kernels::PagedRows paged_rows(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t head, bool values,
                              std::vector<const uint8_t*>* blocks, std::vector<const float*>* scales) {
  const auto& table = kv.block_table(seq);
  const KvCacheConfig& kc = kv.config();
  const bool fp8 = kc.dtype == DType::f8_e4m3;
  blocks->resize(table.size());
  scales->resize(fp8 ? table.size() : 0);
  for (size_t j = 0; j < table.size(); ++j) {
    (*blocks)[j] = values ? kv.v_head(layer, table[j], head) : kv.k_head(layer, table[j], head);
    if (fp8) (*scales)[j] = values ? kv.v_scales(layer, table[j], head) : kv.k_scales(layer, table[j], head);
  }
  return kernels::PagedRows{blocks->data(), fp8 ? scales->data() : nullptr, kc.block_size, kc.head_dim, kc.dtype};
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
