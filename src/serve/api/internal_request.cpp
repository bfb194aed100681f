#include "serve/api/internal_request.h"

#include <string>
#include <vector>

namespace afd::serve {
namespace {

Status check_ids(const std::vector<int32_t>& ids, int64_t vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return invalid_argument(std::string("internal stream control line: ") + what + "[" + std::to_string(i) +
                              "] = " + std::to_string(ids[i]) + " is outside the vocabulary (" +
                              std::to_string(vocab) + " tokens)");
  return Status();
}

}  // namespace

Result<GenerationRequest> parse_internal_request(Endpoint ep, const InternalBody& b, const Tokenizer& tok,
                                                 const ChatTemplate* chat, const RequestLimits& limits) {
  const InternalControl& c = b.control;
  AFD_ASSIGN_OR_RETURN(GenerationRequest g, parse_request(ep, b.body, tok, chat, limits, c.seed));
  const std::string what = "internal stream control line: ";
  if (c.prompt.empty()) return invalid_argument(what + "the prompt is empty");
  AFD_RETURN_IF_ERROR(check_ids(c.prompt, limits.vocab_size, "prompt"));
  AFD_RETURN_IF_ERROR(check_ids(c.generated, limits.vocab_size, "generated"));
  const int64_t n_prompt = static_cast<int64_t>(c.prompt.size());
  if (c.max_tokens < 1 || c.max_tokens > limits.max_context - n_prompt)
    return invalid_argument(what + "max_tokens " + std::to_string(c.max_tokens) + " with a prompt of " +
                            std::to_string(n_prompt) + " tokens does not fit the context (" +
                            std::to_string(limits.max_context) + ")");
  if (static_cast<int64_t>(c.generated.size()) >= c.max_tokens)
    return invalid_argument(what + std::to_string(c.generated.size()) + " generated tokens leave nothing of max_tokens " +
                            std::to_string(c.max_tokens));
  if (c.rng_draws > c.generated.size())
    return invalid_argument(what + "rng " + std::to_string(c.rng_draws) + " is more than one draw per generated token (" +
                            std::to_string(c.generated.size()) + ")");
  g.prompt = c.prompt;
  g.max_tokens = c.max_tokens;
  g.sampling.seed = c.seed;
  return g;
}

}  // namespace afd::serve
