#include "model/attention_variant.h"

#include "core/check.h"

namespace afd {

KvLayout kv_layout(const ModelConfig& c) {
  if (c.attention == AttentionKind::mla) return KvLayout{1, c.kv_lora_rank + c.qk_rope_head_dim, 0};
  return KvLayout{c.n_kv_heads, c.head_dim, c.head_dim};
}

kernels::PagedRows paged_rows(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t head, bool values,
                              std::vector<const uint8_t*>* blocks, std::vector<const float*>* scales) {
  const size_t n = kv.block_table(seq).size();
  blocks->resize(n);
  scales->resize(kv.config().dtype == DType::f8_e4m3 ? n : 0);
  return paged_rows(kv, layer, seq, head, values, blocks->data(), scales->data());
}

kernels::PagedRows paged_rows(const PagedKvCache& kv, int64_t layer, int64_t seq, int64_t head, bool values,
                              const uint8_t** blocks, const float** scales) {
  const auto& table = kv.block_table(seq);
  const KvCacheConfig& kc = kv.config();
  const bool fp8 = kc.dtype == DType::f8_e4m3;
  for (size_t j = 0; j < table.size(); ++j) {
    blocks[j] = values ? kv.v_head(layer, table[j], head) : kv.k_head(layer, table[j], head);
    if (fp8) scales[j] = values ? kv.v_scales(layer, table[j], head) : kv.k_scales(layer, table[j], head);
  }
  return kernels::PagedRows{blocks, fp8 ? scales : nullptr, kc.block_size, kc.head_dim, kc.dtype};
}

void MqaDecodeRunner::run(ThreadPool& pool, ScratchArena& scratch, const std::vector<MqaItem>& items, float scale) {
  AFD_CHECK(scratch.size() >= pool.size(), "MqaDecodeRunner: fewer scratch slots than pool threads");
  const int64_t n = static_cast<int64_t>(items.size());
  int64_t total_segments = 0;
  for (const MqaItem& it : items) total_segments += kernels::mqa_decode_segments(it.n_ctx);
  if (n >= pool.size() || total_segments == n) {
    pool.run(static_cast<int>(n), [&](int i, int thread) {
      const MqaItem& it = items[i];
      kernels::mqa_decode_attend(it.q, it.q_stride, it.n_heads, *it.k, it.v, it.v_dim, it.n_ctx, scale, it.out,
                                 it.out_stride, scratch.slot(thread), it.row_ctx);
    });
    return;
  }
  // Segment task t (of item seg_item_[t]) writes parts_[t]: o [n_heads][v_dim] in o_, m and l
  // in ml_; item i's segments are tasks first_seg_[i] .. first_seg_[i + 1] - 1, in order.
  seg_item_.clear();
  seg_index_.clear();
  first_seg_.resize(static_cast<size_t>(n + 1));
  int64_t o_size = 0, ml_size = 0;
  for (int64_t i = 0; i < n; ++i) {
    first_seg_[i] = static_cast<int64_t>(seg_item_.size());
    const int64_t ns = kernels::mqa_decode_segments(items[i].n_ctx);
    for (int64_t s = 0; s < ns; ++s) {
      seg_item_.push_back(i);
      seg_index_.push_back(s);
    }
    o_size += ns * items[i].n_heads * items[i].v_dim;
    ml_size += 2 * ns * items[i].n_heads;
  }
  const int64_t n_tasks = static_cast<int64_t>(seg_item_.size());
  first_seg_[n] = n_tasks;
  o_.resize(static_cast<size_t>(o_size));
  ml_.resize(static_cast<size_t>(ml_size));
  parts_.resize(static_cast<size_t>(n_tasks));
  int64_t oo = 0, mo = 0;
  for (int64_t t = 0; t < n_tasks; ++t) {
    const MqaItem& it = items[seg_item_[t]];
    parts_[t] = kernels::MqaPartial{&o_[oo], it.v_dim, &ml_[mo], &ml_[mo + it.n_heads]};
    oo += it.n_heads * it.v_dim;
    mo += 2 * it.n_heads;
  }
  pool.run(static_cast<int>(n_tasks), [&](int t, int thread) {
    const MqaItem& it = items[seg_item_[t]];
    kernels::mqa_decode_segment(it.q, it.q_stride, it.n_heads, *it.k, it.v, it.v_dim, it.n_ctx, seg_index_[t], scale,
                                parts_[t], scratch.slot(thread), it.row_ctx);
  });
  pool.run(static_cast<int>(n), [&](int i, int thread) {
    const MqaItem& it = items[i];
    kernels::mqa_decode_combine(it.n_heads, it.v_dim, &parts_[first_seg_[i]], first_seg_[i + 1] - first_seg_[i], it.out,
                                it.out_stride, scratch.slot(thread));
  });
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
