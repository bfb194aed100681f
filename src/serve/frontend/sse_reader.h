// SseReader: splits a text/event-stream body, fed in pieces as they arrive, into events
// (W3C "Server-sent events" framing: lines ended by \n, \r\n or \r; an empty line ends an
// event; "data:" lines are joined with \n; lines starting with ':' are comments; other
// fields are ignored). Used by the front end to read an attention worker's internal stream.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace afd::serve {

struct SseEvent {
  std::string data;      // the joined data lines ("" for a comment-only event)
  bool has_data = false;  // at least one data line
};

class SseReader {
 public:
  // max_event_bytes bounds one event (and the bytes held while waiting for its end).
  explicit SseReader(size_t max_event_bytes = 16u << 20) : max_(max_event_bytes) {}
  // Appends bytes; complete events go to *out. resource_exhausted once an event grows past
  // the bound (the reader is then unusable).
  Status feed(std::string_view bytes, std::vector<SseEvent>* out);

 private:
  void line(std::string_view l);
  size_t max_;
  std::string partial_;  // an unfinished line
  SseEvent cur_;         // the event being read
  bool in_event_ = false;
  bool after_cr_ = false;  // the last byte was \r (a following \n belongs to it)
  bool broken_ = false;
};

}  // namespace afd::serve
