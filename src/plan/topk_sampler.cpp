#include "plan/topk_sampler.h"

#include <numeric>
#include <utility>

namespace afd::plan {

// A pick first draws from the full distribution (Walker's alias table: one 64-bit random
// number) and keeps the rank when not yet picked; given that it keeps it, the rank has
// probability w_r / (weight not yet picked), as an exact draw from the rest has. Once half the
// weight is picked, or after kTries rejections, it draws exactly from a sum tree in which the
// picked ranks weigh 0, so a pick costs O(kTries + log E) at any skew.
TopkSampler::TopkSampler(std::vector<double> weights, int64_t top_k)
    : w_(std::move(weights)), top_k_(top_k), prob_(w_.size()), alias_(w_.size()), stamp_(w_.size(), -1) {
  const size_t n = w_.size();
  // Vose's construction of the alias table.
  total_ = std::accumulate(w_.begin(), w_.end(), 0.0);
  std::vector<double> scaled(n);
  std::vector<size_t> small, large;
  for (size_t i = 0; i < n; ++i) {
    scaled[i] = w_[i] * static_cast<double>(n) / total_;
    (scaled[i] < 1.0 ? small : large).push_back(i);
  }
  while (!small.empty() && !large.empty()) {
    const size_t s = small.back(), l = large.back();
    small.pop_back();
    prob_[s] = scaled[s];
    alias_[s] = l;
    scaled[l] -= 1.0 - scaled[s];
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  for (const auto* rest : {&large, &small}) {  // exact columns, and rounding leftovers
    for (size_t i : *rest) {
      prob_[i] = 1.0;
      alias_[i] = i;
    }
  }
  while (leaves_ < n) leaves_ *= 2;
  tree_.assign(2 * leaves_, 0.0);
  for (size_t i = 0; i < n; ++i) tree_[leaves_ + i] = w_[i];
  for (size_t j = leaves_ - 1; j >= 1; --j) tree_[j] = tree_[2 * j] + tree_[2 * j + 1];
  picked_.reserve(static_cast<size_t>(top_k));
}

void TopkSampler::draw(Rng& rng, std::vector<double>* counts) {
  ++token_;
  picked_.clear();
  n_zeroed_ = 0;
  picked_weight_ = 0;
  for (int64_t k = 0; k < top_k_; ++k) {
    const size_t r = pick(rng);
    stamp_[r] = token_;
    picked_.push_back(r);
    picked_weight_ += w_[r];
    (*counts)[r] += 1;
  }
  for (size_t i = 0; i < n_zeroed_; ++i) set_leaf(picked_[i], w_[picked_[i]]);  // the tree's sums as built
}

size_t TopkSampler::pick(Rng& rng) {
  constexpr int kTries = 8;
  const uint64_t n = w_.size();
  if (picked_weight_ > 0.5 * total_) return exact_pick(rng);
  for (int t = 0; t < kTries; ++t) {
    const uint64_t x = rng.next_u64();
    const size_t col = static_cast<size_t>((x >> 32) * n >> 32);
    const double coin = static_cast<double>(x & 0xffffffffULL) * 0x1.0p-32;  // [0, 1)
    const size_t r = coin < prob_[col] ? col : alias_[col];
    if (stamp_[r] != token_) return r;
  }
  return exact_pick(rng);
}

size_t TopkSampler::exact_pick(Rng& rng) {
  for (; n_zeroed_ < picked_.size(); ++n_zeroed_) set_leaf(picked_[n_zeroed_], 0.0);
  double u = rng.uniform_open0() * tree_[1];  // (0, weight not yet picked]
  size_t j = 1;
  while (j < leaves_) {
    const double left = tree_[2 * j], right = tree_[2 * j + 1];
    if ((u <= left && left > 0) || right <= 0) {  // never into a subtree of weight 0 (rounding)
      j = 2 * j;
    } else {
      u -= left;
      j = 2 * j + 1;
    }
  }
  return j - leaves_;
}

// Sums are recomputed from the children, so restoring a leaf restores the tree's bits.
void TopkSampler::set_leaf(size_t r, double v) {
  size_t j = leaves_ + r;
  tree_[j] = v;
  for (j /= 2; j >= 1; j /= 2) tree_[j] = tree_[2 * j] + tree_[2 * j + 1];
}

}  // namespace afd::plan
