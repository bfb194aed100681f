// Teacher-forced scoring of token sequences (perplexity): each document's tokens after the
// first are predicted from the ones before them, through Engine::forward with all_logits.
//
// A document longer than `window` tokens is scored the standard sliding-window way (as
// Hugging Face's perplexity guide does it): windows of `window` tokens start every `stride`
// tokens, each is a fresh sequence (no context before its first token), and each scores only
// the tokens the previous window did not reach; the last window ends at the document's end.
// With stride < window every token after the first is scored once, with at least
// window - stride tokens of context once past the first window; stride == window scores the
// windows independently (each window's first token is not scored).
//
// With an MTP head (ScoreOptions::mtp, DeepSeek's MTP module, runtime/mtp_head.h) each window
// also runs the module over its positions i with t[i+1] inside the window, and scores its
// prediction of t[i+2] for the positions i + 2 the window scores (from its third token on).
//
// Several windows share each forward call (at most max_seqs_per_call sequences and
// max_tokens_per_call tokens; a long window is fed in chunks on its own sequence), and each
// sequence is released when its window is done. Log-softmax is computed in double.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "runtime/mtp_head.h"

namespace afd {

// One window of a document: tokens [begin, end); positions [score_begin, end) are scored, each
// from the logits of the token before it.
struct ScoreWindow {
  int64_t begin = 0, end = 0, score_begin = 0;
};

// The windows of a document of n_tokens (rule above). None for n_tokens < 2. Requires
// 2 <= window and 1 <= stride <= window.
std::vector<ScoreWindow> plan_score_windows(int64_t n_tokens, int64_t window, int64_t stride);

struct ScoreOptions {
  int64_t window = 1024;  // tokens per window (<= the model's max_position_embeddings)
  int64_t stride = 512;   // 1 .. window
  int64_t max_seqs_per_call = 16;
  int64_t max_tokens_per_call = 4096;
  // Called after every forward call with (tokens forwarded so far, tokens to forward in all).
  std::function<void(int64_t done, int64_t total)> progress;
  // Non-null: also score the MTP module (needs Engine::forward_with_hidden). Its KV cache must
  // hold what the engine's does; it must have no live sequences of the caller's.
  MtpHead* mtp = nullptr;
};

struct ScoreResult {
  int64_t documents = 0;         // documents given
  int64_t tokens = 0;            // tokens scored
  int64_t forwarded_tokens = 0;  // tokens run through the model (window overlaps count again)
  double nll_sum = 0;            // sum of -log p(token), nats
  int64_t top1_correct = 0;      // scored tokens whose largest logit was the token (first on ties)
  double seconds = 0;            // wall time of the forward calls and the scoring
  // With ScoreOptions::mtp: the module's predictions of the token after next, scored as above.
  int64_t mtp_tokens = 0;
  double mtp_nll_sum = 0;
  int64_t mtp_top1_correct = 0;
  double nll_mean() const { return tokens > 0 ? nll_sum / static_cast<double>(tokens) : 0.0; }
};

// Scores `documents` (token ids, BOS included when wanted) on `engine`, which must have no
// live sequences of the caller's. Errors: invalid_argument for a bad window / stride, a window
// longer than the model's context or a token outside its vocabulary (naming the document);
// resource_exhausted when one window does not fit the KV cache; what Engine::forward returns.
// On error every sequence this call created is released.
Result<ScoreResult> score_documents(Engine& engine, const std::vector<std::vector<int32_t>>& documents,
                                    const ScoreOptions& options);

}  // namespace afd
