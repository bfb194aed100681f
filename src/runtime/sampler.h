// Sampling from a row of vocabulary logits: greedy, temperature, top-k, top-p; seeded and
// reproducible (the same seed and logits give the same tokens on every machine).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "core/status.h"

namespace afd {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;
  int64_t n_top_logprobs = 0;  // alternatives to report with each token (0..20)
  // Compute SampledToken::logprob (false: it is left 0 and a greedy sample reads the row once,
  // without the exp pass of the log-softmax normaliser). Tokens do not depend on it.
  bool logprob = true;
  // Range checks for values that come from requests or flags.
  Status validate() const;
};

// Whether token t is set in a token mask (bit t % 64 of mask[t / 64]).
inline bool token_allowed(const uint64_t* mask, int64_t t) { return (mask[t >> 6] >> (t & 63)) & 1; }

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;  // log-softmax of the raw (temperature 1) logits at `token`
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first, n_top_logprobs entries
};

// One Sampler per sequence: it owns the sequence's random stream (seeded with params().seed).
// Its position in that stream (draws()) is all the state sampling carries from one token to
// the next, so a sequence continued elsewhere (an attention worker failover, docs/
// FAILOVER.md) samples exactly as the original would have after skip(draws()).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [vocab]. Not modified. Draws one number from the stream when temperature > 0,
  // none when greedy. allowed: null, or a token mask (bit t % 64 of allowed[t / 64] set: token
  // t may be sampled; structured outputs) with at least one token set: the distribution is
  // the one over the allowed tokens (greedy: the best allowed one). logprob / top_logprobs
  // are of the raw logits whatever the mask (vLLM's raw logprobs).
  SampledToken sample(const float* logits, int64_t vocab, const uint64_t* allowed = nullptr);
  // Speculative verification of one draft token proposed deterministically (a point-mass
  // draft distribution q, as n-gram and argmax MTP drafts are): with p the distribution
  // sample() draws from, accepts the draft with probability p(draft); otherwise returns a
  // token drawn from p with the draft removed (the residual max(p - q, 0), renormalised).
  // So the returned token is distributed exactly as sample()'s (Leviathan et al.'s
  // rejection rule). Greedy: the argmax, accepted when it equals the draft, no draws;
  // otherwise one draw, and a second one on rejection. logprob / top_logprobs as sample().
  // allowed: as for sample(); the draft must be allowed.
  SampledToken verify(const float* logits, int64_t vocab, int32_t draft, bool* accepted,
                      const uint64_t* allowed = nullptr);
  const SamplingParams& params() const { return p_; }
  // Numbers drawn from the random stream so far (including skipped ones).
  uint64_t draws() const { return draws_; }
  // Advances the stream by n numbers, as n draws would.
  void skip(uint64_t n);

 private:
  double uniform();  // one draw in [0, 1)
  // Fills cand_ with the top-k, top-p candidates of a row and their unnormalised
  // probabilities at the temperature, mass_ with their sum; mx is the largest logit of the
  // allowed tokens (allowed: null for all). Candidate order (best first: logit descending,
  // id ascending) is not materialised: select() finds what it needs by partitioning.
  void candidates(const float* logits, int64_t vocab, float mx, const uint64_t* allowed);
  // The position in cand_ of the candidate at which the mass, accumulated in candidate order
  // leaving out token `skip` (-1: none), passes `target`; reorders cand_ so that every
  // candidate before that position is better than it. Past the end by rounding: the last one.
  size_t select(double target, int32_t skip);
  // The candidate at u in [0, 1) of the kept mass, leaving out token `skip` (-1: none).
  int32_t pick(double u, int32_t skip);
  // Whether logprobs are reported (the row's log-softmax normaliser is needed).
  bool wants_log_z() const;
  // Whether the row's log-softmax normaliser is log(all_mass_) + mx after candidates().
  bool log_z_from_candidates(int64_t vocab, const uint64_t* allowed) const;
  void fill_logprobs(const float* logits, int64_t vocab, double log_z, SampledToken* out) const;

  SamplingParams p_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;
  struct Candidate {
    float logit;
    int32_t id;
    double w;  // unnormalised probability at the temperature
  };
  struct LogitId {
    float logit;
    int32_t id;
  };
  std::vector<Candidate> cand_;       // scratch: the kept candidates
  std::vector<LogitId> top_k_row_;    // scratch: the row's allowed tokens, when top-k cuts them
  double mass_ = 0;              // summed w of cand_
  double all_mass_ = 0;          // mass_ before the nucleus cut
};

}  // namespace afd
