// afd make-model: writes a random-weight checkpoint in the Hugging Face layout.
//   afd make-model --arch qwen3_moe --preset tiny --seed 1 --out models/tiny
//       (--arch: qwen3_moe | qwen2_moe | mixtral | deepseek_v2 | deepseek_v3 | kimi_k2 | step3_text)
//       [--layout per-expert|fused] [--dtype bf16|f16|f32|fp8] [--shard-size BYTES] [--tied]
//       [size overrides: --hidden --layers --heads --kv-heads --head-dim --experts --top-k
//        --moe-inter --inter --shared-inter --vocab --sparse-step --mlp-only-layers
//        --norm-topk-prob --max-pos]
#include <chrono>
#include <cstdio>
#include <map>

#include "commands.h"
#include "serve/text/tokenizer_writer.h"
#include "model/make_model.h"

namespace afd::cli {

namespace {

struct MakeModelFlags {
  std::string arch = "qwen3_moe";
  std::string preset = "tiny";
  std::string layout = "per-expert";
  std::string dtype = "bf16";
  std::string out;
  uint64_t seed = 1;
  uint64_t shard_size = 2'000'000'000;
  bool tied = false;
  // Overrides of the preset; -1 = keep the preset's value.
  int64_t hidden = -1, layers = -1, heads = -1, kv_heads = -1, head_dim = -1, experts = -1, top_k = -1;
  int64_t moe_inter = -1, inter = -1, shared_inter = -1, vocab = -1, sparse_step = -1, max_pos = -1;
  std::vector<int64_t> mlp_only_layers;
  std::string norm_topk_prob;  // "" = preset, "true" | "false"
};

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "afd make-model: %s\n", msg.c_str());
  throw CLI::RuntimeError(1);
}

void run(const MakeModelFlags& f, bool mlp_only_given) {
  // The message names the unknown architecture or preset.
  auto preset = make_preset_config(f.arch, f.preset);
  if (!preset.ok()) fail("--arch / --preset: " + preset.status().message());
  ModelConfig c = *preset;
  const Arch arch = c.arch;
  auto set = [](int64_t v, int64_t* field) {
    if (v >= 0) *field = v;
  };
  set(f.hidden, &c.hidden_size);
  set(f.layers, &c.n_layers);
  set(f.heads, &c.n_heads);
  set(f.kv_heads, &c.n_kv_heads);
  set(f.head_dim, &c.head_dim);
  set(f.experts, &c.n_experts);
  set(f.top_k, &c.n_experts_per_tok);
  set(f.moe_inter, &c.moe_intermediate_size);
  set(f.inter, &c.intermediate_size);
  set(f.shared_inter, &c.shared_expert_intermediate_size);
  set(f.vocab, &c.vocab_size);
  set(f.sparse_step, &c.decoder_sparse_step);
  set(f.max_pos, &c.max_position_embeddings);
  if (arch == Arch::mixtral) c.intermediate_size = c.moe_intermediate_size;
  const bool deepseek = arch == Arch::deepseek_v2 || arch == Arch::deepseek_v3;
  if (deepseek) {
    // DeepSeek's shared experts are n_shared_experts routed-expert-sized FFNs.
    if (f.shared_inter >= 0) fail("--shared-inter: deepseek's shared width is n_shared_experts * --moe-inter");
    c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  } else if (arch != Arch::qwen2_moe && arch != Arch::step3_text && c.shared_expert_intermediate_size > 0) {
    fail("--shared-inter: only qwen2_moe and step3_text have a shared expert");
  }
  if (f.tied && arch == Arch::step3_text) fail("--tied: step3_text checkpoints are untied");
  if (mlp_only_given) c.mlp_only_layers = f.mlp_only_layers;
  if (f.norm_topk_prob == "true") c.norm_topk_prob = true;
  else if (f.norm_topk_prob == "false") c.norm_topk_prob = false;
  else if (!f.norm_topk_prob.empty()) fail("--norm-topk-prob: expected true or false");
  if (arch == Arch::mixtral && !c.norm_topk_prob) fail("--norm-topk-prob: mixtral always renormalises");
  c.tie_word_embeddings = f.tied;
  // Special tokens take the top ids of the written tokenizer (serve/text/tokenizer_writer.h):
  // <|endoftext|> = V-3 (bos, and an eos as in Qwen's generation_config), <|im_end|> = V-1.
  if (c.vocab_size >= 260) {
    c.bos_token_id = c.vocab_size - 3;
    c.eos_token_ids = {c.vocab_size - 1, c.vocab_size - 3};
  }
  if (Status s = c.validate(); !s.is_ok()) fail("invalid model shape: " + s.message());

  MakeModelOptions opt;
  opt.out_dir = f.out;
  opt.seed = f.seed;
  opt.shard_size = f.shard_size;
  if (f.layout == "per-expert") opt.layout = ExpertLayout::per_expert;
  else if (f.layout == "fused") opt.layout = ExpertLayout::fused;
  else fail("--layout '" + f.layout + "': expected per-expert or fused");
  if (f.dtype == "bf16") opt.dtype = DType::bf16;
  else if (f.dtype == "f16") opt.dtype = DType::f16;
  else if (f.dtype == "f32") opt.dtype = DType::f32;
  else if (f.dtype == "fp8") opt.dtype = DType::f8_e4m3;
  else fail("--dtype '" + f.dtype + "': expected bf16, f16, f32 or fp8");
  // Tokenizer files (tokenizer.json byte-level BPE + tokenizer_config.json with a chat template).
  if (c.vocab_size >= 260) opt.write_tokenizer = write_tokenizer_for_model;

  const auto t0 = std::chrono::steady_clock::now();
  auto rep = make_model(c, opt);
  if (!rep.ok()) fail(rep.status().to_string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %s %s, %lld tensors, %.1f MB of weights (%s), %zu file(s), %.2f s\n", f.out.c_str(),
              c.model_type.c_str(), f.preset.c_str(), static_cast<long long>(rep->n_tensors),
              static_cast<double>(rep->tensor_bytes) / 1e6, f.dtype.c_str(), rep->files.size(), secs);
}

}  // namespace

void register_make_model(CLI::App& app) {
  auto f = std::make_shared<MakeModelFlags>();
  auto* cmd = app.add_subcommand("make-model", "Write a random-weight Hugging Face checkpoint (tests, benchmarks)");
  cmd->add_option("--arch", f->arch, "qwen3_moe | qwen2_moe | mixtral | deepseek_v2 | deepseek_v3 | kimi_k2 | step3_text")
      ->capture_default_str();
  cmd->add_option("--preset", f->preset, "tiny | small | bench")->capture_default_str();
  cmd->add_option("--seed", f->seed, "weight RNG seed")->capture_default_str();
  cmd->add_option("--out", f->out, "output directory")->required();
  cmd->add_option("--layout", f->layout, "expert tensors: per-expert | fused (mlp.experts.gate_up_proj)")
      ->capture_default_str();
  cmd->add_option("--dtype", f->dtype,
                  "bf16 | f16 | f32 | fp8 (FP8 e4m3 projections with 128x128 float32 block scales, the rest bf16)")
      ->capture_default_str();
  cmd->add_option("--shard-size", f->shard_size, "bytes per safetensors shard")->capture_default_str();
  cmd->add_flag("--tied", f->tied, "tie_word_embeddings (no lm_head.weight)");
  cmd->add_option("--hidden", f->hidden, "override hidden_size");
  cmd->add_option("--layers", f->layers, "override num_hidden_layers");
  cmd->add_option("--heads", f->heads, "override num_attention_heads");
  cmd->add_option("--kv-heads", f->kv_heads, "override num_key_value_heads");
  cmd->add_option("--head-dim", f->head_dim, "override head_dim");
  cmd->add_option("--experts", f->experts, "override num_experts");
  cmd->add_option("--top-k", f->top_k, "override num_experts_per_tok");
  cmd->add_option("--moe-inter", f->moe_inter, "override moe_intermediate_size");
  cmd->add_option("--inter", f->inter, "override intermediate_size (dense layers)");
  cmd->add_option("--shared-inter", f->shared_inter, "override shared_expert_intermediate_size (qwen2_moe; 0: none)");
  cmd->add_option("--vocab", f->vocab, "override vocab_size");
  cmd->add_option("--sparse-step", f->sparse_step, "override decoder_sparse_step");
  auto* mlp_only = cmd->add_option("--mlp-only-layers", f->mlp_only_layers, "dense layers, e.g. 0,3")->delimiter(',');
  cmd->add_option("--norm-topk-prob", f->norm_topk_prob, "override norm_topk_prob (true|false)");
  cmd->add_option("--max-pos", f->max_pos, "override max_position_embeddings");
  cmd->callback([f, mlp_only] { run(*f, mlp_only->count() > 0); });
}

}  // namespace afd::cli
