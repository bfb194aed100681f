// load_model: binds a checkpoint's tensors by their Hugging Face names into ModelWeights.
//
// Names (i = layer, j = expert):
//   model.embed_tokens.weight [V, H]    model.norm.weight [H]    lm_head.weight [V, H] (untied)
//   model.layers.i.input_layernorm.weight / post_attention_layernorm.weight [H]
//   model.layers.i.self_attn.{q,k,v,o}_proj.weight, {q,k,v}_proj.bias (qwen2_moe),
//                            q_norm.weight / k_norm.weight [head_dim] (qwen3_moe)
//   MoE layer, qwen:    mlp.gate.weight [E, H]; per expert mlp.experts.j.{gate,up,down}_proj.weight
//                       or fused mlp.experts.gate_up_proj [E, 2I, H] + mlp.experts.down_proj [E, H, I];
//                       qwen2_moe: mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight [1, H]
//   MoE layer, mixtral: block_sparse_moe.gate.weight; block_sparse_moe.experts.j.w1 (gate) / w3 (up) / w2 (down),
//                       or the fused pair under block_sparse_moe.experts.* or mlp.experts.* (router beside it)
//   dense layer:        mlp.{gate,up,down}_proj.weight with intermediate_size
//   DeepSeek (MLA):     self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
//                       kv_a_layernorm, kv_b_proj, o_proj}; MoE mlp.gate.weight,
//                       mlp.gate.e_score_correction_bias (noaux_tc), mlp.experts.j.*, mlp.shared_experts.*
//   Step-3 (MFA):       self_attn.{q_proj, inter_norm, wq, k_proj, v_proj, o_proj}; MoE moe.gate.weight,
//                       stacked moe.{gate,up,down}_proj.weight [E, ., .], share_expert.*
// Tensors the model does not use (e.g. rotary inv_freq, vision tower, DeepSeek MTP layers
// model.layers.N for N >= num_hidden_layers) are ignored.
//
// FP8 block quantization (config.json quantization_config, model/config.h): any matrix above
// may be stored as F8_E4M3 with a float32 partner `<name>_scale_inv` (`X.weight` ->
// `X.weight_scale_inv`, as DeepSeek-V3 / HF write it; the fused `experts.gate_up_proj` ->
// `experts.gate_up_proj_scale_inv`, afd's spelling) of shape [ceil(rows/128), ceil(cols/128)]
// (3-D fused expert tensors: [E, ceil(rows/128), ceil(cols/128)]). The e4m3 bytes are used in
// place; a BF16/F16 scale tensor is widened to owned f32. Vectors (norms, biases) are never FP8.
#include "model/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <unordered_set>

#include "core/log.h"
#include "kernels/cpu/linear_fp8.h"
#include "model/checkpoint.h"

namespace afd {

void ModelWeights::for_each_matrix(const std::function<void(const Matrix&)>& fn) const {
  auto visit = [&](const Matrix& m) {
    if (!m.empty()) fn(m);
  };
  auto visit_ffn = [&](const FfnWeights& f) {
    visit(f.gate);
    visit(f.up);
    visit(f.down);
  };
  visit(embed);
  visit(lm_head);
  for (const auto& l : layers) {
    for (const Matrix* m : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.attn.q_a, &l.attn.kv_a, &l.attn.kv_b})
      visit(*m);
    if (l.is_moe) {
      visit(l.moe.router);
      for (const auto& e : l.moe.experts) visit_ffn(e);
      visit_ffn(l.moe.shared);
      visit(l.moe.shared_gate);
    } else {
      visit_ffn(l.dense);
    }
  }
}

size_t ModelWeights::matrix_bytes() const {
  std::unordered_set<const void*> seen;
  size_t total = 0;
  for_each_matrix([&](const Matrix& m) {
    if (seen.insert(m.data).second) total += m.nbytes() + m.scale_bytes();
  });
  return total;
}

size_t prefetch_ffn_weights(const ModelWeights& w, const std::vector<uint8_t>& experts, bool shared) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  size_t total = 0;
  auto advise = [&](const Matrix& m) {
    if (m.empty()) return;
    const auto lo = reinterpret_cast<uintptr_t>(m.data) & ~(page - 1);
    const auto hi = reinterpret_cast<uintptr_t>(m.data) + m.nbytes();
    // Advice only: an error (e.g. memory that is not a mapping) changes nothing.
    (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_WILLNEED);
    total += m.nbytes();
  };
  auto advise_ffn = [&](const FfnWeights& f) {
    advise(f.gate);
    advise(f.up);
    advise(f.down);
  };
  for (const auto& l : w.layers) {
    if (l.is_moe) {
      for (size_t e = 0; e < l.moe.experts.size() && e < experts.size(); ++e)
        if (experts[e]) advise_ffn(l.moe.experts[e]);
      if (shared) {
        advise_ffn(l.moe.shared);
        advise(l.moe.shared_gate);
      }
    } else if (shared) {
      advise_ffn(l.dense);
    }
  }
  return total;
}

namespace {

// One expected dimension and the config.json expression that implies it.
struct Dim {
  int64_t n;
  std::string why;  // e.g. "hidden_size"
};

std::string dims_text(const std::vector<Dim>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + d[i].why + "=" + std::to_string(d[i].n);
  return s + "]";
}

// Usable weight storage of a 2-D [rows, cols] or 3-D [slabs, rows, cols] tensor: bf16 or f32
// (in place or converted), or FP8 e4m3 in place with its f32 block scales
// [slabs, ceil(rows/128), ceil(cols/128)].
struct Storage {
  DType dtype = DType::bf16;
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;  // of one slab
  const float* scale = nullptr;
  // Rows [r0, r0 + n) of slab e as a view.
  Matrix matrix(int64_t e, int64_t r0, int64_t n) const {
    Matrix slab{dtype, data + static_cast<size_t>(e * rows * cols) * dtype_size(dtype), rows, cols};
    if (dtype == DType::f8_e4m3) {
      const int64_t bs = kernels::kFp8Block, brows = (rows + bs - 1) / bs, bcols = (cols + bs - 1) / bs;
      slab.scale = scale + e * brows * bcols;
      slab.scale_stride = bcols;
    }
    return matrix_rows(slab, r0, r0 + n);
  }
};

class Binder {
 public:
  Binder(const Checkpoint& ck, ModelWeights* w) : ck_(ck), w_(w) {}

  // The tensor `name` with the expected 2-D or 3-D shape, as usable storage (f16 and misaligned
  // data converted to owned f32; FP8 with its scales, checked).
  Result<Storage> storage(const std::string& name, const std::vector<Dim>& dims) {
    AFD_ASSIGN_OR_RETURN(const TensorRef* r, lookup(name, dims, /*allow_fp8=*/true));
    const DType dt = r->info->dtype;
    Storage s{dt, r->data, dims[dims.size() - 2].n, dims.back().n, nullptr};
    if (dt == DType::f8_e4m3) {
      AFD_ASSIGN_OR_RETURN(s.scale, block_scales(*r, name, dims));
      return s;
    }
    const bool aligned = reinterpret_cast<uintptr_t>(r->data) % dtype_size(dt) == 0;
    if ((dt == DType::bf16 || dt == DType::f32) && aligned) return s;
    s.dtype = DType::f32;
    s.data = reinterpret_cast<const uint8_t*>(owned_copy(*r));
    return s;
  }

  Result<Matrix> matrix(const std::string& name, const Dim& rows, const Dim& cols) {
    AFD_ASSIGN_OR_RETURN(Storage s, storage(name, {rows, cols}));
    return s.matrix(0, 0, rows.n);
  }

  // Always an owned f32 copy.
  Result<Vector> vector(const std::string& name, const Dim& n) {
    AFD_ASSIGN_OR_RETURN(const TensorRef* r, lookup(name, {n}, /*allow_fp8=*/false));
    return Vector{owned_copy(*r), n.n};
  }

  bool has(const std::string& name) const { return ck_.contains(name); }
  const std::string& dir() const { return ck_.dir(); }

 private:
  Result<const TensorRef*> lookup(const std::string& name, const std::vector<Dim>& dims, bool allow_fp8) {
    const TensorRef* r = ck_.find(name);
    if (!r) return not_found(ck_.dir() + ": missing tensor '" + name + "' (expected shape " + dims_text(dims) + ")");
    const DType dt = r->info->dtype;
    if (dt == DType::f8_e4m3 && allow_fp8) {
      if (w_->config.weight_quant != WeightQuant::fp8_block) {
        return invalid_argument(*r->file + ": tensor '" + name +
                                "' is F8_E4M3 but config.json has no quantization_config (FP8 block quantization: "
                                "quant_method fp8, weight_block_size [128, 128])");
      }
    } else if (dt != DType::bf16 && dt != DType::f16 && dt != DType::f32) {
      return not_supported(*r->file + ": tensor '" + name + "' has dtype " + dtype_name(dt) +
                           (allow_fp8 ? " (weights must be BF16, F16, F32 or F8_E4M3 with block scales)"
                                      : " (norm weights and biases must be BF16, F16 or F32)"));
    }
    bool match = r->info->shape.size() == dims.size();
    for (size_t i = 0; match && i < dims.size(); ++i) match = r->info->shape[i] == dims[i].n;
    if (!match) {
      return invalid_argument(*r->file + ": tensor '" + name + "' has shape " + shape_text(r->info->shape) +
                              " but config.json implies " + dims_text(dims));
    }
    return r;
  }

  // The float32 block scales of FP8 tensor `name` (its `_scale_inv` partner), checked: present,
  // shape [.., ceil(rows/128), ceil(cols/128)], a float dtype, finite.
  Result<const float*> block_scales(const TensorRef& w, const std::string& name, const std::vector<Dim>& dims) {
    const std::string sname = name + "_scale_inv";
    const int64_t bs = kernels::kFp8Block;
    std::vector<Dim> sd;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i + 2 < dims.size()) sd.push_back(dims[i]);
      else sd.push_back(Dim{(dims[i].n + bs - 1) / bs, "ceil(" + dims[i].why + "/128)"});
    }
    const TensorRef* r = ck_.find(sname);
    if (!r) {
      return not_found(ck_.dir() + ": missing tensor '" + sname + "' (the block scales of F8_E4M3 tensor '" + name +
                       "' in " + *w.file + ", expected shape " + dims_text(sd) + ")");
    }
    const DType dt = r->info->dtype;
    if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16) {
      return not_supported(*r->file + ": block scale tensor '" + sname + "' has dtype " + dtype_name(dt) +
                           " (expected F32)");
    }
    bool match = r->info->shape.size() == sd.size();
    for (size_t i = 0; match && i < sd.size(); ++i) match = r->info->shape[i] == sd[i].n;
    if (!match) {
      return invalid_argument(*r->file + ": block scale tensor '" + sname + "' has shape " +
                              shape_text(r->info->shape) + " but F8_E4M3 tensor '" + name + "' " +
                              shape_text(w.info->shape) + " with 128x128 blocks implies " + dims_text(sd));
    }
    const float* p = reinterpret_cast<const float*>(r->data);
    if (dt != DType::f32 || reinterpret_cast<uintptr_t>(r->data) % alignof(float) != 0) p = owned_copy(*r);
    const int64_t n = r->info->numel();
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(p[i])) {
        return invalid_argument(*r->file + ": block scale tensor '" + sname + "' holds a non-finite value at element " +
                                std::to_string(i));
      }
    }
    return p;
  }

  const float* owned_copy(const TensorRef& r) {
    const size_t n = static_cast<size_t>(r.info->numel());
    std::unique_ptr<float[]> buf(new float[n > 0 ? n : 1]);
    tensor_to_f32(r.info->dtype, r.data, n, buf.get());
    const float* p = buf.get();
    w_->owned_f32.push_back(std::move(buf));
    return p;
  }

  const Checkpoint& ck_;
  ModelWeights* w_;
};

// DeepSeek MLA (MODELS.md B2): q_a_proj / q_a_layernorm / q_b_proj (or q_proj when
// q_lora_rank is null), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
Status load_mla(Binder& b, const ModelConfig& c, const std::string& p, AttentionWeights* a) {
  const Dim hidden{c.hidden_size, "hidden_size"};
  const Dim q_dim{c.n_heads * c.qk_head_dim(), "num_attention_heads*(qk_nope_head_dim+qk_rope_head_dim)"};
  if (c.q_lora_rank > 0) {
    const Dim rank{c.q_lora_rank, "q_lora_rank"};
    AFD_ASSIGN_OR_RETURN(a->q_a, b.matrix(p + "q_a_proj.weight", rank, hidden));
    AFD_ASSIGN_OR_RETURN(a->q_a_norm, b.vector(p + "q_a_layernorm.weight", rank));
    AFD_ASSIGN_OR_RETURN(a->q, b.matrix(p + "q_b_proj.weight", q_dim, rank));
  } else {
    AFD_ASSIGN_OR_RETURN(a->q, b.matrix(p + "q_proj.weight", q_dim, hidden));
  }
  const Dim kv_lora{c.kv_lora_rank, "kv_lora_rank"};
  AFD_ASSIGN_OR_RETURN(a->kv_a,
                       b.matrix(p + "kv_a_proj_with_mqa.weight",
                                Dim{c.kv_lora_rank + c.qk_rope_head_dim, "kv_lora_rank+qk_rope_head_dim"}, hidden));
  AFD_ASSIGN_OR_RETURN(a->kv_a_norm, b.vector(p + "kv_a_layernorm.weight", kv_lora));
  AFD_ASSIGN_OR_RETURN(a->kv_b, b.matrix(p + "kv_b_proj.weight",
                                         Dim{c.n_heads * (c.qk_nope_head_dim + c.v_head_dim),
                                             "num_attention_heads*(qk_nope_head_dim+v_head_dim)"},
                                         kv_lora));
  AFD_ASSIGN_OR_RETURN(a->o,
                       b.matrix(p + "o_proj.weight", hidden, Dim{c.o_in_dim(), "num_attention_heads*v_head_dim"}));
  return Status();
}

// Step-3 MFA (MODELS.md A2): q_proj [share_q_dim, H] -> inter_norm -> wq [heads*head_dim,
// share_q_dim]; one K/V head k_proj / v_proj [head_dim, H]; o_proj.
Status load_mfa(Binder& b, const ModelConfig& c, const std::string& p, AttentionWeights* a) {
  const Dim hidden{c.hidden_size, "hidden_size"};
  const Dim rank{c.q_lora_rank, "share_q_dim"};
  const Dim q_dim{c.q_dim(), "num_attention_heads*head_dim"};
  const Dim kv_dim{c.kv_dim(), "num_attention_groups*head_dim"};
  AFD_ASSIGN_OR_RETURN(a->q_a, b.matrix(p + "q_proj.weight", rank, hidden));
  AFD_ASSIGN_OR_RETURN(a->q_a_norm, b.vector(p + "inter_norm.weight", rank));
  AFD_ASSIGN_OR_RETURN(a->q, b.matrix(p + "wq.weight", q_dim, rank));
  AFD_ASSIGN_OR_RETURN(a->k, b.matrix(p + "k_proj.weight", kv_dim, hidden));
  AFD_ASSIGN_OR_RETURN(a->v, b.matrix(p + "v_proj.weight", kv_dim, hidden));
  AFD_ASSIGN_OR_RETURN(a->o, b.matrix(p + "o_proj.weight", hidden, q_dim));
  return Status();
}

Status load_attention(Binder& b, const ModelConfig& c, const std::string& p, AttentionWeights* a) {
  if (c.attention == AttentionKind::mla) return load_mla(b, c, p, a);
  if (c.arch == Arch::step3_text) return load_mfa(b, c, p, a);
  const Dim hidden{c.hidden_size, "hidden_size"};
  const Dim q_dim{c.q_dim(), "num_attention_heads*head_dim"};
  const Dim kv_dim{c.kv_dim(), "num_key_value_heads*head_dim"};
  const Dim head{c.head_dim, "head_dim"};
  AFD_ASSIGN_OR_RETURN(a->q, b.matrix(p + "q_proj.weight", q_dim, hidden));
  AFD_ASSIGN_OR_RETURN(a->k, b.matrix(p + "k_proj.weight", kv_dim, hidden));
  AFD_ASSIGN_OR_RETURN(a->v, b.matrix(p + "v_proj.weight", kv_dim, hidden));
  AFD_ASSIGN_OR_RETURN(a->o, b.matrix(p + "o_proj.weight", hidden, q_dim));
  if (c.attention_bias) {
    AFD_ASSIGN_OR_RETURN(a->q_bias, b.vector(p + "q_proj.bias", q_dim));
    AFD_ASSIGN_OR_RETURN(a->k_bias, b.vector(p + "k_proj.bias", kv_dim));
    AFD_ASSIGN_OR_RETURN(a->v_bias, b.vector(p + "v_proj.bias", kv_dim));
  }
  if (c.qk_norm) {
    AFD_ASSIGN_OR_RETURN(a->q_norm, b.vector(p + "q_norm.weight", head));
    AFD_ASSIGN_OR_RETURN(a->k_norm, b.vector(p + "k_norm.weight", head));
  }
  return Status();
}

// gate/up/down of one SwiGLU FFN stored as three nn.Linear weights.
Status load_ffn(Binder& b, const std::string& gate, const std::string& up, const std::string& down,
                const ModelConfig& c, const Dim& inter, FfnWeights* f) {
  const Dim hidden{c.hidden_size, "hidden_size"};
  AFD_ASSIGN_OR_RETURN(f->gate, b.matrix(gate, inter, hidden));
  AFD_ASSIGN_OR_RETURN(f->up, b.matrix(up, inter, hidden));
  AFD_ASSIGN_OR_RETURN(f->down, b.matrix(down, hidden, inter));
  return Status();
}

// DeepSeek MoE layer (MODELS.md B2): router mlp.gate.weight, e_score_correction_bias
// (noaux_tc; f32 or bf16 on disk), per-expert mlp.experts.j.*, mlp.shared_experts.* of width
// n_shared_experts * moe_intermediate_size (added unweighted).
Status load_deepseek_moe(Binder& b, const ModelConfig& c, const std::string& layer_prefix, MoeWeights* m) {
  const Dim hidden{c.hidden_size, "hidden_size"};
  const Dim inter{c.moe_intermediate_size, "moe_intermediate_size"};
  const Dim experts{c.n_experts, "n_routed_experts"};
  const std::string moe = layer_prefix + "mlp.";
  AFD_ASSIGN_OR_RETURN(m->router, b.matrix(moe + "gate.weight", experts, hidden));
  if (c.has_score_bias) {
    AFD_ASSIGN_OR_RETURN(m->score_bias, b.vector(moe + "gate.e_score_correction_bias", experts));
  }
  m->experts.resize(static_cast<size_t>(c.n_experts));
  for (int64_t e = 0; e < c.n_experts; ++e) {
    const std::string ep = moe + "experts." + std::to_string(e) + ".";
    AFD_RETURN_IF_ERROR(load_ffn(b, ep + "gate_proj.weight", ep + "up_proj.weight", ep + "down_proj.weight", c, inter,
                                 &m->experts[static_cast<size_t>(e)]));
  }
  if (c.shared_expert_intermediate_size > 0) {
    const Dim sh{c.shared_expert_intermediate_size, "n_shared_experts*moe_intermediate_size"};
    const std::string sp = moe + "shared_experts.";
    AFD_RETURN_IF_ERROR(
        load_ffn(b, sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight", c, sh, &m->shared));
  }
  return Status();
}

// Step-3 MoE layer (MODELS.md A2): router moe.gate.weight; experts stacked 3-D
// moe.{gate,up}_proj.weight [E, I, H], moe.down_proj.weight [E, H, I] (FP8: stacked scales
// [E, ceil(I/128), ceil(H/128)]), viewed per expert; share_expert.* (added unweighted).
Status load_step3_moe(Binder& b, const ModelConfig& c, const std::string& layer_prefix, MoeWeights* m) {
  const Dim hidden{c.hidden_size, "hidden_size"};
  const Dim inter{c.moe_intermediate_size, "moe_intermediate_size"};
  const Dim experts{c.n_experts, "moe_num_experts"};
  const std::string moe = layer_prefix + "moe.";
  AFD_ASSIGN_OR_RETURN(m->router, b.matrix(moe + "gate.weight", experts, hidden));
  AFD_ASSIGN_OR_RETURN(Storage g, b.storage(moe + "gate_proj.weight", {experts, inter, hidden}));
  AFD_ASSIGN_OR_RETURN(Storage u, b.storage(moe + "up_proj.weight", {experts, inter, hidden}));
  AFD_ASSIGN_OR_RETURN(Storage d, b.storage(moe + "down_proj.weight", {experts, hidden, inter}));
  m->experts.resize(static_cast<size_t>(c.n_experts));
  for (int64_t e = 0; e < c.n_experts; ++e) {
    FfnWeights& f = m->experts[static_cast<size_t>(e)];
    f.gate = g.matrix(e, 0, c.moe_intermediate_size);
    f.up = u.matrix(e, 0, c.moe_intermediate_size);
    f.down = d.matrix(e, 0, c.hidden_size);
  }
  if (c.shared_expert_intermediate_size > 0) {
    const Dim sh{c.shared_expert_intermediate_size, "share_expert_dim"};
    const std::string sp = layer_prefix + "share_expert.";
    AFD_RETURN_IF_ERROR(
        load_ffn(b, sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight", c, sh, &m->shared));
  }
  return Status();
}

Status load_moe(Binder& b, const ModelConfig& c, const std::string& layer_prefix, MoeWeights* m) {
  if (c.arch == Arch::deepseek_v2 || c.arch == Arch::deepseek_v3) return load_deepseek_moe(b, c, layer_prefix, m);
  if (c.arch == Arch::step3_text) return load_step3_moe(b, c, layer_prefix, m);
  const Dim hidden{c.hidden_size, "hidden_size"};
  const bool mixtral = c.arch == Arch::mixtral;
  const Dim inter{c.moe_intermediate_size, mixtral ? "intermediate_size" : "moe_intermediate_size"};
  const Dim experts{c.n_experts, mixtral ? "num_local_experts" : "num_experts"};
  const Dim inter2{2 * c.moe_intermediate_size, std::string("2*") + inter.why};

  // Where the experts live: HF per-expert names, or the fused pair of newer checkpoints.
  std::string moe = layer_prefix + (mixtral ? "block_sparse_moe." : "mlp.");
  bool fused = b.has(moe + "experts.gate_up_proj");
  if (mixtral && !fused && !b.has(moe + "gate.weight") && b.has(layer_prefix + "mlp.experts.gate_up_proj")) {
    moe = layer_prefix + "mlp.";
    fused = true;
  }
  AFD_ASSIGN_OR_RETURN(m->router, b.matrix(moe + "gate.weight", experts, hidden));
  m->experts.resize(static_cast<size_t>(c.n_experts));
  if (fused) {
    AFD_ASSIGN_OR_RETURN(Storage gu, b.storage(moe + "experts.gate_up_proj", {experts, inter2, hidden}));
    AFD_ASSIGN_OR_RETURN(Storage dn, b.storage(moe + "experts.down_proj", {experts, hidden, inter}));
    const int64_t I = c.moe_intermediate_size, H = c.hidden_size;
    for (int64_t e = 0; e < c.n_experts; ++e) {
      FfnWeights& f = m->experts[static_cast<size_t>(e)];
      f.gate = gu.matrix(e, 0, I);  // rows [0, I) of expert e
      f.up = gu.matrix(e, I, I);    // rows [I, 2I)
      f.down = dn.matrix(e, 0, H);
    }
  } else {
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string ep = moe + "experts." + std::to_string(e) + ".";
      FfnWeights* f = &m->experts[static_cast<size_t>(e)];
      if (mixtral) {
        AFD_RETURN_IF_ERROR(load_ffn(b, ep + "w1.weight", ep + "w3.weight", ep + "w2.weight", c, inter, f));
      } else {
        AFD_RETURN_IF_ERROR(
            load_ffn(b, ep + "gate_proj.weight", ep + "up_proj.weight", ep + "down_proj.weight", c, inter, f));
      }
    }
  }
  if (c.shared_expert_intermediate_size > 0) {
    const Dim sh{c.shared_expert_intermediate_size, "shared_expert_intermediate_size"};
    const std::string sp = moe + "shared_expert.";
    AFD_RETURN_IF_ERROR(
        load_ffn(b, sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight", c, sh, &m->shared));
    AFD_ASSIGN_OR_RETURN(m->shared_gate, b.matrix(moe + "shared_expert_gate.weight", Dim{1, "1"}, hidden));
  }
  return Status();
}

// Decoder layer `l` (model.layers.l.*), MoE or dense by c's rules for l.
Status load_layer(Binder& b, const ModelConfig& c, int64_t l, LayerWeights* L) {
  const Dim hidden{c.hidden_size, "hidden_size"};
  const std::string p = "model.layers." + std::to_string(l) + ".";
  AFD_ASSIGN_OR_RETURN(L->input_norm, b.vector(p + "input_layernorm.weight", hidden));
  AFD_ASSIGN_OR_RETURN(L->post_attention_norm, b.vector(p + "post_attention_layernorm.weight", hidden));
  AFD_RETURN_IF_ERROR(load_attention(b, c, p + "self_attn.", &L->attn));
  L->is_moe = c.is_moe_layer(l);
  if (L->is_moe) return load_moe(b, c, p, &L->moe);
  const Dim inter{c.intermediate_size, "intermediate_size"};
  const std::string mp = p + "mlp.";
  return load_ffn(b, mp + "gate_proj.weight", mp + "up_proj.weight", mp + "down_proj.weight", c, inter, &L->dense);
}

Status load_all(Binder& b, const ModelConfig& c, ModelWeights* w) {
  const Dim vocab{c.vocab_size, "vocab_size"};
  const Dim hidden{c.hidden_size, "hidden_size"};
  AFD_ASSIGN_OR_RETURN(w->embed, b.matrix("model.embed_tokens.weight", vocab, hidden));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed;  // transformers ties them; a stored lm_head.weight is ignored
  } else {
    AFD_ASSIGN_OR_RETURN(w->lm_head, b.matrix("lm_head.weight", vocab, hidden));
  }
  AFD_ASSIGN_OR_RETURN(w->final_norm, b.vector("model.norm.weight", hidden));
  w->layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) AFD_RETURN_IF_ERROR(load_layer(b, c, l, &w->layers[static_cast<size_t>(l)]));
  return Status();
}

}  // namespace

Result<MtpModule> load_mtp_module(std::shared_ptr<const ModelWeights> main, int64_t m) {
  const ModelConfig& mc = main->config;
  if (mc.arch != Arch::deepseek_v2 && mc.arch != Arch::deepseek_v3)
    return not_supported(std::string("MTP modules are DeepSeek's; this model is ") + arch_name(mc.arch));
  if (m < 0 || m >= mc.num_nextn_predict_layers)
    return invalid_argument(main->checkpoint->dir() + ": no MTP module " + std::to_string(m) +
                            " (config.json num_nextn_predict_layers is " + std::to_string(mc.num_nextn_predict_layers) +
                            ")");
  const int64_t l = mc.n_layers + m;
  auto block = std::make_shared<ModelWeights>();
  block->config = mc;
  block->checkpoint = main->checkpoint;
  block->base = main;
  Binder b(*main->checkpoint, block.get());
  const Dim vocab{mc.vocab_size, "vocab_size"};
  const Dim hidden{mc.hidden_size, "hidden_size"};
  const std::string p = "model.layers." + std::to_string(l) + ".";
  MtpModule out;
  // embed_tokens and shared_head.head are the module's when stored (DeepSeek-V3 stores copies of
  // the main model's), else the main model's (MODELS.md B7), each on its own.
  if (const std::string e = p + "embed_tokens.weight"; b.has(e)) {
    AFD_ASSIGN_OR_RETURN(block->embed, b.matrix(e, vocab, hidden));
  } else {
    block->embed = main->embed;
  }
  AFD_ASSIGN_OR_RETURN(out.enorm, b.vector(p + "enorm.weight", hidden));
  AFD_ASSIGN_OR_RETURN(out.hnorm, b.vector(p + "hnorm.weight", hidden));
  AFD_ASSIGN_OR_RETURN(out.eh_proj, b.matrix(p + "eh_proj.weight", hidden, Dim{2 * mc.hidden_size, "2*hidden_size"}));
  AFD_ASSIGN_OR_RETURN(block->final_norm, b.vector(p + "shared_head.norm.weight", hidden));
  if (const std::string h = p + "shared_head.head.weight"; b.has(h)) {
    AFD_ASSIGN_OR_RETURN(block->lm_head, b.matrix(h, vocab, hidden));
  } else {
    block->lm_head = main->lm_head;
  }
  block->layers.resize(1);
  AFD_RETURN_IF_ERROR(load_layer(b, mc, l, &block->layers[0]));
  // As a one-layer model: layer 0 is the module's layer, MoE exactly when layer l is.
  ModelConfig& c = block->config;
  c.n_layers = 1;
  c.num_nextn_predict_layers = 0;
  c.first_k_dense_replace = block->layers[0].is_moe ? 0 : 1;
  c.moe_layer_freq = 1;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers.clear();
  c.moe_layers.clear();
  c.tie_word_embeddings = false;
  out.block = std::move(block);
  return out;
}

Result<std::shared_ptr<const ModelWeights>> load_model(const std::string& model_dir) {
  AFD_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  AFD_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ck, Checkpoint::open(model_dir));
  auto w = std::make_shared<ModelWeights>();
  w->config = std::move(config);
  w->checkpoint = ck;
  Binder b(*ck, w.get());
  AFD_RETURN_IF_ERROR(load_all(b, w->config, w.get()));
  spdlog::debug("loaded {}: {} tensors in {} file(s), {} bytes of matrices", model_dir, ck->n_tensors(),
                ck->files().size(), w->matrix_bytes());
  return std::shared_ptr<const ModelWeights>(std::move(w));
}

}  // namespace afd
