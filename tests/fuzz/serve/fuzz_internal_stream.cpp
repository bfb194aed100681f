// libFuzzer target for the front end <-> attention worker internal stream
// (serve/api/internal_stream.h, serve/frontend/sse_reader.h): what a worker reads from a front end (the
// control line) and what a front end reads from a worker (SSE framing, events) is outside
// input to each. The first byte picks the piece size the SSE reader is fed in; the rest is
// taken as an internal request body, as one event's data and as an SSE stream. Nothing may
// crash or hang, and every event that decodes must encode and decode again to the same event.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "serve/api/internal_stream.h"
#include "serve/frontend/sse_reader.h"

namespace {

using afd::serve::InternalEvent;

void check_round_trip(const InternalEvent& a) {
  const std::string wire = afd::serve::encode_event(a.event);
  auto b = afd::serve::decode_event(std::string_view(wire).substr(6, wire.size() - 8));
  bool same = b.ok() && b->event.text == a.event.text && b->event.tokens.size() == a.event.tokens.size() &&
              b->event.finish == a.event.finish && b->event.rng_draws == a.event.rng_draws &&
              b->event.prompt_tokens == a.event.prompt_tokens &&
              b->event.completion_tokens == a.event.completion_tokens && b->resumable == a.resumable;
  for (size_t i = 0; same && i < a.event.tokens.size(); ++i)
    same = b->event.tokens[i].token == a.event.tokens[i].token && b->event.tokens[i].top.size() == a.event.tokens[i].top.size();
  // Text that is not valid UTF-8 is replaced on encoding (JSON holds no broken UTF-8).
  if (!same && b.ok() && b->event.text != a.event.text) return;
  if (!same) {
    std::fprintf(stderr, "event does not survive a round trip: %s\n", wire.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  (void)afd::serve::split_internal_body(in);
  if (auto e = afd::serve::decode_event(in); e.ok()) check_round_trip(*e);

  afd::serve::SseReader reader(1 << 16);
  std::vector<afd::serve::SseEvent> events;
  for (size_t i = 0; i < in.size(); i += piece)
    if (!reader.feed(in.substr(i, piece), &events).is_ok()) break;
  for (const auto& ev : events)
    if (auto e = afd::serve::decode_event(ev.data); e.ok()) check_round_trip(*e);
  return 0;
}
