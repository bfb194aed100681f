// OutputProcessor: turns one sequence's sampled tokens into text deltas, deciding when it
// finishes (eos token, stop string, max_tokens). Text is released only when it can no
// longer be part of a stop string and never splits a UTF-8 sequence.
// Not thread-safe: owned by the request, used by its scheduler thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/tokenizer.h"

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
  int64_t n_generated() const { return n_generated_; }
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
