#include "plan/model_presets.h"

#include <algorithm>
#include <cctype>

#include "plan/model_builders.h"

namespace afd::plan {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// DeepSeek-V3 (and Kimi K2, same MLA shape with 64 heads): config.json of
// deepseek-ai/DeepSeek-V3 and moonshotai/Kimi-K2-Instruct.
ModelSpec mla_model(std::string id, std::string display, int64_t n_heads, int64_t n_routed, int64_t n_dense) {
  ModelSpec m;
  m.id = std::move(id);
  m.display = std::move(display);
  m.hidden = 7168;
  m.n_layers = 61;
  MlaShape s{.hidden = 7168, .n_heads = n_heads, .q_lora = 1536, .kv_lora = 512, .rope_dim = 64,
             .nope_dim = 128, .v_head_dim = 128, .kv_elem_bytes = 1.0};
  m.attn.push_back(make_mla_group(61, s));
  m.ffn.push_back(make_dense_ffn(n_dense, 7168, 18432));
  m.ffn.push_back(make_moe_ffn(61 - n_dense, 7168, 2048, n_routed, 8, 2048));
  m.notes = "FP8 weights and FP8 MLA latent cache (Step-3 paper §4.1)";
  return m;
}

ModelSpec gqa_model(std::string id, std::string display, int64_t n_layers, GqaShape s) {
  ModelSpec m;
  m.id = std::move(id);
  m.display = std::move(display);
  m.hidden = s.hidden;
  m.n_layers = n_layers;
  m.attn.push_back(make_gqa_group(s.q_lora > 0 ? "MFA" : "GQA", n_layers, s));
  return m;
}

}  // namespace

std::vector<ModelSpec> model_presets() {
  std::vector<ModelSpec> v;
  // DeepSeek-V3: 3 dense layers, 58 MoE layers of 256 routed (top-8) + 1 shared expert.
  v.push_back(mla_model("deepseek-v3", "DSv3", 128, 256, 3));
  // Kimi K2: 1 dense layer, 60 MoE layers of 384 routed (top-8) + 1 shared expert.
  v.push_back(mla_model("kimi-k2", "Kimi K2", 64, 384, 1));
  {  // Qwen3-235B-A22B: 94 layers, 64 q heads / 4 kv heads x 128, 128 experts top-8 of 1536.
    ModelSpec m = gqa_model("qwen3-235b-a22b", "Qwen3 MoE", 94,
                            {.hidden = 4096, .n_heads = 64, .n_kv_heads = 4, .head_dim = 128});
    m.ffn.push_back(make_moe_ffn(94, 4096, 1536, 128, 8, 0));
    m.notes = "FP8 weights and KV (official FP8 release)";
    v.push_back(m);
  }
  {  // Qwen3-32B: dense, 64 layers, 64 q heads / 8 kv heads x 128, intermediate 25600.
    ModelSpec m = gqa_model("qwen3-32b", "Qwen3 32B", 64,
                            {.hidden = 5120, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128});
    m.ffn.push_back(make_dense_ffn(64, 5120, 25600));
    m.notes = "FP8 weights and KV (official FP8 release)";
    v.push_back(m);
  }
  {  // Llama 4 Maverick: 48 layers, every 4th a global (NoPE) full-attention layer with BF16 KV,
     // the other 36 chunked attention (chunk 8192) with FP8 KV; MoE on every other layer
     // (128 experts top-1 of 8192 + shared 8192), dense MLP 16384 on the rest.
    ModelSpec m;
    m.id = "llama4-maverick";
    m.display = "Llama 4 M";
    m.hidden = 5120;
    m.n_layers = 48;
    GqaShape full{.hidden = 5120, .n_heads = 40, .n_kv_heads = 8, .head_dim = 128, .kv_elem_bytes = 2.0};
    GqaShape chunked = full;
    chunked.kv_elem_bytes = 1.0;
    m.attn.push_back(make_gqa_group("GQA (global)", 12, full));
    m.attn.push_back(make_gqa_group("GQA (chunked)", 36, chunked, AttnKind::chunked, 8192));
    m.ffn.push_back(make_dense_ffn(24, 5120, 16384));
    m.ffn.push_back(make_moe_ffn(24, 5120, 8192, 128, 1, 8192));
    m.notes = "BF16 KV for the 12 global layers, FP8 KV for chunked layers, FP8 weights";
    v.push_back(m);
  }
  {  // MiniMax M1: 80 layers = 70 lightning (linear) + 10 softmax GQA (64 q / 8 kv heads x 128);
     // MoE 32 experts top-2 of 9216 on every layer.
    ModelSpec m;
    m.id = "minimax-m1";
    m.display = "MM M1";
    m.hidden = 6144;
    m.n_layers = 80;
    m.attn.push_back(make_linear_attn_group(
        70, {.hidden = 6144, .n_heads = 64, .head_dim = 128, .state_elem_bytes = 4.0, .output_gate = true}));
    m.attn.push_back(make_gqa_group(
        "GQA", 10, {.hidden = 6144, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128, .kv_elem_bytes = 2.0}));
    m.ffn.push_back(make_moe_ffn(80, 6144, 9216, 32, 2, 0));
    m.notes = "BF16 KV for softmax layers, FP32 lightning-attention state, FP8 weights";
    v.push_back(m);
  }
  {  // ERNIE 4.5 300B-A47B: 54 layers, 64 q / 8 kv heads x 128, first 3 dense (28672),
     // 51 MoE layers of 64 experts top-8 of 3584.
    ModelSpec m = gqa_model("ernie-4.5-300b-a47b", "ERNIE 4.5", 54,
                            {.hidden = 8192, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128});
    m.ffn.push_back(make_dense_ffn(3, 8192, 28672));
    m.ffn.push_back(make_moe_ffn(51, 8192, 3584, 64, 8, 0));
    m.notes = "FP8 weights and KV (aligned with Qwen3, Step-3 paper §4.1)";
    v.push_back(m);
  }
  {  // Pangu Pro MoE (72B-A16B): 48 layers, 40 q / 8 kv heads x 128, 64 experts top-8 of 1344
     // plus shared experts of 4 x 1344.
    ModelSpec m = gqa_model("pangu-pro-moe", "Pangu Pro", 48,
                            {.hidden = 5120, .n_heads = 40, .n_kv_heads = 8, .head_dim = 128});
    m.ffn.push_back(make_moe_ffn(48, 5120, 1344, 64, 8, 4 * 1344));
    m.notes = "FP8 weights and KV (aligned with Qwen3, Step-3 paper §4.1)";
    v.push_back(m);
  }
  {  // Step-3 (the Step-3 paper, Table 1): 61 layers, MFA with 64 query heads sharing one K and one V
     // head of 256, query low rank 2048; MoE (48 experts top-3 of 5120 + shared 5120) on all
     // layers except the first four and the last (dense 18432).
    ModelSpec m = gqa_model("step3", "Step-3", 61,
                            {.hidden = 7168, .n_heads = 64, .n_kv_heads = 1, .head_dim = 256, .q_lora = 2048});
    m.ffn.push_back(make_dense_ffn(5, 7168, 18432));
    m.ffn.push_back(make_moe_ffn(56, 7168, 5120, 48, 3, 5120));
    m.notes = "full FP8 (Step-3 paper §4.1)";
    v.push_back(m);
  }
  return v;
}

Result<ModelSpec> find_model_preset(const std::string& name) {
  const std::string n = lower(name);
  static const std::pair<const char*, const char*> kAliases[] = {
      {"dsv3", "deepseek-v3"},          {"deepseek-v3-0324", "deepseek-v3"}, {"qwen3-moe", "qwen3-235b-a22b"},
      {"ernie4.5", "ernie-4.5-300b-a47b"}, {"ernie-4.5", "ernie-4.5-300b-a47b"}, {"llama-4-maverick", "llama4-maverick"},
      {"mm-m1", "minimax-m1"},           {"pangu-pro", "pangu-pro-moe"},      {"step-3", "step3"},
  };
  std::string id = n;
  for (const auto& [a, b] : kAliases)
    if (n == a) id = b;
  std::string known;
  for (auto& m : model_presets()) {
    if (m.id == id) return m;
    known += (known.empty() ? "" : ", ") + m.id;
  }
  return not_found("unknown model preset '" + name + "' (known: " + known + ")");
}

}  // namespace afd::plan
