#include "model/fingerprint.h"

#include <algorithm>
#include <string>

#include "core/hash.h"
#include "model/checkpoint.h"

namespace afd {

namespace {

struct Hasher {
  uint64_t h = 0x736f6d6570736575ull;
  template <class T>
  void add(const T& v) { h = hash64(&v, sizeof v, h); }
  void add_str(const std::string& s) { h = hash64(s.data(), s.size(), h ^ s.size()); }
  void add_matrix(int64_t path, const Matrix& m) {
    add(path);
    add(static_cast<uint8_t>(m.dtype));
    add(m.rows);
    add(m.cols);
  }
};

void add_config(Hasher& h, const ModelConfig& c) {
  h.add(static_cast<int>(c.arch));
  for (int64_t v : {c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.n_experts,
                    c.n_experts_per_tok, c.moe_intermediate_size, c.intermediate_size,
                    c.shared_expert_intermediate_size, c.decoder_sparse_step}) {
    h.add(v);
  }
  for (int64_t v : c.mlp_only_layers) h.add(v);
  h.add(c.norm_topk_prob);
  h.add(c.tie_word_embeddings);
  h.add(c.rope_theta);
  h.add(c.rms_norm_eps);
  // Attention variants, routing variants and layer rules (DeepSeek, Step-3).
  h.add(static_cast<int>(c.attention));
  for (int64_t v : {c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.n_group,
                    c.topk_group, c.n_shared_experts, c.first_k_dense_replace, c.moe_layer_freq}) {
    h.add(v);
  }
  for (int64_t v : c.moe_layers) h.add(v);
  h.add(c.rope_interleave);
  h.add(static_cast<int>(c.rope_scaling.type));
  for (double v : {c.rope_scaling.factor, c.rope_scaling.beta_fast, c.rope_scaling.beta_slow, c.rope_scaling.mscale,
                   c.rope_scaling.mscale_all_dim}) {
    h.add(v);
  }
  h.add(c.rope_scaling.original_max_position_embeddings);
  h.add(static_cast<int>(c.scoring));
  h.add(static_cast<int>(c.topk_method));
  h.add(c.routed_scaling_factor);
  h.add(c.has_score_bias);
  h.add(c.shared_expert_ungated);
  h.add(static_cast<int>(c.weight_quant));
}

}  // namespace

uint64_t model_config_fingerprint(const ModelConfig& c) {
  Hasher h;
  add_config(h, c);
  return h.h;
}

uint64_t model_fingerprint(const ModelWeights& w) {
  Hasher h;
  add_config(h, w.config);
  // Matrix "paths": layer * 2^20 + part code (+ expert index); stable across processes.
  int64_t path = 0;
  h.add_matrix(path++, w.embed);
  h.add_matrix(path++, w.lm_head);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    int64_t base = static_cast<int64_t>(l + 1) << 20;
    h.add_matrix(base + 1, L.attn.q);
    h.add_matrix(base + 2, L.attn.k);
    h.add_matrix(base + 3, L.attn.v);
    h.add_matrix(base + 4, L.attn.o);
    // Low-rank query and MLA projections (empty, and skipped, for plain GQA).
    if (!L.attn.q_a.empty()) h.add_matrix(base + 13, L.attn.q_a);
    if (!L.attn.kv_a.empty()) h.add_matrix(base + 14, L.attn.kv_a);
    if (!L.attn.kv_b.empty()) h.add_matrix(base + 15, L.attn.kv_b);
    h.add(L.is_moe);
    if (L.is_moe) {
      h.add_matrix(base + 5, L.moe.router);
      for (size_t e = 0; e < L.moe.experts.size(); ++e) {
        int64_t eb = base + 16 + static_cast<int64_t>(e) * 4;
        h.add_matrix(eb, L.moe.experts[e].gate);
        h.add_matrix(eb + 1, L.moe.experts[e].up);
        h.add_matrix(eb + 2, L.moe.experts[e].down);
      }
      h.add_matrix(base + 6, L.moe.shared.gate);
      h.add_matrix(base + 7, L.moe.shared.up);
      h.add_matrix(base + 8, L.moe.shared.down);
      h.add_matrix(base + 9, L.moe.shared_gate);
    } else {
      h.add_matrix(base + 10, L.dense.gate);
      h.add_matrix(base + 11, L.dense.up);
      h.add_matrix(base + 12, L.dense.down);
    }
  }
  // A sample of the values: 16 bytes from the middle of every tensor of the checkpoint (by
  // name, in name order), as stored on disk — so two sides that convert weights differently
  // still agree, while two checkpoints of one architecture (another seed, another fine-tune)
  // do not. One page per tensor is read (the processes map them anyway).
  if (w.checkpoint) {
    for (const std::string& name : w.checkpoint->tensor_names()) {
      const TensorRef* t = w.checkpoint->find(name);
      if (t == nullptr || t->info == nullptr || t->data == nullptr) continue;
      const size_t n = t->info->nbytes(), take = std::min<size_t>(n, 16);
      h.add_str(name);
      h.h = hash64(t->data + (n - take) / 2, take, h.h);
    }
  }
  return h.h;
}

}  // namespace afd
