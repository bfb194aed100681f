// The attention worker's side of the internal stream (serve/api/internal_stream.h) past the API
// (which parses the request, serve/api/internal_request.h): a continuation's restored state,
// and the stream writer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "serve/api/internal_stream.h"
#include "serve/scheduling/channel.h"
#include "serve/scheduling/scheduler.h"

namespace afd::serve {

// A continuation (c.generated non-empty): appends the generated tokens to r's tokens, for
// the scheduler to recompute (with c.replay_exact: the prompt as a prefill, then one
// generated token per step, SeqRequest::replay_end), replays them through r's output state
// without emitting their text (OutputProcessor::replay) and moves its sampler to
// c.rng_draws. From then on r produces exactly the events the original sequence would have
// produced after those tokens; its usage counts the prompt and every generated token. Call
// before submit().
Status apply_resume(const InternalControl& c, SeqRequest* r);

// Writes ch's events in the internal format (encode_event) through write, and kKeepAlive
// whenever nothing was written for keepalive_ms, until the request's last event (true) or
// until write fails or stopping() holds while nothing is pending (false; the request is
// cancelled). Blocks; polls ch every 200 ms at most.
bool pump_internal_stream(RequestChannel& ch, int64_t keepalive_ms, const std::function<bool(const std::string&)>& write,
                          const std::function<bool()>& stopping);

}  // namespace afd::serve
