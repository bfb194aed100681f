#include "model/tools/make_model.h"

#include "core/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "kernels/cpu/linear_fp8.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"
#include "model/tools/weights_file.h"

namespace afd {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

// ---- deterministic generator: afd::Rng (xoshiro256** seeded by splitmix64) per logical tensor ----

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

class TensorRng {
 public:
  // Values are center + half * U(-1, 1).
  TensorRng(uint64_t seed, const std::string& name, float center, float half)
      : rng_(seed ^ fnv1a64(name)), center_(center), half_(half) {}
  void fill(float* out, size_t n) {
    constexpr float k = 1.0f / 8388608.0f;  // 2^-23
    for (size_t i = 0; i < n; ++i) {
      uint64_t r = rng_.next_u64();
      float u = static_cast<float>(static_cast<int32_t>(r >> 40) - (1 << 23)) * k;  // [-1, 1)
      out[i] = center_ + half_ * u;
    }
  }

 private:
  Rng rng_;
  float center_, half_;
};

// ---- the tensors of a model ----

// A logical tensor: one HF per-expert name with its shape and initialisation.
struct Piece {
  std::string name;
  std::vector<int64_t> shape;
  float center = 0, half = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A tensor as stored: one piece, or (fused layout) the concatenation of several.
// `linear`: a projection that the FP8 block format quantizes (attention q/k/v/o, expert,
// shared-expert and dense MLP matrices); embeddings, LM head, router, shared-expert gate,
// norms and biases stay in the base dtype.
struct Stored {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
  bool linear = false;
  bool f32 = false;  // always float32 (DeepSeek's e_score_correction_bias)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

Piece matrix_piece(const std::string& name, int64_t rows, int64_t cols) {
  return Piece{name, {rows, cols}, 0.0f, std::sqrt(3.0f / static_cast<float>(cols))};
}

class Planner {
 public:
  Planner(const ModelConfig& c, ExpertLayout layout) : c_(c), layout_(layout) {}

  std::vector<Stored> plan() {
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    mat("model.embed_tokens.weight", V, H, /*linear=*/false);
    for (int64_t l = 0; l < c_.n_layers; ++l) layer(l);
    norm("model.norm.weight", H);
    if (!c_.tie_word_embeddings) mat("lm_head.weight", V, H, /*linear=*/false);
    for (int64_t m = 0; m < c_.num_nextn_predict_layers; ++m) mtp_module(c_.n_layers + m);
    return std::move(out_);
  }

 private:
  void mat(const std::string& name, int64_t rows, int64_t cols, bool linear = true) {
    out_.push_back(Stored{name, {rows, cols}, {matrix_piece(name, rows, cols)}, linear});
  }
  void norm(const std::string& name, int64_t n) { out_.push_back(Stored{name, {n}, {Piece{name, {n}, 1.0f, 0.1f}}}); }
  void bias(const std::string& name, int64_t n) { out_.push_back(Stored{name, {n}, {Piece{name, {n}, 0.0f, 0.05f}}}); }
  void ffn(const std::string& gate, const std::string& up, const std::string& down, int64_t inter) {
    mat(gate, inter, c_.hidden_size);
    mat(up, inter, c_.hidden_size);
    mat(down, c_.hidden_size, inter);
  }

  // DeepSeek (MODELS.md B2): MLA attention; MoE with per-expert tensors, router bias
  // (noaux_tc, float32) and unweighted shared experts.
  void deepseek_layer(int64_t l) {
    const int64_t H = c_.hidden_size, N = c_.n_heads;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    norm(p + "input_layernorm.weight", H);
    if (c_.q_lora_rank > 0) {
      mat(a + "q_a_proj.weight", c_.q_lora_rank, H);
      norm(a + "q_a_layernorm.weight", c_.q_lora_rank);
      mat(a + "q_b_proj.weight", N * c_.qk_head_dim(), c_.q_lora_rank);
    } else {
      mat(a + "q_proj.weight", N * c_.qk_head_dim(), H);
    }
    mat(a + "kv_a_proj_with_mqa.weight", c_.kv_lora_rank + c_.qk_rope_head_dim, H);
    norm(a + "kv_a_layernorm.weight", c_.kv_lora_rank);
    mat(a + "kv_b_proj.weight", N * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank);
    mat(a + "o_proj.weight", H, c_.o_in_dim());
    norm(p + "post_attention_layernorm.weight", H);
    const std::string m = p + "mlp.";
    if (!c_.is_moe_layer(l)) {
      ffn(m + "gate_proj.weight", m + "up_proj.weight", m + "down_proj.weight", c_.intermediate_size);
      return;
    }
    mat(m + "gate.weight", c_.n_experts, H, /*linear=*/false);
    if (c_.has_score_bias) {
      const std::string b = m + "gate.e_score_correction_bias";
      out_.push_back(Stored{b, {c_.n_experts}, {Piece{b, {c_.n_experts}, 0.0f, 0.05f}}, false, true});
    }
    for (int64_t e = 0; e < c_.n_experts; ++e) {
      const std::string ep = m + "experts." + std::to_string(e) + ".";
      ffn(ep + "gate_proj.weight", ep + "up_proj.weight", ep + "down_proj.weight", c_.moe_intermediate_size);
    }
    if (c_.shared_expert_intermediate_size > 0) {
      const std::string sp = m + "shared_experts.";
      ffn(sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight", c_.shared_expert_intermediate_size);
    }
  }

  // A DeepSeek MTP module at layer id l >= n_layers (MODELS.md B7): its own embedding copy,
  // norms, eh_proj [H, 2H] (embedding half first) and shared head, plus a full decoder
  // layer. Only the decoder layer's projections are FP8 in the block format; embedding,
  // eh_proj and head stay in the base dtype (as tests/reference/mla_mfa_ref.py reads them).
  void mtp_module(int64_t l) {
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    mat(p + "embed_tokens.weight", V, H, /*linear=*/false);
    norm(p + "enorm.weight", H);
    norm(p + "hnorm.weight", H);
    mat(p + "eh_proj.weight", H, 2 * H, /*linear=*/false);
    deepseek_layer(l);
    norm(p + "shared_head.norm.weight", H);
    mat(p + "shared_head.head.weight", V, H, /*linear=*/false);
  }

  // Step-3 (MODELS.md A2): MFA attention; MoE experts stacked 3-D per projection (logical
  // pieces keep per-expert names moe.experts.j.*), unweighted share_expert.
  void step3_layer(int64_t l) {
    const int64_t H = c_.hidden_size, E = c_.n_experts, I = c_.moe_intermediate_size;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    norm(p + "input_layernorm.weight", H);
    mat(a + "q_proj.weight", c_.q_lora_rank, H);
    norm(a + "inter_norm.weight", c_.q_lora_rank);
    mat(a + "wq.weight", c_.q_dim(), c_.q_lora_rank);
    mat(a + "k_proj.weight", c_.kv_dim(), H);
    mat(a + "v_proj.weight", c_.kv_dim(), H);
    mat(a + "o_proj.weight", H, c_.q_dim());
    norm(p + "post_attention_layernorm.weight", H);
    if (!c_.is_moe_layer(l)) {
      const std::string m = p + "mlp.";
      ffn(m + "gate_proj.weight", m + "up_proj.weight", m + "down_proj.weight", c_.intermediate_size);
      return;
    }
    const std::string m = p + "moe.";
    mat(m + "gate.weight", E, H, /*linear=*/false);
    Stored g{m + "gate_proj.weight", {E, I, H}, {}, true};
    Stored u{m + "up_proj.weight", {E, I, H}, {}, true};
    Stored d{m + "down_proj.weight", {E, H, I}, {}, true};
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = m + "experts." + std::to_string(e) + ".";
      g.pieces.push_back(matrix_piece(ep + "gate_proj.weight", I, H));
      u.pieces.push_back(matrix_piece(ep + "up_proj.weight", I, H));
      d.pieces.push_back(matrix_piece(ep + "down_proj.weight", H, I));
    }
    out_.push_back(std::move(g));
    out_.push_back(std::move(u));
    out_.push_back(std::move(d));
    if (c_.shared_expert_intermediate_size > 0) {
      const std::string sp = p + "share_expert.";
      ffn(sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight", c_.shared_expert_intermediate_size);
    }
  }

  void layer(int64_t l) {
    if (c_.arch == Arch::deepseek_v2 || c_.arch == Arch::deepseek_v3) return deepseek_layer(l);
    if (c_.arch == Arch::step3_text) return step3_layer(l);
    const int64_t H = c_.hidden_size;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", H);
    const std::string a = p + "self_attn.";
    mat(a + "q_proj.weight", c_.q_dim(), H);
    if (c_.attention_bias) bias(a + "q_proj.bias", c_.q_dim());
    mat(a + "k_proj.weight", c_.kv_dim(), H);
    if (c_.attention_bias) bias(a + "k_proj.bias", c_.kv_dim());
    mat(a + "v_proj.weight", c_.kv_dim(), H);
    if (c_.attention_bias) bias(a + "v_proj.bias", c_.kv_dim());
    mat(a + "o_proj.weight", H, c_.q_dim());
    if (c_.qk_norm) {
      norm(a + "q_norm.weight", c_.head_dim);
      norm(a + "k_norm.weight", c_.head_dim);
    }
    norm(p + "post_attention_layernorm.weight", H);
    if (!c_.is_moe_layer(l)) {
      ffn(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight", c_.intermediate_size);
      return;
    }
    const bool mixtral = c_.arch == Arch::mixtral;
    const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
    const int64_t E = c_.n_experts, I = c_.moe_intermediate_size;
    mat(m + "gate.weight", E, H, /*linear=*/false);
    auto names = [&](int64_t e) {
      const std::string ep = m + "experts." + std::to_string(e) + ".";
      return mixtral ? std::array<std::string, 3>{ep + "w1.weight", ep + "w3.weight", ep + "w2.weight"}
                     : std::array<std::string, 3>{ep + "gate_proj.weight", ep + "up_proj.weight", ep + "down_proj.weight"};
    };
    if (layout_ == ExpertLayout::per_expert) {
      for (int64_t e = 0; e < E; ++e) {
        auto n = names(e);
        ffn(n[0], n[1], n[2], I);
      }
    } else {
      // gate_up_proj [E, 2I, H]: expert e's gate rows then its up rows; down_proj [E, H, I].
      Stored gu{m + "experts.gate_up_proj", {E, 2 * I, H}, {}, true};
      Stored dn{m + "experts.down_proj", {E, H, I}, {}, true};
      for (int64_t e = 0; e < E; ++e) {
        auto n = names(e);
        gu.pieces.push_back(matrix_piece(n[0], I, H));
        gu.pieces.push_back(matrix_piece(n[1], I, H));
        dn.pieces.push_back(matrix_piece(n[2], H, I));
      }
      out_.push_back(std::move(gu));
      out_.push_back(std::move(dn));
    }
    if (c_.shared_expert_intermediate_size > 0) {
      const std::string s = m + "shared_expert.";
      ffn(s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight", c_.shared_expert_intermediate_size);
      mat(m + "shared_expert_gate.weight", 1, H, /*linear=*/false);
    }
  }

  const ModelConfig& c_;
  ExpertLayout layout_;
  std::vector<Stored> out_;
};

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    default: return "bfloat16";
  }
}

// ---- streaming output ----

// Where the values of the pieces come from: the generator of (seed, piece name), or the
// piece's tensor in a weights file (every piece claimed, make_model checks that first).
struct ValueSource {
  uint64_t seed = 1;
  const WeightsFile* file = nullptr;
};

// The values of a stored tensor in order, across its pieces.
class ValueStream {
 public:
  ValueStream(const Stored& t, const ValueSource& src) : t_(t), src_(src) {}
  void fill(float* out, size_t n) {
    while (n > 0) {
      if (left_ == 0) {
        piece_ = &t_.pieces[next_++];
        if (src_.file == nullptr)
          rng_ = std::make_unique<TensorRng>(src_.seed, piece_->name, piece_->center, piece_->half);
        left_ = static_cast<size_t>(piece_->numel());
        continue;
      }
      const size_t k = std::min(n, left_);
      if (src_.file != nullptr) {
        src_.file->read(piece_->name, piece_->numel() - static_cast<int64_t>(left_), out, k);
      } else {
        rng_->fill(out, k);
      }
      out += k;
      n -= k;
      left_ -= k;
    }
  }

 private:
  const Stored& t_;
  const ValueSource& src_;
  size_t next_ = 0, left_ = 0;
  const Piece* piece_ = nullptr;
  std::unique_ptr<TensorRng> rng_;
};

// Streams a tensor's values converted to a dense dtype (f32, bf16, f16).
Status write_dense(const Stored& t, DType dtype, const ValueSource& src, const ByteWriter& write) {
  constexpr size_t kChunk = size_t{1} << 20;  // elements per generated chunk
  const size_t esize = dtype_size(dtype);
  std::vector<float> vals(kChunk);
  std::vector<uint8_t> bytes(kChunk * esize);
  ValueStream vs(t, src);
  for (int64_t done = 0; done < t.numel();) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kChunk), t.numel() - done));
    vs.fill(vals.data(), n);
    if (dtype == DType::f32) {
      std::memcpy(bytes.data(), vals.data(), n * 4);
    } else {
      auto* h = reinterpret_cast<uint16_t*>(bytes.data());
      if (dtype == DType::bf16) {
        for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(vals[i]).bits;
      } else {
        for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(vals[i]);
      }
    }
    AFD_RETURN_IF_ERROR(write(bytes.data(), n * esize));
    done += static_cast<int64_t>(n);
  }
  return Status();
}

// Streams a 2-D [R, C] or 3-D [E, R, C] tensor quantized to FP8 blocks, 128 rows at a time
// (memory O(128 * C)); its block scales [.., ceil(R/128), ceil(C/128)] go to *scales.
Status write_fp8(const Stored& t, const ValueSource& src, const ByteWriter& write, std::vector<float>* scales) {
  const int64_t bs = kernels::kFp8Block;
  const int64_t R = t.shape[t.shape.size() - 2], C = t.shape.back();
  const int64_t slabs = t.shape.size() == 3 ? t.shape[0] : 1;
  const int64_t bcols = (C + bs - 1) / bs;
  std::vector<float> vals(static_cast<size_t>(bs * C));
  std::vector<uint8_t> q(vals.size());
  std::vector<float> s(static_cast<size_t>(bcols));
  scales->clear();
  ValueStream vs(t, src);
  for (int64_t e = 0; e < slabs; ++e) {
    for (int64_t r0 = 0; r0 < R; r0 += bs) {
      const int64_t nr = std::min(bs, R - r0);
      vs.fill(vals.data(), static_cast<size_t>(nr * C));
      kernels::quantize_fp8_blocks(vals.data(), nr, C, q.data(), s.data());
      AFD_RETURN_IF_ERROR(write(q.data(), static_cast<size_t>(nr * C)));
      scales->insert(scales->end(), s.begin(), s.end());
    }
  }
  return Status();
}

std::vector<int64_t> scale_shape(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s = shape;
  const int64_t bs = kernels::kFp8Block;
  for (size_t i = s.size() - 2; i < s.size(); ++i) s[i] = (s[i] + bs - 1) / bs;
  return s;
}

}  // namespace

namespace {

// DeepSeek presets. tiny follows MODELS.md D2 (D2b for deepseek_v2): dims that leave partial
// 128-blocks in FP8 (q_a 192 rows, kv_a 160 rows, experts 160 wide).
Result<ModelConfig> deepseek_preset(Arch arch, const std::string& preset) {
  const bool v3 = arch == Arch::deepseek_v3;
  ModelConfig c;
  c.arch = arch;
  c.model_type = arch_name(arch);
  c.architecture = v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM";
  c.attention = AttentionKind::mla;
  if (preset == "tiny") {
    c.vocab_size = 512; c.hidden_size = 256; c.n_layers = 3; c.n_heads = 4;
    c.q_lora_rank = v3 ? 192 : 0; c.kv_lora_rank = 128; c.qk_nope_head_dim = 64; c.qk_rope_head_dim = 32;
    c.v_head_dim = 64; c.intermediate_size = 384; c.moe_intermediate_size = 160; c.n_experts = 16;
    c.n_group = 4; c.topk_group = 2; c.n_experts_per_tok = 4; c.n_shared_experts = 2; c.first_k_dense_replace = 1;
    c.max_position_embeddings = 163840;
  } else if (preset == "small") {
    c.vocab_size = 16000; c.hidden_size = 1024; c.n_layers = 4; c.n_heads = 16;
    c.q_lora_rank = v3 ? 384 : 0; c.kv_lora_rank = 256; c.qk_nope_head_dim = 64; c.qk_rope_head_dim = 32;
    c.v_head_dim = 64; c.intermediate_size = 2048; c.moe_intermediate_size = 256; c.n_experts = 32;
    c.n_group = 8; c.topk_group = 4; c.n_experts_per_tok = 4; c.n_shared_experts = 1; c.first_k_dense_replace = 1;
    c.max_position_embeddings = 163840;
  } else if (preset == "bench") {
    c.vocab_size = 32000; c.hidden_size = 2048; c.n_layers = 6; c.n_heads = 16;
    c.q_lora_rank = v3 ? 768 : 0; c.kv_lora_rank = 512; c.qk_nope_head_dim = 128; c.qk_rope_head_dim = 64;
    c.v_head_dim = 128; c.intermediate_size = 6144; c.moe_intermediate_size = 512; c.n_experts = 64;
    c.n_group = 8; c.topk_group = 4; c.n_experts_per_tok = 6; c.n_shared_experts = 2; c.first_k_dense_replace = 1;
    c.max_position_embeddings = 163840;
  } else {
    return invalid_argument("unknown preset '" + preset + "' (tiny, small, bench)");
  }
  c.n_kv_heads = c.n_heads;
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  c.shared_expert_ungated = true;
  c.rope_interleave = true;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.rope_scaling.type = RopeScaling::Type::yarn;
  c.rope_scaling.factor = 40;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.beta_fast = 32;
  c.rope_scaling.beta_slow = 1;
  if (v3) {
    c.scoring = RouterScoring::sigmoid;
    c.topk_method = TopkMethod::noaux_tc;
    c.has_score_bias = true;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.rope_scaling.mscale = 1.0;
    c.rope_scaling.mscale_all_dim = 1.0;
  } else {
    c.scoring = RouterScoring::softmax;
    c.topk_method = TopkMethod::group_limited_greedy;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 2.0;
    c.rope_scaling.mscale = 0.707;
    c.rope_scaling.mscale_all_dim = 0.707;
  }
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  AFD_RETURN_IF_ERROR(c.validate());
  return c;
}

// Step-3 presets. tiny follows MODELS.md D1 (dense layers 0 and the last, like the real
// model's trailing dense layer).
Result<ModelConfig> step3_preset(const std::string& preset) {
  ModelConfig c;
  c.arch = Arch::step3_text;
  c.model_type = "step3_text";
  c.architecture = "Step3TextForCausalLM";
  if (preset == "tiny") {
    c.vocab_size = 512; c.hidden_size = 256; c.n_layers = 4; c.n_heads = 4; c.head_dim = 64; c.q_lora_rank = 192;
    c.intermediate_size = 384; c.n_experts = 8; c.n_experts_per_tok = 3; c.moe_intermediate_size = 160;
    c.shared_expert_intermediate_size = 192; c.moe_layers = {1, 2}; c.max_position_embeddings = 4096;
  } else if (preset == "small") {
    c.vocab_size = 16000; c.hidden_size = 1024; c.n_layers = 4; c.n_heads = 8; c.head_dim = 128;
    c.q_lora_rank = 512; c.intermediate_size = 2048; c.n_experts = 16; c.n_experts_per_tok = 3;
    c.moe_intermediate_size = 384; c.shared_expert_intermediate_size = 384; c.moe_layers = {1, 2};
    c.max_position_embeddings = 65536;
  } else if (preset == "bench") {
    c.vocab_size = 32000; c.hidden_size = 2048; c.n_layers = 6; c.n_heads = 16; c.head_dim = 256;
    c.q_lora_rank = 1024; c.intermediate_size = 6144; c.n_experts = 32; c.n_experts_per_tok = 3;
    c.moe_intermediate_size = 1024; c.shared_expert_intermediate_size = 1024; c.moe_layers = {1, 2, 3, 4};
    c.max_position_embeddings = 65536;
  } else {
    return invalid_argument("unknown preset '" + preset + "' (tiny, small, bench)");
  }
  c.n_kv_heads = 1;
  c.n_shared_experts = 1;
  c.shared_expert_ungated = true;
  c.norm_topk_prob = false;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  AFD_RETURN_IF_ERROR(c.validate());
  return c;
}

// config.json of a DeepSeek model (DeepseekV2Config / DeepseekV3Config field names).
ordered_json deepseek_config_json(const ModelConfig& c) {
  ordered_json j;
  j["architectures"] = {c.architecture.empty() ? std::string(arch_name(c.arch)) : c.architecture};
  j["model_type"] = c.model_type.empty() ? std::string(arch_name(c.arch)) : c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_routed_experts"] = c.n_experts;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["topk_method"] = c.topk_method == TopkMethod::noaux_tc               ? "noaux_tc"
                     : c.topk_method == TopkMethod::group_limited_greedy ? "group_limited_greedy"
                                                                         : "greedy";
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["num_experts_per_tok"] = c.n_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = c.scoring == RouterScoring::sigmoid ? "sigmoid" : "softmax";
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_interleave"] = c.rope_interleave;
  if (c.rope_scaling.type == RopeScaling::Type::yarn) {
    ordered_json y;
    y["type"] = "yarn";
    y["factor"] = c.rope_scaling.factor;
    y["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    y["beta_fast"] = c.rope_scaling.beta_fast;
    y["beta_slow"] = c.rope_scaling.beta_slow;
    y["mscale"] = c.rope_scaling.mscale;
    y["mscale_all_dim"] = c.rope_scaling.mscale_all_dim;
    j["rope_scaling"] = y;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  return j;
}

// text_config of a Step-3 model (Step3TextConfig field names; moe_layers_enum is a string).
ordered_json step3_text_config_json(const ModelConfig& c, DType dtype) {
  ordered_json j;
  j["architectures"] = {"Step3TextForCausalLM"};
  j["model_type"] = "step3_text";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_attention_groups"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["share_q_dim"] = c.q_lora_rank;
  j["moe_num_experts"] = c.n_experts;
  j["moe_top_k"] = c.n_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["share_expert_dim"] = c.shared_expert_intermediate_size;
  j["norm_expert_weight"] = c.norm_topk_prob;
  std::string layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    if (!layers.empty()) layers += ',';
    layers += std::to_string(l);
  }
  j["moe_layers_enum"] = layers;
  j["max_position_embedding"] = c.max_position_embeddings;
  j["max_seq_len"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["torch_dtype"] = torch_dtype_name(dtype);
  return j;
}

// Whether config.json `text` written for `c` parses back to `c`, up to what the written file
// decides: torch_dtype (the file dtype), weight_quant (fp8 when either says so) and the
// informational quantization scale_fmt (not written).
Status check_config_round_trip(const ModelConfig& c, DType dtype, const std::string& text) {
  ModelConfig want = c;
  want.torch_dtype = torch_dtype_name(dtype);
  if (dtype == DType::f8_e4m3) want.weight_quant = WeightQuant::fp8_block;
  want.quant_scale_fmt.clear();
  auto back = parse_model_config(text, "config.json (as written)");
  if (!back.ok())
    return back.status().with_context("make_model: the config.json written for this model does not parse");
  back->quant_scale_fmt.clear();
  if (const char* field = model_config_difference(*back, want))
    return invalid_argument("make_model: the config.json written for this " + std::string(arch_name(c.arch)) +
                            " model does not parse back to the same configuration: '" + field +
                            "' differs (a setting this writer cannot express)");
  return Status();
}

}  // namespace

Result<ModelConfig> make_preset_config(const std::string& model_type, const std::string& preset) {
  if (model_type == "kimi_k2") {
    // Kimi-K2 (MODELS.md B8, values of the public tiny-random mirror; the real checkpoint's RoPE
    // values are unconfirmed there): DeepSeek-V3 layout, one expert group (the group step is a
    // no-op), one shared expert, routed_scaling_factor 2.827, rope_theta 50000, YaRN factor 32 with
    // beta_fast = beta_slow = 1 and mscale 1.
    AFD_ASSIGN_OR_RETURN(ModelConfig c, deepseek_preset(Arch::deepseek_v3, preset));
    c.model_type = "kimi_k2";
    c.n_group = 1;
    c.topk_group = 1;
    c.n_shared_experts = 1;
    c.shared_expert_intermediate_size = c.moe_intermediate_size;
    c.routed_scaling_factor = 2.827;
    c.rope_theta = 50000.0;
    c.rope_scaling.factor = 32;
    c.rope_scaling.beta_fast = 1;
    c.rope_scaling.beta_slow = 1;
    AFD_RETURN_IF_ERROR(c.validate());
    return c;
  }
  Arch arch;
  if (!arch_from_name(model_type, &arch))
    return invalid_argument("unknown architecture '" + model_type +
                            "' (qwen3_moe, qwen2_moe, mixtral, deepseek_v2, deepseek_v3, kimi_k2, step3_text)");
  return make_preset_config(arch, preset);
}

Result<ModelConfig> make_preset_config(Arch arch, const std::string& preset) {
  if (arch == Arch::deepseek_v2 || arch == Arch::deepseek_v3) return deepseek_preset(arch, preset);
  if (arch == Arch::step3_text) return step3_preset(preset);
  ModelConfig c;
  c.arch = arch;
  c.model_type = arch_name(arch);
  switch (arch) {
    case Arch::qwen3_moe: c.architecture = "Qwen3MoeForCausalLM"; break;
    case Arch::qwen2_moe: c.architecture = "Qwen2MoeForCausalLM"; break;
    case Arch::mixtral: c.architecture = "MixtralForCausalLM"; break;
    default: break;
  }
  // qwen3_moe bench follows Qwen3-30B-A3B's attention shape (q_dim 4096 > hidden 2048);
  // qwen2_moe / mixtral keep head_dim == hidden / heads as their HF classes assume.
  const bool wide_q = arch == Arch::qwen3_moe;
  if (preset == "tiny") {
    c.vocab_size = 512; c.hidden_size = 64; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.head_dim = 16;
    c.n_experts = 8; c.n_experts_per_tok = 2; c.moe_intermediate_size = 32; c.intermediate_size = 128;
    c.shared_expert_intermediate_size = 64; c.max_position_embeddings = 4096;
  } else if (preset == "small") {
    c.vocab_size = 16000; c.hidden_size = 1024; c.n_layers = 4; c.n_heads = 16; c.n_kv_heads = 4; c.head_dim = 64;
    c.n_experts = 16; c.n_experts_per_tok = 4; c.moe_intermediate_size = 384; c.intermediate_size = 2048;
    c.shared_expert_intermediate_size = 1024; c.max_position_embeddings = 32768;
  } else if (preset == "bench") {
    c.vocab_size = 32000; c.hidden_size = 2048; c.n_layers = 6; c.n_kv_heads = 4; c.head_dim = 128;
    c.n_heads = wide_q ? 32 : 16;
    c.n_experts = 32; c.n_experts_per_tok = 8; c.moe_intermediate_size = 512; c.intermediate_size = 6144;
    c.shared_expert_intermediate_size = 2048; c.max_position_embeddings = 32768;
  } else {
    return invalid_argument("unknown preset '" + preset + "' (tiny, small, bench)");
  }
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.decoder_sparse_step = 1;
  c.norm_topk_prob = true;
  c.qk_norm = arch == Arch::qwen3_moe;
  c.attention_bias = arch == Arch::qwen2_moe;
  if (arch != Arch::qwen2_moe) c.shared_expert_intermediate_size = 0;
  if (arch == Arch::mixtral) c.intermediate_size = c.moe_intermediate_size;
  if (arch == Arch::qwen2_moe) c.norm_topk_prob = false;  // Qwen1.5-MoE's setting
  AFD_RETURN_IF_ERROR(c.validate());
  return c;
}

std::string model_config_to_json(const ModelConfig& c, DType dtype) {
  ordered_json j;
  if (c.arch == Arch::deepseek_v2 || c.arch == Arch::deepseek_v3) {
    j = deepseek_config_json(c);
  } else if (c.arch == Arch::step3_text) {
    // Written as the published checkpoints are: a step3_vl config whose text_config holds the
    // LLM (no vision tower here: a text-only engine ignores it).
    j["architectures"] = {"Step3VLForConditionalGeneration"};
    j["model_type"] = "step3_vl";
    j["text_config"] = step3_text_config_json(c, dtype);
    j["tie_word_embeddings"] = false;
  }
  if (j.is_null()) {
    j["architectures"] = {c.architecture.empty() ? std::string(arch_name(c.arch)) : c.architecture};
    j["model_type"] = arch_name(c.arch);
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    j["use_cache"] = true;
    j["num_experts_per_tok"] = c.n_experts_per_tok;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.001;
    if (c.arch == Arch::mixtral) {
      j["num_local_experts"] = c.n_experts;
      j["intermediate_size"] = c.moe_intermediate_size;
      if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
      else j["sliding_window"] = nullptr;
    } else {
      j["num_experts"] = c.n_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["intermediate_size"] = c.intermediate_size;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layers;
      if (c.arch == Arch::qwen2_moe) {
        j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
      } else {
        j["attention_bias"] = false;
      }
    }
  }
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty()) j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = torch_dtype_name(dtype);
  if (c.weight_quant == WeightQuant::fp8_block || dtype == DType::f8_e4m3) {
    ordered_json q;
    q["activation_scheme"] = "dynamic";
    q["fmt"] = "e4m3";
    q["quant_method"] = "fp8";
    q["weight_block_size"] = {kernels::kFp8Block, kernels::kFp8Block};
    j["quantization_config"] = q;
  }
  j["transformers_version"] = "4.51.0";
  return j.dump(2) + "\n";
}

Result<MakeModelReport> make_model(const ModelConfig& config, const MakeModelOptions& opt) {
  AFD_RETURN_IF_ERROR(config.validate());
  if (opt.dtype != DType::bf16 && opt.dtype != DType::f16 && opt.dtype != DType::f32 && opt.dtype != DType::f8_e4m3) {
    return invalid_argument(std::string("dtype ") + dtype_name(opt.dtype) +
                            " is not a weight dtype (bf16, f16, f32, f8_e4m3)");
  }
  if (opt.shard_size == 0) return invalid_argument("shard size must be positive");
  if (opt.out_dir.empty()) return invalid_argument("no output directory");
  if (opt.layout == ExpertLayout::fused && config.arch != Arch::qwen3_moe && config.arch != Arch::qwen2_moe &&
      config.arch != Arch::mixtral) {
    return invalid_argument(std::string("the fused expert layout is for qwen/mixtral checkpoints; ") +
                            arch_name(config.arch) + " has its own (" +
                            (config.arch == Arch::step3_text ? "stacked moe.*_proj" : "per-expert") + ")");
  }
  const bool deepseek = config.arch == Arch::deepseek_v2 || config.arch == Arch::deepseek_v3;
  if (config.num_nextn_predict_layers > 0 && !deepseek)
    return invalid_argument(std::string("num_nextn_predict_layers: MTP modules are DeepSeek's (deepseek_v2, "
                                        "deepseek_v3), not ") +
                            arch_name(config.arch) + "'s");
  const bool fp8 = opt.dtype == DType::f8_e4m3;
  const DType base = fp8 ? DType::bf16 : opt.dtype;  // FP8 checkpoints keep the rest in bf16
  const std::vector<Stored> stored = Planner(config, opt.layout).plan();
  // Trained weights: every piece must be in the file with its shape, and nothing else.
  std::optional<WeightsFile> weights;
  if (!opt.weights_path.empty()) {
    AFD_ASSIGN_OR_RETURN(WeightsFile w, WeightsFile::open(opt.weights_path));
    weights.emplace(std::move(w));
    for (const Stored& t : stored) {
      for (const Piece& p : t.pieces) AFD_RETURN_IF_ERROR(weights->claim(p.name, p.shape));
    }
    AFD_RETURN_IF_ERROR(weights->check_all_claimed());
  }
  const ValueSource src{opt.seed, weights ? &*weights : nullptr};
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) return io_error(opt.out_dir + ": cannot create directory: " + ec.message());
  AFD_RETURN_IF_ERROR(remove_checkpoint_tensors(opt.out_dir));

  // config.json must describe exactly `config`: a field this writer does not spell out (one a
  // given config.json had) is refused rather than silently dropped.
  const std::string config_text = model_config_to_json(config, opt.dtype);
  AFD_RETURN_IF_ERROR(check_config_round_trip(config, opt.dtype, config_text));

  MakeModelReport rep;
  const std::string dir = opt.out_dir;
  const std::string cfg_path = dir + "/config.json";
  AFD_RETURN_IF_ERROR(write_text_file(cfg_path, config_text));
  rep.files.push_back(cfg_path);

  ordered_json gen;
  gen["bos_token_id"] = config.bos_token_id >= 0 ? json(config.bos_token_id) : json(nullptr);
  if (config.eos_token_ids.size() == 1) gen["eos_token_id"] = config.eos_token_ids[0];
  else gen["eos_token_id"] = config.eos_token_ids;
  gen["do_sample"] = false;
  gen["transformers_version"] = "4.51.0";
  const std::string gen_path = dir + "/generation_config.json";
  AFD_RETURN_IF_ERROR(write_text_file(gen_path, gen.dump(2) + "\n"));
  rep.files.push_back(gen_path);

  // Tokenizer hook (serving side): the one place tokenizer files get written.
  if (opt.write_tokenizer) AFD_RETURN_IF_ERROR(opt.write_tokenizer(config, dir));

  // File tensors: each stored tensor, and after each FP8 one its block scales.
  struct Entry {
    const Stored* t;
    bool scale;  // the _scale_inv partner of the previous entry
  };
  std::vector<TensorSpec> specs;
  std::vector<Entry> entries;
  for (const Stored& t : stored) {
    if (fp8 && t.linear) {
      specs.push_back({t.name, DType::f8_e4m3, t.shape});
      entries.push_back({&t, false});
      specs.push_back({t.name + "_scale_inv", DType::f32, scale_shape(t.shape)});
      entries.push_back({&t, true});
    } else {
      specs.push_back({t.name, t.f32 ? DType::f32 : base, t.shape});
      entries.push_back({&t, false});
    }
  }
  std::vector<float> scales;  // of the last FP8 tensor written
  auto data = [&](size_t i, const ByteWriter& write) -> Status {
    const Entry& e = entries[i];
    if (e.scale) return write(scales.data(), scales.size() * sizeof(float));
    if (specs[i].dtype == DType::f8_e4m3) return write_fp8(*e.t, src, write, &scales);
    return write_dense(*e.t, specs[i].dtype, src, write);
  };
  AFD_ASSIGN_OR_RETURN(WrittenCheckpoint wc, write_checkpoint_tensors(dir, specs, opt.shard_size, data));
  rep.files.insert(rep.files.end(), wc.files.begin(), wc.files.end());
  rep.tensor_bytes = wc.tensor_bytes;
  rep.n_tensors = static_cast<int64_t>(specs.size());
  return rep;
}

std::vector<float> make_model_tensor_values(const ModelConfig& config, uint64_t seed, const std::string& name) {
  for (const Stored& t : Planner(config, ExpertLayout::per_expert).plan()) {
    for (const Piece& p : t.pieces) {
      if (p.name != name) continue;
      std::vector<float> v(static_cast<size_t>(p.numel()));
      TensorRng(seed, p.name, p.center, p.half).fill(v.data(), v.size());
      return v;
    }
  }
  return {};
}

}  // namespace afd
