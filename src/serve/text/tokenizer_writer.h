// Writes a byte-level BPE tokenizer (tokenizer.json) and tokenizer_config.json with a
// Qwen-style chat template for the random-weight models of `afd make-model`.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/config.h"

namespace afd {

struct TokenizerFilesInfo {
  int64_t vocab_size = 0;       // ids 0 .. vocab_size-1 are all used
  int32_t endoftext_id = -1;    // <|endoftext|>  (vocab_size - 3)
  int32_t im_start_id = -1;     // <|im_start|>   (vocab_size - 2)
  int32_t im_end_id = -1;       // <|im_end|>     (vocab_size - 1), the chat eos token
};

// Deterministic: the same vocab_size always gives byte-identical files. Ids 0..255 are
// the byte tokens, then merges learned from a built-in English corpus (and, once that
// runs out, systematic pair merges) up to vocab_size - 3, then the three special tokens.
// Needs vocab_size >= 259. Writes DIR/tokenizer.json and DIR/tokenizer_config.json.
Result<TokenizerFilesInfo> write_tokenizer_files(const std::string& dir, int64_t vocab_size);

// The shape of MakeModelOptions::write_tokenizer: tokenizer files for config.vocab_size.
// (The chat eos token is <|im_end|> = vocab_size - 1; config.json's eos_token_id should
// name it for generation to stop there.)
Status write_tokenizer_for_model(const ModelConfig& config, const std::string& dir);

// Copies an existing tokenizer into a model directory: from_dir/tokenizer.json (required),
// tokenizer_config.json and chat_template.jinja (each when present). The tokenizer is loaded
// first (serve::Tokenizer::load_dir, as serving loads it) and refused when it has more tokens
// than vocab_size. Nothing is copied onto itself (from_dir == to_dir). Errors name the file.
Status copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir, int64_t vocab_size);

}  // namespace afd
