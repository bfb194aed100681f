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
  return Status();
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

namespace {
// Candidate order: logit descending, then id ascending (a total order: every way of ordering
// candidates by it gives the same sequence). For Sampler::Candidate and (logit, id) pairs.
template <class C>
bool better(const C& a, const C& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}
}  // namespace

void Sampler::candidates(const float* logits, int64_t vocab, float mx, const uint64_t* allowed) {
  cand_.clear();
  const double inv_t = 1.0 / p_.temperature;
  if (p_.top_k > 0 && p_.top_k < vocab) {
    // Top-k: the k best of compact (logit, id) pairs, before the wider candidates.
    std::vector<LogitId>& row = top_k_row_;
    row.clear();
    for (int64_t i = 0; i < vocab; ++i)
      if (!allowed || token_allowed(allowed, i)) row.push_back(LogitId{logits[i], static_cast<int32_t>(i)});
    const size_t k = std::min(row.size(), static_cast<size_t>(p_.top_k));
    // A heap of k: about one comparison per token for the usual small k.
    std::partial_sort(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(k), row.end(), better<LogitId>);
    for (size_t i = 0; i < k; ++i) cand_.push_back(Candidate{row[i].logit, row[i].id, 0.0});
  } else {
    for (int64_t i = 0; i < vocab; ++i)
      if (!allowed || token_allowed(allowed, i)) cand_.push_back(Candidate{logits[i], static_cast<int32_t>(i), 0.0});
  }
  // Softmax at temperature over the kept candidates (unnormalised).
  mass_ = 0;
  for (Candidate& c : cand_) {
    c.w = std::exp((static_cast<double>(c.logit) - mx) * inv_t);
    mass_ += c.w;
  }
  all_mass_ = mass_;
  // Nucleus: the smallest prefix in candidate order whose mass reaches top_p.
  if (p_.top_p < 1.0f && !cand_.empty()) {
    const size_t last = select(static_cast<double>(p_.top_p) * mass_, -1);
    cand_.resize(last + 1);
    mass_ = 0;
    for (const Candidate& c : cand_) mass_ += c.w;
  }
}

size_t Sampler::select(double target, int32_t skip) {
  // Invariant: cand_[0, lo) are better than every candidate in [lo, hi), which are better than
  // every one in [hi, end); `target` is what remains of the mass after [0, lo).
  size_t lo = 0, hi = cand_.size();
  auto at = [&](size_t i) { return cand_.begin() + static_cast<std::ptrdiff_t>(i); };
  auto skip_w = [&](const Candidate& c) { return c.id == skip ? 0.0 : c.w; };
  while (hi - lo > 32) {
    // Partition around the median of three by candidate order.
    const Candidate& a = cand_[lo];
    const Candidate& b = cand_[lo + (hi - lo) / 2];
    const Candidate& c = cand_[hi - 1];
    const Candidate pivot = better(a, b) ? (better(b, c) ? b : (better(a, c) ? c : a))
                                         : (better(a, c) ? a : (better(b, c) ? c : b));
    auto mid = std::partition(at(lo), at(hi), [&](const Candidate& x) { return better(x, pivot); });
    // The pivot (not better than itself) is in [mid, hi); move it to mid.
    std::iter_swap(mid, std::find_if(mid, at(hi), [&](const Candidate& x) { return x.id == pivot.id; }));
    const size_t m = static_cast<size_t>(mid - cand_.begin());
    double better_mass = 0;
    for (size_t i = lo; i < m; ++i) better_mass += skip_w(cand_[i]);
    if (target < better_mass) {
      hi = m;
      continue;
    }
    target -= better_mass;
    const double pw = skip_w(cand_[m]);
    if (target < pw) return m;
    target -= pw;
    lo = m + 1;
  }
  std::sort(at(lo), at(hi), better<Candidate>);
  size_t last = cand_.size();
  for (size_t i = lo; i < hi; ++i) {
    if (cand_[i].id == skip) continue;
    last = i;
    if (target < cand_[i].w) return i;
    target -= cand_[i].w;
  }
  if (last != cand_.size()) return last;
  // Rounding left the target past a range that holds only `skip`: its neighbour in order.
  size_t best = cand_.size();
  for (size_t i = hi; i < cand_.size(); ++i)
    if (cand_[i].id != skip && (best == cand_.size() || better(cand_[i], cand_[best]))) best = i;
  if (best != cand_.size()) return best;
  for (size_t i = 0; i < lo; ++i)
    if (cand_[i].id != skip && (best == cand_.size() || better(cand_[best], cand_[i]))) best = i;
  return best;
}

int32_t Sampler::pick(double u, int32_t skip) {
  // u in [0, 1) scaled to the kept mass without `skip`; the last candidate takes rounding.
  double mass = mass_;
  if (skip >= 0)
    for (const Candidate& c : cand_)
      if (c.id == skip) mass -= c.w;
  return cand_[select(u * mass, skip)].id;
}

void Sampler::fill_logprobs(const float* logits, int64_t vocab, double log_z, SampledToken* out) const {
  if (!p_.logprob && p_.n_top_logprobs == 0) return;
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
// with_log_z false: log_z is left 0 (the caller gets it from candidates()).
RowStats row_stats(const float* logits, int64_t vocab, const uint64_t* allowed, bool with_log_z) {
  RowStats r{logits[0], -1, 0.0};
  float raw_mx = logits[0];
  for (int64_t i = 0; i < vocab; ++i) {
    raw_mx = std::max(raw_mx, logits[i]);
    if (allowed && !token_allowed(allowed, i)) continue;
    if (r.arg < 0 || logits[i] > r.mx) { r.mx = logits[i]; r.arg = static_cast<int32_t>(i); }
  }
  if (with_log_z) {
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - raw_mx);
    r.log_z = raw_mx + std::log(sum);
  }
  return r;
}
}  // namespace

bool Sampler::wants_log_z() const { return p_.logprob || p_.n_top_logprobs > 0; }

bool Sampler::log_z_from_candidates(int64_t vocab, const uint64_t* allowed) const {
  // At temperature 1 over every token, candidates() sums exactly row_stats' terms, in the
  // same order: one pass of exp instead of two.
  return p_.temperature == 1.0f && !allowed && (p_.top_k == 0 || p_.top_k >= vocab);
}

SampledToken Sampler::sample(const float* logits, int64_t vocab, const uint64_t* allowed) {
  SampledToken out;
  const bool shared = log_z_from_candidates(vocab, allowed);
  RowStats r = row_stats(logits, vocab, allowed, !shared && wants_log_z());
  if (p_.temperature == 0.0f) {
    out.token = r.arg;
  } else {
    candidates(logits, vocab, r.mx, allowed);
    if (shared) r.log_z = r.mx + std::log(all_mass_);
    out.token = pick(uniform(), -1);
  }
  fill_logprobs(logits, vocab, r.log_z, &out);
  return out;
}

SampledToken Sampler::verify(const float* logits, int64_t vocab, int32_t draft, bool* accepted,
                             const uint64_t* allowed) {
  SampledToken out;
  const bool shared = log_z_from_candidates(vocab, allowed);
  RowStats r = row_stats(logits, vocab, allowed, !shared && wants_log_z());
  if (p_.temperature == 0.0f) {
    out.token = r.arg;
    *accepted = out.token == draft;
  } else {
    candidates(logits, vocab, r.mx, allowed);
    if (shared) r.log_z = r.mx + std::log(all_mass_);
    // p(draft) under the processed distribution (0 when top-k / top-p cut it).
    double p_draft = 0;
    for (const Candidate& c : cand_)
      if (c.id == draft) p_draft = c.w / mass_;
    *accepted = uniform() < p_draft;
    // Rejected: the residual max(p - q, 0) with q the point mass on the draft is p without it.
    out.token = *accepted ? draft : pick(uniform(), draft);
  }
  fill_logprobs(logits, vocab, r.log_z, &out);
  return out;
}

}  // namespace afd
