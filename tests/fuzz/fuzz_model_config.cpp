// libFuzzer target: parse_model_config() on arbitrary bytes (config.json of any family:
// qwen3_moe, qwen2_moe, mixtral, deepseek_v2/v3, kimi_k2, step3_text, step3_vl). Any input
// must give a config or an error Status with a message, never a crash, a sanitizer report or
// an unbounded allocation. An accepted config must satisfy what the loader and the router
// rely on (validate(), expert groups that tile the experts, top-k within reach).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto r = afd::parse_model_config(text, "fuzz/config.json");
  if (!r.ok()) {
    if (r.status().message().empty()) std::abort();
    return 0;
  }
  const afd::ModelConfig& c = *r;
  if (!c.validate().is_ok()) std::abort();
  if (c.n_group < 1 || c.n_experts % c.n_group != 0 || c.topk_group > c.n_group) std::abort();
  if (c.n_experts_per_tok < 1 || c.n_experts_per_tok > c.n_experts) std::abort();
  if (c.topk_method != afd::TopkMethod::greedy && c.n_experts_per_tok > c.topk_group * (c.n_experts / c.n_group))
    std::abort();
  if (c.attention == afd::AttentionKind::mla && (c.kv_lora_rank < 1 || c.qk_rope_head_dim % 2 != 0)) std::abort();
  int64_t moe = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) moe += c.is_moe_layer(l);
  if (moe > c.n_layers) std::abort();
  return 0;
}
