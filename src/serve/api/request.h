// OpenAI request parsing and validation: /v1/completions and /v1/chat/completions bodies
// become a GenerationRequest (prompt token ids, limits, sampling). Every problem with the
// body is a Status (invalid_argument -> HTTP 400, not_found -> 404) naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "runtime/sampler.h"
#include "serve/api/output_format.h"
#include "serve/api/json_limits.h"
#include "serve/text/chat_template.h"
#include "serve/text/tokenizer.h"

namespace afd::serve {

enum class Endpoint { completions, chat };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::completions;
  std::vector<int32_t> prompt;   // token ids, non-empty
  int64_t max_tokens = 0;        // >= 1; prompt.size() + max_tokens <= context
  SamplingParams sampling;
  bool logprobs = false;         // report the sampled token's logprob (+ sampling.n_top_logprobs)
  std::vector<std::string> stop; // stop strings (not included in the output)
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  OutputFormat format;           // a constrained answer (structured outputs, forced tool calls), tool calls parsed
};

struct RequestLimits {
  std::string model_name;        // the served model id; other names give 404
  int64_t vocab_size = 0;        // model vocabulary (token ids must be below it)
  int64_t max_context = 0;       // prompt + generated tokens per sequence
  int64_t max_stop = 4;          // stop strings per request
  int64_t max_stop_len = 256;    // bytes per stop string
  JsonLimits json;               // depth, keys per object, values: checked while the body is parsed
  // Chat requests: control-token (added-token) text inside message content is tokenized as
  // plain text, so a user cannot write another role's turn markers. The template's own text
  // keeps its control tokens; content that holds control-token text starts and ends at token
  // boundaries, other content tokenizes exactly as without the option.
  // false (default): the rendered prompt is tokenized as a whole, as Hugging Face does.
  bool content_special_as_text = false;
};

// Parses and validates a request body. `chat` may be null for completions; chat requests
// without a template fail with invalid_argument. `default_seed` seeds requests without a seed.
// The body is parsed with parse_json_bounded (limits.json), so its cost is linear in its size
// and everything built from it nests at most limits.json.max_depth levels. Every top-level
// field is either used, accepted as metadata with no effect on the output (user, metadata,
// store, ...), or refused with invalid_argument naming it; fields afd does not know are
// refused too (docs/SERVING.md has the table).
Result<GenerationRequest> parse_request(Endpoint ep, const std::string& body, const Tokenizer& tok,
                                        const ChatTemplate* chat, const RequestLimits& limits,
                                        uint64_t default_seed);

}  // namespace afd::serve
