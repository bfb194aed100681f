#include "serve/scheduling/worker_resume.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace afd::serve {

Status apply_resume(const InternalControl& c, SeqRequest* r) {
  if (c.generated.empty() && c.rng_draws == 0) return Status();
  AFD_RETURN_IF_ERROR(r->output.replay(c.generated));
  if (r->grammar) {
    for (size_t i = 0; i < c.generated.size(); ++i)
      if (!r->grammar->accept_token(c.generated[i]) || r->grammar->is_finished())
        return invalid_argument("resumed output: generated token " + std::to_string(i + 1) +
                                " is not allowed by the request's output format, or ends it");
  }
  r->tokens.insert(r->tokens.end(), c.generated.begin(), c.generated.end());
  if (c.replay_exact) r->replay_end = static_cast<int64_t>(r->tokens.size());
  r->sampler.skip(c.rng_draws);
  return Status();
}

bool pump_internal_stream(RequestChannel& ch, int64_t keepalive_ms, const std::function<bool(const std::string&)>& write,
                          const std::function<bool()>& stopping) {
  using clock = std::chrono::steady_clock;
  const auto keepalive = std::chrono::milliseconds(std::max<int64_t>(1, keepalive_ms));
  const auto poll = std::min<std::chrono::milliseconds>(keepalive, std::chrono::milliseconds(200));
  auto last_write = clock::now();
  for (;;) {
    std::vector<StreamEvent> evs = ch.wait(poll);
    if (evs.empty() && stopping()) {
      ch.cancel();
      return false;
    }
    std::string out;
    bool last = false;
    for (const StreamEvent& e : evs) {
      out += encode_event(e);
      if (e.finish != FinishReason::none) {
        last = true;
        break;
      }
    }
    if (out.empty() && clock::now() - last_write >= keepalive) out = kKeepAlive;
    if (!out.empty()) {
      if (!write(out)) {
        ch.cancel();  // the front end went away (or gave up on us): the scheduler frees the sequence
        return false;
      }
      last_write = clock::now();
    }
    if (last) return true;
  }
}

}  // namespace afd::serve
