// Tokenizer: a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Qwen,
// Llama 3, DeepSeek, GPT-4o style), encoded the way HF tokenizers does it: added tokens
// are found first (added_tokens with special / single_word / lstrip / rstrip /
// normalized), the text between them goes through the normalizer
// (tokenizer_normalizer.h) and the pre-tokenizer (pre_tokenizer.h), and each piece is
// mapped byte -> printable character and merged by rank. A completions prompt also gets
// the ids of the post-processor / tokenizer_config.json's add_bos_token (encode_prompt).
// Immutable after load; encode/decode are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "serve/text/pre_tokenizer.h"
#include "serve/text/tokenizer_added.h"
#include "serve/text/tokenizer_normalizer.h"

namespace afd::serve {

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names the file in error messages.
  static Result<std::shared_ptr<const Tokenizer>> from_json(const std::string& json_text,
                                                           const std::string& source = "tokenizer.json");
  // The same plus tokenizer_config.json text (add_bos_token, add_eos_token, bos_token,
  // eos_token); config_text empty: no config.
  static Result<std::shared_ptr<const Tokenizer>> from_json(const std::string& json_text, const std::string& source,
                                                           const std::string& config_text,
                                                           const std::string& config_source);
  static Result<std::shared_ptr<const Tokenizer>> load(const std::string& path);
  // dir/tokenizer.json, with dir/tokenizer_config.json when that file exists.
  static Result<std::shared_ptr<const Tokenizer>> load_dir(const std::string& dir);

  // Token ids for text, without the prompt's BOS/EOS. parse_special=true: added tokens
  // written in the text become their ids, as HF does. parse_special=false: no added token
  // is recognised, special or not (DeepSeek's role markers are non-special added tokens),
  // so control-token text is encoded as plain text. Errors: text is not valid UTF-8
  // (invalid_argument); a pre-tokenizer or normalizer regex ran past its match limit on
  // this text (out_of_range: deterministic, retrying does not help).
  Result<std::vector<int32_t>> encode(std::string_view text, bool parse_special) const;
  // A /v1/completions prompt: prompt_prefix() + encode(text, true) + prompt_suffix(), what
  // transformers' tokenizer(text) (add_special_tokens=True) gives and vLLM sends. Chat
  // prompts rendered from a template use encode(text, true): the template writes the BOS.
  Result<std::vector<int32_t>> encode_prompt(std::string_view text) const;
  // Transitional form for callers not yet on the Result API: encode(text, true), or no
  // ids when that fails (callers reject an empty prompt).
  std::vector<int32_t> encode(std::string_view text) const;

  // Ids a completions prompt gets before / after its text: the single-sequence template
  // of tokenizer.json's post_processor (TemplateProcessing, Roberta/BertProcessing, or a
  // Sequence of them), replaced by [bos_token] / [eos_token] when tokenizer_config.json
  // has add_bos_token / add_eos_token (what transformers does when either key is present).
  const std::vector<int32_t>& prompt_prefix() const { return prefix_; }
  const std::vector<int32_t>& prompt_suffix() const { return suffix_; }
  // tokenizer_config.json's bos_token id, or -1.
  int32_t bos_id() const { return bos_id_; }
  // Whether encode_prompt() starts with the BOS token.
  bool add_bos() const { return bos_id_ >= 0 && !prefix_.empty() && prefix_.front() == bos_id_; }

  // The raw bytes a token stands for (may be a partial UTF-8 sequence). Added tokens give
  // their content; ids outside the vocabulary give "".
  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  // Concatenated bytes of the tokens, invalid UTF-8 replaced by U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;
  // Id of a token by its exact vocabulary string (added tokens by content), or -1.
  int32_t token_id(const std::string& token) const;
  // One past the largest token id.
  int64_t vocab_size() const { return static_cast<int64_t>(id_bytes_.size()); }

 private:
  Tokenizer() = default;
  Status read_model(const nlohmann::json& model, const std::string& src);
  Status read_post_processor(const nlohmann::json& pp, const std::string& where);
  Status read_config(const std::string& config_text, const std::string& config_source);
  // Normalizes text (plain text between raw-matched added tokens), finds the normalized
  // added tokens when match_added, pre-tokenizes and merges.
  Status encode_segment(std::string_view text, bool match_added, std::vector<int32_t>* out) const;
  Status encode_pretokenized(std::string_view text, std::vector<int32_t>* out) const;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void bpe_uncached(std::string_view piece, std::vector<int32_t>* out) const;

  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  // Memo of bpe() results by piece bytes, as HF's BPE cache: pieces up to kCacheMaxPiece
  // bytes, filled until kCacheCapacity entries; readers and the writer only try the
  // lock, so a busy cache is skipped rather than waited for.
  static constexpr size_t kCacheCapacity = 20000, kCacheMaxPiece = 64;
  // ignore_merges: a piece that is a whole token is that token; looked up by raw bytes.
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> whole_tokens_;
  mutable std::shared_mutex cache_mu_;
  mutable std::atomic<bool> cache_full_{false};
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
  Normalizer normalizer_;
  PreTokenizer pre_;
  AddedTokens raw_added_;   // added tokens with normalized=false: found in the raw text
  AddedTokens norm_added_;  // normalized=true: found in the normalized text
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> vocab_;      // byte-level token string -> id
  std::unordered_map<std::string, int32_t> added_ids_;  // added token content -> id
  std::unordered_map<uint64_t, Merge> merges_;          // (left << 32 | right) -> merge
  std::vector<int32_t> byte_token_;                     // [256] byte -> token id
  std::vector<std::string> id_bytes_;                   // id -> decoded bytes
  std::vector<uint8_t> special_;                        // id -> is special
  std::vector<int32_t> prefix_, suffix_;
  int32_t bos_id_ = -1;
};

// Streaming detokenizer for one sequence: turns tokens into text chunks that are always
// complete UTF-8 (a code point split across tokens is held until its last byte arrives).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  // Returns the text that became complete with this token (possibly "").
  std::string add(int32_t token);
  // Returns whatever is left; an incomplete trailing sequence becomes U+FFFD.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace afd::serve
