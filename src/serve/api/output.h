// OutputProcessor: turns one sequence's sampled tokens into text deltas, deciding when it
// finishes (eos token, stop string, max_tokens). Text is released only when it can no
// longer be part of a stop string and never splits a UTF-8 sequence.
// Not thread-safe: owned by the request, used by its scheduler thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "serve/text/tokenizer.h"

namespace afd::serve {

enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason r);

class OutputProcessor {
 public:
  OutputProcessor(const Tokenizer* tok, std::vector<int32_t> eos_ids, std::vector<std::string> stop,
                  int64_t max_tokens, bool ignore_eos);

  struct Step {
    std::string text;       // newly released text (valid UTF-8, possibly empty)
    FinishReason finish = FinishReason::none;
  };
  // Feeds the next generated token (counted in n_generated()).
  Step push(int32_t token);
  // Continuation of a sequence whose first tokens were generated elsewhere and whose text
  // the client already has (attention-worker failover): pushes `tokens`, discarding the
  // text they release, so that the detokenizer, the text held back for stop strings and
  // the token count are what they were after the last of them, and the next push() releases
  // exactly what it would have. invalid_argument naming the position if the output finishes
  // at or before the last of them (eos, a stop string, max_tokens: nothing would be left to
  // continue); the processor is then finished.
  Status replay(std::span<const int32_t> tokens);
  // The answer is complete although no eos / stop / limit said so (its grammar allows nothing
  // more): releases the held text and finishes with stop.
  Step complete();
  int64_t n_generated() const { return n_generated_; }
  // Tokens push() may still take before max_tokens finishes the output.
  int64_t tokens_left() const { return max_tokens_ - n_generated_; }
  bool finished() const { return finished_; }

 private:
  // Releases held text up to a stop string or the longest possible stop prefix.
  std::string release(bool final);

  StreamDecoder dec_;
  std::vector<int32_t> eos_;
  std::vector<std::string> stop_;
  int64_t max_tokens_;
  bool ignore_eos_;
  int64_t n_generated_ = 0;
  bool finished_ = false;
  bool hit_stop_ = false;
  std::string held_;
};

}  // namespace afd::serve
