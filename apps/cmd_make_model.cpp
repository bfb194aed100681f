// afd make-model: writes a checkpoint in the Hugging Face layout, random or from given weights.
//   afd make-model --arch qwen3_moe --preset tiny --seed 1 --out models/tiny
//       (--arch: qwen3_moe | qwen2_moe | mixtral | deepseek_v2 | deepseek_v3 | kimi_k2 | step3_text)
//       [--layout per-expert|fused] [--dtype bf16|f16|f32|fp8] [--shard-size BYTES] [--tied]
//       [--mtp N] [size overrides: --hidden --layers --heads --kv-heads --head-dim --experts --top-k
//        --moe-inter --inter --shared-inter --vocab --sparse-step --mlp-only-layers
//        --norm-topk-prob --max-pos]
//   afd make-model --config CONFIG.json|DIR [--weights W.safetensors] [--tokenizer DIR] --out DIR
//       [--dtype ...] [--layout ...] [--shard-size ...]
//       --config replaces --arch / --preset and every preset setting (sizes, --tied, --mtp are
//       refused with it); --weights takes the values from a safetensors file
//       (MakeModelOptions::weights_path); --tokenizer copies a tokenizer instead of writing one.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "commands.h"
#include "engine_flags.h"
#include "serve/text/tokenizer_writer.h"
#include "model/tools/make_model.h"

namespace afd::cli {

namespace {

struct MakeModelFlags {
  std::string arch = "qwen3_moe";
  std::string preset = "tiny";
  std::string layout = "per-expert";
  std::string dtype = "bf16";
  std::string out;
  std::string config;     // an HF config.json (or a directory holding one) instead of a preset
  std::string weights;    // safetensors file with the tensor values
  std::string tokenizer;  // directory whose tokenizer files are copied
  int64_t mtp = 0;        // num_nextn_predict_layers (deepseek)
  uint64_t seed = 1;
  uint64_t shard_size = 2'000'000'000;
  bool tied = false;
  // Overrides of the preset; -1 = keep the preset's value.
  int64_t hidden = -1, layers = -1, heads = -1, kv_heads = -1, head_dim = -1, experts = -1, top_k = -1;
  int64_t moe_inter = -1, inter = -1, shared_inter = -1, vocab = -1, sparse_step = -1, max_pos = -1;
  std::vector<int64_t> mlp_only_layers;
  std::string norm_topk_prob;  // "" = preset, "true" | "false"
};

// The configuration of --config: a config.json file, or a model directory (its config.json
// and generation_config.json, load_model_config).
ModelConfig config_from_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    auto c = load_model_config(path);
    if (!c.ok()) fail("make-model", "--config: " + c.status().to_string());
    return *c;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("make-model", "--config: " + path + ": cannot open for reading");
  std::ostringstream text;
  text << in.rdbuf();
  auto c = parse_model_config(text.str(), path);
  if (!c.ok()) fail("make-model", "--config: " + c.status().to_string());
  return *c;
}

// The configuration of --arch / --preset with the size overrides applied.
ModelConfig config_from_preset(const MakeModelFlags& f, bool mlp_only_given) {
  // The message names the unknown architecture or preset.
  auto preset = make_preset_config(f.arch, f.preset);
  if (!preset.ok()) fail("make-model", "--arch / --preset: " + preset.status().message());
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
    if (f.shared_inter >= 0) {
      fail("make-model", "--shared-inter: deepseek's shared width is n_shared_experts * --moe-inter");
    }
    c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
  } else if (arch != Arch::qwen2_moe && arch != Arch::step3_text && c.shared_expert_intermediate_size > 0) {
    fail("make-model", "--shared-inter: only qwen2_moe and step3_text have a shared expert");
  }
  if (f.tied && arch == Arch::step3_text) fail("make-model", "--tied: step3_text checkpoints are untied");
  if (mlp_only_given) c.mlp_only_layers = f.mlp_only_layers;
  if (f.norm_topk_prob == "true") c.norm_topk_prob = true;
  else if (f.norm_topk_prob == "false") c.norm_topk_prob = false;
  else if (!f.norm_topk_prob.empty()) fail("make-model", "--norm-topk-prob: expected true or false");
  if (arch == Arch::mixtral && !c.norm_topk_prob) fail("make-model", "--norm-topk-prob: mixtral always renormalises");
  c.tie_word_embeddings = f.tied;
  if (f.mtp < 0) fail("make-model", "--mtp: must be >= 0");
  if (f.mtp > 0 && !deepseek) {
    fail("make-model", "--mtp: MTP modules are DeepSeek's (deepseek_v2, deepseek_v3, kimi_k2)");
  }
  c.num_nextn_predict_layers = f.mtp;
  // Special tokens take the top ids of the written tokenizer (serve/text/tokenizer_writer.h):
  // <|endoftext|> = V-3 (bos, and an eos as in Qwen's generation_config), <|im_end|> = V-1.
  // A copied tokenizer (--tokenizer) keeps the preset's ids.
  if (c.vocab_size >= 260 && f.tokenizer.empty()) {
    c.bos_token_id = c.vocab_size - 3;
    c.eos_token_ids = {c.vocab_size - 1, c.vocab_size - 3};
  }
  if (Status s = c.validate(); !s.is_ok()) fail("make-model", "invalid model shape: " + s.message());
  return c;
}

void run(const MakeModelFlags& f, bool mlp_only_given, const std::vector<CLI::Option*>& preset_options) {
  ModelConfig c;
  if (!f.config.empty()) {
    for (const CLI::Option* o : preset_options) {
      if (o->count() > 0) fail("make-model", o->get_name() + ": not with --config (the config file sets the model)");
    }
    c = config_from_file(f.config);
    // The file's quantization follows --dtype, not the source config.
    c.weight_quant = WeightQuant::none;
  } else {
    c = config_from_preset(f, mlp_only_given);
  }

  MakeModelOptions opt;
  opt.out_dir = f.out;
  opt.seed = f.seed;
  opt.weights_path = f.weights;
  opt.shard_size = f.shard_size;
  if (f.layout == "per-expert") opt.layout = ExpertLayout::per_expert;
  else if (f.layout == "fused") opt.layout = ExpertLayout::fused;
  else fail("make-model", "--layout '" + f.layout + "': expected per-expert or fused");
  if (f.dtype == "bf16") opt.dtype = DType::bf16;
  else if (f.dtype == "f16") opt.dtype = DType::f16;
  else if (f.dtype == "f32") opt.dtype = DType::f32;
  else if (f.dtype == "fp8") opt.dtype = DType::f8_e4m3;
  else fail("make-model", "--dtype '" + f.dtype + "': expected bf16, f16, f32 or fp8");
  // Tokenizer files: copied from --tokenizer, else written (tokenizer.json byte-level BPE +
  // tokenizer_config.json with a chat template).
  if (!f.tokenizer.empty()) {
    opt.write_tokenizer = [dir = f.tokenizer](const ModelConfig& config, const std::string& out) {
      return copy_tokenizer_files(dir, out, config.vocab_size).with_context("--tokenizer");
    };
  } else if (c.vocab_size >= 260) {
    opt.write_tokenizer = write_tokenizer_for_model;
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto rep = make_model(c, opt);
  if (!rep.ok()) fail("make-model", rep.status().to_string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string what = !f.config.empty() ? "from " + f.config : f.preset;
  std::printf("wrote %s: %s %s%s, %lld tensors, %.1f MB of weights (%s), %zu file(s), %.2f s\n", f.out.c_str(),
              c.model_type.c_str(), what.c_str(), f.weights.empty() ? "" : (", weights " + f.weights).c_str(),
              static_cast<long long>(rep->n_tensors), static_cast<double>(rep->tensor_bytes) / 1e6, f.dtype.c_str(),
              rep->files.size(), secs);
}

}  // namespace

void register_make_model(CLI::App& app) {
  auto f = std::make_shared<MakeModelFlags>();
  auto* cmd = app.add_subcommand("make-model",
                                 "Write a Hugging Face checkpoint: random weights (tests, benchmarks) or given ones");
  std::vector<CLI::Option*> preset_options;  // refused with --config
  auto preset_option = [&](CLI::Option* o) {
    preset_options.push_back(o);
    return o;
  };
  preset_option(cmd->add_option("--arch", f->arch,
                                "qwen3_moe | qwen2_moe | mixtral | deepseek_v2 | deepseek_v3 | kimi_k2 | step3_text"))
      ->capture_default_str();
  preset_option(cmd->add_option("--preset", f->preset, "tiny | small | bench"))->capture_default_str();
  cmd->add_option("--config", f->config,
                  "Hugging Face config.json (or a directory holding one, with generation_config.json) instead of "
                  "--arch/--preset; the written config.json parses back to the same configuration. Not with "
                  "--arch, --preset, --tied, --mtp or the size overrides");
  cmd->add_option("--weights", f->weights,
                  "safetensors file (F32/BF16/F16) with every tensor of the model under its per-expert Hugging Face "
                  "name (Step-3: model.layers.L.moe.experts.j.{gate,up,down}_proj.weight) and exact shape, nothing "
                  "else; written as --dtype");
  cmd->add_option("--tokenizer", f->tokenizer,
                  "copy tokenizer.json, tokenizer_config.json and chat_template.jinja from this directory instead of "
                  "writing the generated tokenizer (a preset then keeps bos 1 / eos 2)");
  cmd->add_option("--seed", f->seed, "weight RNG seed")->capture_default_str();
  cmd->add_option("--out", f->out, "output directory")->required();
  cmd->add_option("--layout", f->layout, "expert tensors: per-expert | fused (mlp.experts.gate_up_proj)")
      ->capture_default_str();
  cmd->add_option("--dtype", f->dtype,
                  "bf16 | f16 | f32 | fp8 (FP8 e4m3 projections with 128x128 float32 block scales, the rest bf16)")
      ->capture_default_str();
  cmd->add_option("--shard-size", f->shard_size, "bytes per safetensors shard")->capture_default_str();
  preset_option(cmd->add_flag("--tied", f->tied, "tie_word_embeddings (no lm_head.weight)"));
  preset_option(cmd->add_option("--mtp", f->mtp,
                                "num_nextn_predict_layers: DeepSeek MTP modules after the main layers (default 0)"));
  preset_option(cmd->add_option("--hidden", f->hidden, "override hidden_size"));
  preset_option(cmd->add_option("--layers", f->layers, "override num_hidden_layers"));
  preset_option(cmd->add_option("--heads", f->heads, "override num_attention_heads"));
  preset_option(cmd->add_option("--kv-heads", f->kv_heads, "override num_key_value_heads"));
  preset_option(cmd->add_option("--head-dim", f->head_dim, "override head_dim"));
  preset_option(cmd->add_option("--experts", f->experts, "override num_experts"));
  preset_option(cmd->add_option("--top-k", f->top_k, "override num_experts_per_tok"));
  preset_option(cmd->add_option("--moe-inter", f->moe_inter, "override moe_intermediate_size"));
  preset_option(cmd->add_option("--inter", f->inter, "override intermediate_size (dense layers)"));
  preset_option(cmd->add_option("--shared-inter", f->shared_inter,
                                "override shared_expert_intermediate_size (qwen2_moe; 0: none)"));
  preset_option(cmd->add_option("--vocab", f->vocab, "override vocab_size"));
  preset_option(cmd->add_option("--sparse-step", f->sparse_step, "override decoder_sparse_step"));
  auto* mlp_only = preset_option(
      cmd->add_option("--mlp-only-layers", f->mlp_only_layers, "dense layers, e.g. 0,3")->delimiter(','));
  preset_option(cmd->add_option("--norm-topk-prob", f->norm_topk_prob, "override norm_topk_prob (true|false)"));
  preset_option(cmd->add_option("--max-pos", f->max_pos, "override max_position_embeddings"));
  cmd->callback([f, mlp_only, preset_options] { run(*f, mlp_only->count() > 0, preset_options); });
}

}  // namespace afd::cli
