// load_model_serving: what the HTTP layer needs to know about a served model (tokenizer,
// chat template, eos ids, request limits), read from the model directory. Shared by the
// engine-backed Service and the engine-less Frontend so both parse and tokenize requests
// identically.
#pragma once

#include <string>

#include "core/status.h"
#include "model/config.h"
#include "serve/http_server.h"

namespace afd::serve {

// model_dir holds tokenizer.json and (optionally) tokenizer_config.json with the chat
// template; model_name empty: the directory's last component; max_context 0: the model's
// max_position_embeddings. Errors name the file.
Result<ModelServing> load_model_serving(const std::string& model_dir, const std::string& model_name,
                                        int64_t max_context, const ModelConfig& cfg);

}  // namespace afd::serve
