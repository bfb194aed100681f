// ModelServing: what the HTTP API needs to know about a served model (tokenizer, chat
// template, eos ids, request limits), and load_model_serving, which reads it from the model
// directory. Shared by the engine-backed Service and the engine-less Frontend so both parse
// and tokenize requests identically.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "serve/api/request.h"
#include "serve/structured/grammar_cache.h"
#include "serve/text/chat_template.h"
#include "serve/text/tokenizer.h"

namespace afd::serve {

// Everything the handlers need to know about the served model.
struct ModelServing {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;  // absent: chat endpoint answers 400
  std::vector<int32_t> eos_ids;
  RequestLimits limits;              // model_name, vocab_size, max_context
  // model_config_fingerprint() of the model: an attention server's /health reports it, and
  // a front end only places requests on workers whose fingerprint equals its own.
  uint64_t config_fingerprint = 0;
  // The serving process's numerics identity (runtime/system_fingerprint.h): the responses'
  // `system_fingerprint` and /health's; empty: not known here (responses omit it).
  std::string system_fingerprint;
  // Batch-invariant answers (--deterministic, or reference precision with the CPU FFN:
  // EngineOptions::batch_invariant()); /health and /metrics report it as "deterministic".
  bool deterministic = false;
  // Compiled grammars of constrained answers (serve/structured/), over this tokenizer with
  // eos_ids as its end tokens; null: constrained answers are refused.
  std::shared_ptr<GrammarCache> grammars;
};

// m.config_fingerprint as /health reports it: 16 lowercase hex digits.
std::string config_fingerprint_hex(const ModelServing& m);

// model_dir holds tokenizer.json and (optionally) tokenizer_config.json with the chat
// template; model_name empty: the directory's last component; max_context 0: the model's
// max_position_embeddings. Errors name the file.
Result<ModelServing> load_model_serving(const std::string& model_dir, const std::string& model_name,
                                        int64_t max_context, const ModelConfig& cfg);

}  // namespace afd::serve
