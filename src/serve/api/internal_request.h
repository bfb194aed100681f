// The request an internal stream's body describes (serve/api/internal_stream.h), as an
// attention worker's API parses it.
#pragma once

#include "core/status.h"
#include "serve/api/internal_stream.h"
#include "serve/api/request.h"

namespace afd::serve {

// The client's body parsed and validated as for any request (parse_request), then the
// control line's prompt tokens, max_tokens and seed in place of the worker's own; its
// generated tokens and sampler position are checked too (token ids in the vocabulary,
// prompt + max_tokens within the context, fewer generated tokens than max_tokens, at most
// one random draw per generated token). Errors are invalid_argument (400) naming the field.
Result<GenerationRequest> parse_internal_request(Endpoint ep, const InternalBody& b, const Tokenizer& tok,
                                                 const ChatTemplate* chat, const RequestLimits& limits);

}  // namespace afd::serve
