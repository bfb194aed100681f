#include "model/make_model.h"

#include "core/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "kernels/cpu/linear_fp8.h"
#include "model/checkpoint.h"
#include "model/safetensors_writer.h"

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

// A logical tensor: one HF per-expert name with its initialisation.
struct Piece {
  std::string name;
  int64_t numel = 0;
  float center = 0, half = 0;
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
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

Piece matrix_piece(const std::string& name, int64_t rows, int64_t cols) {
  return Piece{name, rows * cols, 0.0f, std::sqrt(3.0f / static_cast<float>(cols))};
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
    return std::move(out_);
  }

 private:
  void mat(const std::string& name, int64_t rows, int64_t cols, bool linear = true) {
    out_.push_back(Stored{name, {rows, cols}, {matrix_piece(name, rows, cols)}, linear});
  }
  void norm(const std::string& name, int64_t n) { out_.push_back(Stored{name, {n}, {Piece{name, n, 1.0f, 0.1f}}}); }
  void bias(const std::string& name, int64_t n) { out_.push_back(Stored{name, {n}, {Piece{name, n, 0.0f, 0.05f}}}); }
  void ffn(const std::string& gate, const std::string& up, const std::string& down, int64_t inter) {
    mat(gate, inter, c_.hidden_size);
    mat(up, inter, c_.hidden_size);
    mat(down, c_.hidden_size, inter);
  }

  void layer(int64_t l) {
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

// The values of a stored tensor in order, across its pieces.
class ValueStream {
 public:
  ValueStream(const Stored& t, uint64_t seed) : t_(t), seed_(seed) {}
  void fill(float* out, size_t n) {
    while (n > 0) {
      if (left_ == 0) {
        const Piece& p = t_.pieces[next_++];
        rng_ = std::make_unique<TensorRng>(seed_, p.name, p.center, p.half);
        left_ = static_cast<size_t>(p.numel);
        continue;
      }
      const size_t k = std::min(n, left_);
      rng_->fill(out, k);
      out += k;
      n -= k;
      left_ -= k;
    }
  }

 private:
  const Stored& t_;
  uint64_t seed_;
  size_t next_ = 0, left_ = 0;
  std::unique_ptr<TensorRng> rng_;
};

// Streams a tensor's values converted to a dense dtype (f32, bf16, f16).
Status write_dense(const Stored& t, DType dtype, uint64_t seed, const ByteWriter& write) {
  constexpr size_t kChunk = size_t{1} << 20;  // elements per generated chunk
  const size_t esize = dtype_size(dtype);
  std::vector<float> vals(kChunk);
  std::vector<uint8_t> bytes(kChunk * esize);
  ValueStream vs(t, seed);
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
  return Status::ok();
}

// Streams a 2-D [R, C] or 3-D [E, R, C] tensor quantized to FP8 blocks, 128 rows at a time
// (memory O(128 * C)); its block scales [.., ceil(R/128), ceil(C/128)] go to *scales.
Status write_fp8(const Stored& t, uint64_t seed, const ByteWriter& write, std::vector<float>* scales) {
  const int64_t bs = kernels::kFp8Block;
  const int64_t R = t.shape[t.shape.size() - 2], C = t.shape.back();
  const int64_t slabs = t.shape.size() == 3 ? t.shape[0] : 1;
  const int64_t bcols = (C + bs - 1) / bs;
  std::vector<float> vals(static_cast<size_t>(bs * C));
  std::vector<uint8_t> q(vals.size());
  std::vector<float> s(static_cast<size_t>(bcols));
  scales->clear();
  ValueStream vs(t, seed);
  for (int64_t e = 0; e < slabs; ++e) {
    for (int64_t r0 = 0; r0 < R; r0 += bs) {
      const int64_t nr = std::min(bs, R - r0);
      vs.fill(vals.data(), static_cast<size_t>(nr * C));
      kernels::quantize_fp8_blocks(vals.data(), nr, C, q.data(), s.data());
      AFD_RETURN_IF_ERROR(write(q.data(), static_cast<size_t>(nr * C)));
      scales->insert(scales->end(), s.begin(), s.end());
    }
  }
  return Status::ok();
}

std::vector<int64_t> scale_shape(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s = shape;
  const int64_t bs = kernels::kFp8Block;
  for (size_t i = s.size() - 2; i < s.size(); ++i) s[i] = (s[i] + bs - 1) / bs;
  return s;
}

}  // namespace

Result<ModelConfig> make_preset_config(Arch arch, const std::string& preset) {
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
  const bool fp8 = opt.dtype == DType::f8_e4m3;
  const DType base = fp8 ? DType::bf16 : opt.dtype;  // FP8 checkpoints keep the rest in bf16
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) return io_error(opt.out_dir + ": cannot create directory: " + ec.message());
  AFD_RETURN_IF_ERROR(remove_checkpoint_tensors(opt.out_dir));

  MakeModelReport rep;
  const std::string dir = opt.out_dir;
  const std::string cfg_path = dir + "/config.json";
  AFD_RETURN_IF_ERROR(write_text_file(cfg_path, model_config_to_json(config, opt.dtype)));
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

  const std::vector<Stored> stored = Planner(config, opt.layout).plan();
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
      specs.push_back({t.name, base, t.shape});
      entries.push_back({&t, false});
    }
  }
  std::vector<float> scales;  // of the last FP8 tensor written
  auto data = [&](size_t i, const ByteWriter& write) -> Status {
    const Entry& e = entries[i];
    if (e.scale) return write(scales.data(), scales.size() * sizeof(float));
    if (specs[i].dtype == DType::f8_e4m3) return write_fp8(*e.t, opt.seed, write, &scales);
    return write_dense(*e.t, specs[i].dtype, opt.seed, write);
  };
  AFD_ASSIGN_OR_RETURN(WrittenCheckpoint wc, write_checkpoint_tensors(dir, specs, opt.shard_size, data));
  rep.files.insert(rep.files.end(), wc.files.begin(), wc.files.end());
  rep.tensor_bytes = wc.tensor_bytes;
  rep.n_tensors = static_cast<int64_t>(specs.size());
  return rep;
}

std::vector<float> make_model_tensor_values(const ModelConfig& config, uint64_t seed, const std::string& name) {
  for (const Stored& t : Planner(config, ExpertLayout::per_expert).plan()) {
    if (t.name != name) continue;
    const Piece& p = t.pieces[0];
    std::vector<float> v(static_cast<size_t>(p.numel));
    TensorRng(seed, p.name, p.center, p.half).fill(v.data(), v.size());
    return v;
  }
  return {};
}

}  // namespace afd
