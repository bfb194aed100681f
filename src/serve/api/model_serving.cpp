#include "serve/api/model_serving.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/log.h"
#include "model/fingerprint.h"

namespace afd::serve {

std::string config_fingerprint_hex(const ModelServing& m) {
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(m.config_fingerprint));
  return fp;
}

Result<ModelServing> load_model_serving(const std::string& model_dir, const std::string& model_name,
                                        int64_t max_context, const ModelConfig& cfg) {
  ModelServing m;
  m.config_fingerprint = model_config_fingerprint(cfg);
  const std::string tok_path = model_dir + "/tokenizer.json";
  // tokenizer_config.json (when present) adds add_bos_token / add_eos_token for
  // completions prompts (Tokenizer::encode_prompt).
  auto tok = Tokenizer::load_dir(model_dir);
  if (!tok.ok())
    return tok.status().with_context("serve needs " + tok_path +
                                     " (afd make-model writes one; Hugging Face checkpoints ship one)");
  m.tokenizer = *tok;
  if (!m.tokenizer->prompt_prefix().empty() || !m.tokenizer->prompt_suffix().empty())
    spdlog::info("serve: completions prompts get {} token(s) before and {} after the text (add_bos: {})",
                 m.tokenizer->prompt_prefix().size(), m.tokenizer->prompt_suffix().size(), m.tokenizer->add_bos());
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  auto chat = ChatTemplate::load(cfg_path);
  if (chat.ok()) {
    m.chat = std::move(*chat);
  } else if (chat.status().code() == StatusCode::not_found) {
    spdlog::warn("serve: no chat template ({}); /v1/chat/completions will answer 400", chat.status().message());
  } else {
    return chat.status();
  }
  for (int64_t id : cfg.eos_token_ids) m.eos_ids.push_back(static_cast<int32_t>(id));
  if (m.chat && !m.chat->eos_token().empty()) {
    int32_t id = m.tokenizer->token_id(m.chat->eos_token());
    if (id >= 0 && std::find(m.eos_ids.begin(), m.eos_ids.end(), id) == m.eos_ids.end()) m.eos_ids.push_back(id);
  }
  RequestLimits& lim = m.limits;
  lim.model_name = model_name;
  if (lim.model_name.empty()) {
    std::filesystem::path p(model_dir);
    lim.model_name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
    if (lim.model_name.empty()) lim.model_name = "afd-model";
  }
  lim.vocab_size = cfg.vocab_size;
  lim.max_context = max_context > 0 ? max_context : cfg.max_position_embeddings;
  if (lim.max_context <= 1) return invalid_argument("serve: the model's context length is " + std::to_string(lim.max_context));
  // Structured outputs: the vocabulary's bytes as grammars see them, built once; compiled
  // grammars are cached by their text.
  m.grammars = std::make_shared<GrammarCache>(TokenVocab::build(*m.tokenizer, m.eos_ids, cfg.vocab_size));
  if (m.tokenizer->vocab_size() > cfg.vocab_size)
    spdlog::warn("serve: tokenizer has {} tokens but the model only {}; prompts using the extra ids are rejected",
                 m.tokenizer->vocab_size(), cfg.vocab_size);
  return m;
}

}  // namespace afd::serve
