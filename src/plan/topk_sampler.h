// Top-k routing without replacement for the expert load model (plan/expert_load.h): each token
// picks top_k DISTINCT ranks, one after another, each with probability proportional to its
// weight among the ranks not yet picked. Deterministic for a given Rng state; not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/rng.h"

namespace afd::plan {

class TopkSampler {
 public:
  // weights: [E], all finite and > 0; 1 <= top_k <= E.
  TopkSampler(std::vector<double> weights, int64_t top_k);

  // Adds 1 to counts[r] ([E]) for each of one token's top_k ranks r.
  void draw(Rng& rng, std::vector<double>* counts);

 private:
  size_t pick(Rng& rng);
  size_t exact_pick(Rng& rng);
  void set_leaf(size_t r, double v);

  std::vector<double> w_;
  int64_t top_k_;
  std::vector<double> prob_;    // [E] alias table: column i keeps rank i with this probability,
  std::vector<size_t> alias_;   // [E] else gives this rank
  std::vector<double> tree_;    // [2P] sums over ranks (P = E rounded up to a power of 2), leaves at P..
  size_t leaves_ = 1;           // P
  std::vector<int64_t> stamp_;  // [E] the token that last picked the rank
  std::vector<size_t> picked_;  // the current token's ranks, in pick order
  size_t n_zeroed_ = 0;         // picked_[0, n_zeroed_) have leaf weight 0 in tree_
  double total_ = 0;            // Σ w_
  double picked_weight_ = 0;    // Σ w_ over picked_
  int64_t token_ = -1;
};

}  // namespace afd::plan
