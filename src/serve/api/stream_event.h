// StreamEvent: one step's output for one request, as a scheduler produces it and the API
// renders it (OpenAI chunks, serve/api/response.h; the internal stream, serve/api/internal_stream.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/api/output.h"

namespace afd::serve {

struct TokenInfo {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// One step's output for one request. The last event has finish != none.
struct StreamEvent {
  std::string text;
  std::vector<TokenInfo> tokens;
  FinishReason finish = FinishReason::none;
  Status error;                  // finish == error
  int64_t prompt_tokens = 0;     // set on the last event
  int64_t completion_tokens = 0; // set on the last event
  uint64_t rng_draws = 0;        // the request's Sampler::draws() after these tokens
};

}  // namespace afd::serve
