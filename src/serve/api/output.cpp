#include "serve/api/output.h"

#include <algorithm>

namespace afd::serve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "";
}

OutputProcessor::OutputProcessor(const Tokenizer* tok, std::vector<int32_t> eos_ids, std::vector<std::string> stop,
                                 int64_t max_tokens, bool ignore_eos)
    : dec_(tok, true), eos_(std::move(eos_ids)), stop_(std::move(stop)), max_tokens_(max_tokens), ignore_eos_(ignore_eos) {}

std::string OutputProcessor::release(bool final) {
  // Earliest stop string occurrence ends the output.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) {
    size_t p = held_.find(s);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    hit_stop_ = true;
    return out;
  }
  if (final) {
    std::string out;
    out.swap(held_);
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stop_) {
    size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

OutputProcessor::Step OutputProcessor::push(int32_t token) {
  Step st;
  if (finished_) return st;
  ++n_generated_;
  bool is_eos = !ignore_eos_ && std::find(eos_.begin(), eos_.end(), token) != eos_.end();
  if (!is_eos) held_ += dec_.add(token);
  bool at_limit = n_generated_ >= max_tokens_;
  if (is_eos || at_limit) held_ += dec_.flush();
  st.text = release(is_eos || at_limit);
  if (hit_stop_ || is_eos) st.finish = FinishReason::stop;
  else if (at_limit) st.finish = FinishReason::length;
  finished_ = st.finish != FinishReason::none;
  return st;
}

OutputProcessor::Step OutputProcessor::complete() {
  Step st;
  if (finished_) return st;
  held_ += dec_.flush();
  st.text = release(true);
  st.finish = FinishReason::stop;
  finished_ = true;
  return st;
}

Status OutputProcessor::replay(std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (finished_ || push(tokens[i]).finish != FinishReason::none)
      return invalid_argument("resumed output: generated token " + std::to_string(i + 1) + " of " +
                              std::to_string(tokens.size()) +
                              " ends the output (eos, a stop string or max_tokens); nothing is left to continue");
  }
  return Status();
}

}  // namespace afd::serve
