// The internal stream between a front end and an attention worker (docs/FAILOVER.md,
// "Attention worker failover"). The front end sends every generation request to the
// worker's public path (/v1/completions, /v1/chat/completions) with the header
// kInternalStreamHeader and a body of two parts:
//   <control: one JSON object on one line>\n<the client's body, unchanged>
// The control line fixes what the front end decided (prompt tokens, max_tokens, seed) and,
// for a continuation, what the client already has (the generated token ids and the
// sampler's position after them). The worker answers errors found before it accepts the
// request as usual (status + OpenAI error body); once accepted it answers 200
// text/event-stream with one `data: <event>` per scheduler event, and `: ping` comments
// whenever it has sent nothing for control.keepalive_ms (so the front end can tell a busy
// worker from a stopped one). Events (one JSON object each):
//   {"text":"...","tokens":[[id,logprob,[[id,logprob],...]],...],"rng":N}         a step
//   ... plus "finish":"stop"|"length","usage":[prompt_tokens,completion_tokens]   the last
//   {"error":{"code":HTTP status,"message":"...","resumable":bool}}               a failure
// "rng" is the sampler's position (Sampler::draws) after the event's tokens; "resumable"
// says the request failed because this worker stops (not because of the request or of
// the FFN side), so another worker may continue it. The client never sees this format: the
// front end renders the OpenAI answer itself (serve/frontend/proxy_output.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "serve/api/stream_event.h"

namespace afd::serve {

inline constexpr const char* kInternalStreamHeader = "X-Afd-Internal-Stream";

// The control line. Encoded size: at most 12 bytes per token of prompt + generated, plus
// 200 bytes.
struct InternalControl {
  std::vector<int32_t> prompt;     // prompt token ids (replace the worker's own tokenization)
  int64_t max_tokens = 0;          // of the whole request, including `generated`
  uint64_t seed = 0;               // sampling seed (the client's, or the front end's default)
  std::vector<int32_t> generated;  // continuation: tokens the client already has, in order
  uint64_t rng_draws = 0;          // continuation: Sampler::draws() after `generated`
  // continuation: recompute `generated` one token per step, as decode computed them (exact:
  // the logits that follow are bit for bit the original's), or in one prefill with the
  // prompt (faster; a near tie may then go the other way later on).
  bool replay_exact = true;
  int64_t keepalive_ms = 1000;     // send ": ping" after this long without writing
};

std::string encode_control(const InternalControl& c);  // one line, no '\n'

// The body limit an attention worker needs so that every internal request of a front end
// whose clients may send client_max_body bytes fits: the client's body plus a control line
// for a context of max_context tokens.
inline int64_t internal_body_limit(int64_t client_max_body, int64_t max_context) {
  return client_max_body + 12 * max_context + 200;
}

// The two parts of an internal request body; invalid_argument naming what is wrong (no
// control line, not JSON, a field missing or of the wrong type or range). Only the shape is
// checked here; parse_internal_request (internal_request.h) checks the values against the model.
struct InternalBody {
  InternalControl control;
  std::string body;  // the client's body
};
Result<InternalBody> split_internal_body(std::string_view raw);

// One event of the stream as the front end reads it: a StreamEvent (text, tokens with
// logprobs, finish, usage; finish error/cancelled with the error) plus the sampler position.
struct InternalEvent {
  StreamEvent event;
  int http_status = 200;   // of an error event
  bool resumable = false;  // an error another worker may continue from (the worker stops)
};

// "data: {...}\n\n" for one scheduler event. An error or cancelled event carries its HTTP
// status (http_status_for) and is resumable when cancelled (the worker's scheduler stopped).
std::string encode_event(const StreamEvent& e);
// Parses one event's data payload; invalid_argument naming what is wrong.
Result<InternalEvent> decode_event(std::string_view data);

inline constexpr const char* kKeepAlive = ": ping\n\n";

}  // namespace afd::serve
