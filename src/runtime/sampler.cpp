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

SampledToken Sampler::sample(const float* logits, int64_t vocab) {
  SampledToken out;
  // log-softmax normaliser of the raw logits (for reported logprobs).
  float mx = logits[0];
  int32_t arg = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > mx) { mx = logits[i]; arg = static_cast<int32_t>(i); }
  }
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(sum);

  if (p_.temperature == 0.0f) {
    out.token = arg;
  } else {
    // Candidates sorted by logit (desc, then id asc for determinism), cut by top-k.
    cand_.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) cand_[i] = {logits[i], static_cast<int32_t>(i)};
    auto cmp = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    int64_t k = (p_.top_k > 0 && p_.top_k < vocab) ? p_.top_k : vocab;
    std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), cmp);
    cand_.resize(static_cast<size_t>(k));
    // Softmax at temperature over the kept candidates.
    std::vector<double> prob(cand_.size());
    double z = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      prob[i] = std::exp((static_cast<double>(cand_[i].first) - mx) / p_.temperature);
      z += prob[i];
    }
    // Nucleus: smallest prefix whose mass reaches top_p.
    size_t keep = cand_.size();
    if (p_.top_p < 1.0f) {
      double acc = 0;
      for (size_t i = 0; i < cand_.size(); ++i) {
        acc += prob[i] / z;
        if (acc >= p_.top_p) { keep = i + 1; break; }
      }
    }
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += prob[i];
    // Portable uniform in [0, 1): 53 random bits.
    ++draws_;
    double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * mass;
    size_t pick = keep - 1;
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += prob[i];
      if (u < acc) { pick = i; break; }
    }
    out.token = cand_[pick].second;
  }
  out.logprob = static_cast<float>(logits[out.token] - log_z);
  if (p_.n_top_logprobs > 0) {
    int64_t k = std::min<int64_t>(p_.n_top_logprobs, vocab);
    std::vector<std::pair<float, int32_t>> best(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) best[i] = {logits[i], static_cast<int32_t>(i)};
    std::partial_sort(best.begin(), best.begin() + k, best.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int64_t i = 0; i < k; ++i)
      out.top_logprobs.emplace_back(best[i].second, static_cast<float>(best[i].first - log_z));
  }
  return out;
}

}  // namespace afd
