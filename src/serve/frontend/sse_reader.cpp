#include "serve/frontend/sse_reader.h"

namespace afd::serve {

// One non-empty line of the event being read.
void SseReader::line(std::string_view l) {
  in_event_ = true;
  if (l[0] == ':') return;
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (cur_.has_data) cur_.data += '\n';
  cur_.data.append(value);
  cur_.has_data = true;
}

Status SseReader::feed(std::string_view bytes, std::vector<SseEvent>* out) {
  if (broken_) return resource_exhausted("server-sent event stream: an event exceeded " + std::to_string(max_) + " bytes");
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\n' && after_cr_) {
      after_cr_ = false;
      continue;
    }
    after_cr_ = c == '\r';
    if (c != '\n' && c != '\r') {
      partial_ += c;
      if (partial_.size() + cur_.data.size() > max_) {
        broken_ = true;
        return resource_exhausted("server-sent event stream: an event exceeded " + std::to_string(max_) + " bytes");
      }
      continue;
    }
    if (partial_.empty()) {
      // An empty line ends the event (a comment-only one too: the caller learns bytes arrived).
      if (in_event_) out->push_back(std::move(cur_));
      cur_ = SseEvent{};
      in_event_ = false;
      continue;
    }
    line(partial_);
    partial_.clear();
  }
  return Status();
}

}  // namespace afd::serve
