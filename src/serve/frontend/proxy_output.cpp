#include "serve/frontend/proxy_output.h"

namespace afd::serve {

ProxyOutput::ProxyOutput(ResponseMeta meta, const Tokenizer* tok, const GenerationRequest& g)
    : meta_(std::move(meta)),
      tok_(tok),
      stream_(g.stream),
      include_usage_(g.include_usage),
      prompt_(g.prompt),
      max_tokens_(g.max_tokens),
      seed_(g.sampling.seed),
      tools_(meta_.tool_call_stream()) {}

std::string ProxyOutput::add(const StreamEvent& e) {
  if (finished_) return "";
  for (const TokenInfo& t : e.tokens) generated_.push_back(t.token);
  if (!e.tokens.empty()) rng_draws_ = e.rng_draws;
  finished_ = e.finish != FinishReason::none;
  if (!stream_) {
    completion_.text += e.text;
    for (const TokenInfo& t : e.tokens) completion_.tokens.push_back(t);
    if (finished_) {
      completion_.finish = e.finish;
      completion_.prompt_tokens = e.prompt_tokens;
      completion_.completion_tokens = e.completion_tokens;
    }
    return "";
  }
  // The same chunks, in the same order, as the attention server renders for its own clients.
  std::string out;
  if (!e.tokens.empty() || !e.text.empty() || finished_) {
    out = stream_chunk(meta_, *tok_, e, first_chunk_, include_usage_, text_offset_, tools_.get());
    first_chunk_ = false;
    text_offset_ += static_cast<int64_t>(e.text.size());
  }
  if (finished_) {
    if (include_usage_) out += stream_usage_chunk(meta_, e.prompt_tokens, e.completion_tokens);
    out += "data: [DONE]\n\n";
  }
  return out;
}

InternalControl ProxyOutput::control(int64_t keepalive_ms, bool replay_exact) const {
  InternalControl c;
  c.prompt = prompt_;
  c.max_tokens = max_tokens_;
  c.seed = seed_;
  c.generated = generated_;
  c.rng_draws = rng_draws_;
  c.keepalive_ms = keepalive_ms;
  c.replay_exact = replay_exact;
  return c;
}

std::string ProxyOutput::body() const { return completion_body(meta_, *tok_, completion_); }

std::string ProxyOutput::stream_error(int http_status, const std::string& message) {
  return "data: " + error_body(http_status, message) + "\n\ndata: [DONE]\n\n";
}

}  // namespace afd::serve
