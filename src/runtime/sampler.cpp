#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace afd {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f || !std::isfinite(temperature))
    return invalid_argument("temperature must be in [0, 100], got " + std::to_string(temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return invalid_argument("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (top_k < 0) return invalid_argument("top_k must be >= 0, got " + std::to_string(top_k));
  if (n_top_logprobs < 0 || n_top_logprobs > 20)
    return invalid_argument("top_logprobs must be in [0, 20], got " + std::to_string(n_top_logprobs));
  return Status::ok();
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

void Sampler::skip(uint64_t n) {
  rng_.discard(n);
  draws_ += n;
}

double Sampler::uniform() {
  // Portable uniform in [0, 1): 53 random bits.
  ++draws_;
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
}

void Sampler::candidates(const float* logits, int64_t vocab, float mx, const uint64_t* allowed) {
  // Candidates sorted by logit (desc, then id asc for determinism), cut by top-k.
  cand_.clear();
  if (allowed) {
    for (int64_t i = 0; i < vocab; ++i)
      if (token_allowed(allowed, i)) cand_.emplace_back(logits[i], static_cast<int32_t>(i));
  } else {
    cand_.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) cand_[i] = {logits[i], static_cast<int32_t>(i)};
  }
  auto cmp = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const int64_t n = static_cast<int64_t>(cand_.size());
  const int64_t k = (p_.top_k > 0 && p_.top_k < n) ? p_.top_k : n;
  std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), cmp);
  cand_.resize(static_cast<size_t>(k));
  // Softmax at temperature over the kept candidates (unnormalised).
  prob_.resize(cand_.size());
  double z = 0;
  for (size_t i = 0; i < cand_.size(); ++i) {
    prob_[i] = std::exp((static_cast<double>(cand_[i].first) - mx) / p_.temperature);
    z += prob_[i];
  }
  // Nucleus: smallest prefix whose mass reaches top_p.
  size_t keep = cand_.size();
  if (p_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      acc += prob_[i] / z;
      if (acc >= p_.top_p) { keep = i + 1; break; }
    }
  }
  cand_.resize(keep);
  prob_.resize(keep);
}

int32_t Sampler::pick(double u, int32_t skip) const {
  // u in [0, 1) scaled to the kept mass without `skip`; the last candidate takes rounding.
  double mass = 0;
  for (size_t i = 0; i < cand_.size(); ++i)
    if (cand_[i].second != skip) mass += prob_[i];
  const double target = u * mass;
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < cand_.size(); ++i) {
    if (cand_[i].second == skip) continue;
    acc += prob_[i];
    last = cand_[i].second;
    if (target < acc) return last;
  }
  return last;
}

void Sampler::fill_logprobs(const float* logits, int64_t vocab, double log_z, SampledToken* out) const {
  out->logprob = static_cast<float>(logits[out->token] - log_z);
  if (p_.n_top_logprobs > 0) {
    int64_t k = std::min<int64_t>(p_.n_top_logprobs, vocab);
    std::vector<std::pair<float, int32_t>> best(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) best[i] = {logits[i], static_cast<int32_t>(i)};
    std::partial_sort(best.begin(), best.begin() + k, best.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int64_t i = 0; i < k; ++i)
      out->top_logprobs.emplace_back(best[i].second, static_cast<float>(best[i].first - log_z));
  }
}

namespace {
// The log-softmax normaliser of the raw logits, and the largest allowed logit with its id
// (lowest id on ties; allowed: null for all, else a mask with at least one token set).
struct RowStats {
  float mx;
  int32_t arg;
  double log_z;
};
RowStats row_stats(const float* logits, int64_t vocab, const uint64_t* allowed) {
  float raw_mx = logits[0];
  for (int64_t i = 1; i < vocab; ++i) raw_mx = std::max(raw_mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - raw_mx);
  RowStats r{raw_mx, -1, raw_mx + std::log(sum)};
  for (int64_t i = 0; i < vocab; ++i) {
    if (allowed && !token_allowed(allowed, i)) continue;
    if (r.arg < 0 || logits[i] > r.mx) { r.mx = logits[i]; r.arg = static_cast<int32_t>(i); }
  }
  return r;
}
}  // namespace

SampledToken Sampler::sample(const float* logits, int64_t vocab, const uint64_t* allowed) {
  SampledToken out;
  const RowStats r = row_stats(logits, vocab, allowed);
  if (p_.temperature == 0.0f) {
    out.token = r.arg;
  } else {
    candidates(logits, vocab, r.mx, allowed);
    out.token = pick(uniform(), -1);
  }
  fill_logprobs(logits, vocab, r.log_z, &out);
  return out;
}

SampledToken Sampler::verify(const float* logits, int64_t vocab, int32_t draft, bool* accepted,
                             const uint64_t* allowed) {
  SampledToken out;
  const RowStats r = row_stats(logits, vocab, allowed);
  if (p_.temperature == 0.0f) {
    out.token = r.arg;
    *accepted = out.token == draft;
  } else {
    candidates(logits, vocab, r.mx, allowed);
    // p(draft) under the processed distribution (0 when top-k / top-p cut it).
    double mass = 0, p_draft = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      mass += prob_[i];
      if (cand_[i].second == draft) p_draft = prob_[i];
    }
    p_draft /= mass;
    *accepted = uniform() < p_draft;
    // Rejected: the residual max(p - q, 0) with q the point mass on the draft is p without it.
    out.token = *accepted ? draft : pick(uniform(), draft);
  }
  fill_logprobs(logits, vocab, r.log_z, &out);
  return out;
}

}  // namespace afd
