// ProxyOutput: the front end's record of one request's answer while attention workers
// generate it (serve/frontend/proxy_session.h). It turns the workers' internal events
// (serve/api/internal_stream.h) into what the client gets — OpenAI SSE chunks as they come, or
// one JSON body at the end — under the front end's own response id, `created` and model,
// and keeps what a continuation on another worker needs: the prompt, max_tokens, seed, the
// generated token ids the client already has (or will get, for a non-streaming answer) and
// the sampler's position after them. Events of a continuation follow those of the earlier
// attempt without a seam: chunk boundaries, text offsets, the first chunk's role and the
// usage are those of an unfaulted run. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/api/internal_stream.h"
#include "serve/api/request.h"
#include "serve/api/response.h"
#include "serve/api/stream_event.h"
#include "serve/text/tokenizer.h"

namespace afd::serve {

class ProxyOutput {
 public:
  // tok must outlive this. g: the request as the front end parsed it (prompt, max_tokens,
  // sampling.seed, stream, include_usage, logprobs).
  ProxyOutput(ResponseMeta meta, const Tokenizer* tok, const GenerationRequest& g);

  // One step or the last event of the current attempt (finish none, stop or length; error
  // events are the session's to handle). Returns the bytes to send a streaming client now
  // ("" for a non-streaming request, whose answer is body()).
  std::string add(const StreamEvent& e);
  bool finished() const { return finished_; }
  // The control line of the next attempt: a continuation after the tokens added so far
  // (InternalControl::replay_exact as given).
  InternalControl control(int64_t keepalive_ms, bool replay_exact = true) const;
  int64_t n_generated() const { return static_cast<int64_t>(generated_.size()); }
  // Whether anything of the answer exists yet (a token or the end).
  bool started() const { return !generated_.empty() || finished_; }

  // Non-streaming, once finished(): the completion body.
  std::string body() const;
  // Streaming: what ends a stream that fails after it started (an error event, then [DONE]).
  static std::string stream_error(int http_status, const std::string& message);

 private:
  ResponseMeta meta_;
  const Tokenizer* tok_;
  bool stream_, include_usage_;
  std::vector<int32_t> prompt_;
  int64_t max_tokens_;
  uint64_t seed_;
  std::vector<int32_t> generated_;
  uint64_t rng_draws_ = 0;
  bool finished_ = false;
  bool first_chunk_ = true;  // streaming: the next chunk is the first (chat: carries the role)
  int64_t text_offset_ = 0;  // streaming: bytes of text sent so far
  Completion completion_;    // non-streaming: the answer so far
  std::unique_ptr<ToolCallStream> tools_;  // streaming with tool calls parsed (meta.tool_calls)
};

}  // namespace afd::serve
