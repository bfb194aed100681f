#include "plan/expert_load.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "plan/eplb.h"
#include "plan/rng.h"
#include "plan/topk_sampler.h"

namespace afd::plan {

const char* expert_placement_name(ExpertPlacementKind k) {
  switch (k) {
    case ExpertPlacementKind::contiguous: return "contiguous";
    case ExpertPlacementKind::eplb: return "eplb";
  }
  return "?";
}

Status ExpertLoadConfig::validate(int64_t n_ffn) const {
  if (!enabled()) return Status();
  const std::string e = std::to_string(n_experts);
  if (n_experts < 1 || n_experts > 4096) return invalid_argument("n_experts = " + e + " is not in [1, 4096]");
  if (top_k < 1 || top_k > n_experts)
    return invalid_argument("top_k = " + std::to_string(top_k) + " is not in [1, " + e + "] (distinct experts)");
  if (!(zipf_s >= 0 && zipf_s <= 8))
    return invalid_argument("zipf_s = " + std::to_string(zipf_s) + " is not in [0, 8]");
  if (window_tokens < 1 || window_tokens > 1000000)
    return invalid_argument("window_tokens = " + std::to_string(window_tokens) + " is not in [1, 1000000]");
  if (window_tokens * top_k > kMaxWindowPairs)
    return invalid_argument("window_tokens * top_k = " + std::to_string(window_tokens * top_k) + " exceeds " +
                            std::to_string(kMaxWindowPairs) + " sampled pairs per layer");
  if (n_ffn < 1) return invalid_argument("need at least one FFN worker");
  if (placement == ExpertPlacementKind::contiguous) {
    if (redundant != 0) return invalid_argument("redundant replicas need the eplb placement");
    if (n_experts < n_ffn)
      return invalid_argument("contiguous placement: " + e + " experts cannot give each of " + std::to_string(n_ffn) +
                              " FFN workers one");
    return Status();
  }
  if (n_ffn > 1000000) return invalid_argument("too many FFN workers for EPLB");
  return check_eplb_options(n_experts, {.n_workers = static_cast<int>(n_ffn), .redundant = redundant});
}

namespace {

std::vector<double> zipf_weights(int64_t n_experts, double s) {
  std::vector<double> w(static_cast<size_t>(n_experts));
  for (int64_t r = 0; r < n_experts; ++r) w[static_cast<size_t>(r)] = 1.0 / std::pow(static_cast<double>(r + 1), s);
  return w;
}

// Worker loads of p when expert e carries share[e], split evenly over its replicas.
double max_over_mean_under(const LayerPlacement& p, const std::vector<double>& share) {
  double max = 0, sum = 0;
  for (const auto& experts : p.worker_experts) {
    double load = 0;
    for (int32_t e : experts)
      load += share[static_cast<size_t>(e)] / static_cast<double>(p.expert_workers[static_cast<size_t>(e)].size());
    max = std::max(max, load);
    sum += load;
  }
  const double mean = sum / static_cast<double>(p.worker_experts.size());
  return mean > 0 ? max / mean : 1.0;
}

}  // namespace

std::vector<double> topk_rank_shares(int64_t n_experts, int64_t top_k, double zipf_s, int64_t n_tokens, uint64_t seed) {
  const std::vector<double> w = zipf_weights(n_experts, zipf_s);
  std::vector<double> counts(w.size(), 0.0);
  Rng rng(seed);
  TopkSampler sampler(w, top_k);
  for (int64_t t = 0; t < n_tokens; ++t) sampler.draw(rng, &counts);
  const double pairs = static_cast<double>(n_tokens) * static_cast<double>(top_k);
  for (double& c : counts) c /= pairs;
  return counts;
}

Result<ExpertImbalance> expert_imbalance(const ExpertLoadConfig& c, int64_t n_ffn, int64_t n_layers, uint64_t seed) {
  if (n_layers < 1) return invalid_argument("expert load: n_layers must be >= 1");
  AFD_RETURN_IF_ERROR(c.validate(n_ffn));
  ExpertImbalance out;
  if (!c.enabled()) {
    out.profile_max_over_mean = {1.0};
    return out;
  }
  // Independent streams: the permutations do not depend on the placement, the truth or the window.
  Rng streams(seed ^ 0x6578706572747321ULL);
  const uint64_t truth_seed = streams.next_u64(), perm_seed = streams.next_u64(), window_seed = streams.next_u64();
  const size_t n = static_cast<size_t>(c.n_experts);
  const std::vector<double> rank_share = topk_rank_shares(c.n_experts, c.top_k, c.zipf_s,
                                                          std::max<int64_t>(1, kTruthPairs / c.top_k), truth_seed);
  const std::vector<double> weights = zipf_weights(c.n_experts, c.zipf_s);
  TopkSampler window_sampler(weights, c.top_k);
  Rng perm_rng(perm_seed), window_rng(window_seed);
  const int64_t n_profiles = std::min(n_layers, kMaxExpertProfiles);
  const int n_workers = static_cast<int>(n_ffn);
  std::vector<size_t> perm(n);  // rank -> expert
  std::vector<double> share(n), rank_counts(n), counts(n);
  for (int64_t l = 0; l < n_profiles; ++l) {
    std::iota(perm.begin(), perm.end(), size_t{0});
    for (size_t i = n - 1; i > 0; --i)
      std::swap(perm[i], perm[static_cast<size_t>(perm_rng.uniform_int(0, static_cast<int64_t>(i)))]);
    for (size_t r = 0; r < n; ++r) share[perm[r]] = rank_share[r];
    LayerPlacement p;
    if (c.placement == ExpertPlacementKind::contiguous) {
      p = contiguous_placement(share, n_workers);
    } else {
      std::fill(rank_counts.begin(), rank_counts.end(), 0.0);
      for (int64_t t = 0; t < c.window_tokens; ++t) window_sampler.draw(window_rng, &rank_counts);
      for (size_t r = 0; r < n; ++r) counts[perm[r]] = rank_counts[r];
      AFD_ASSIGN_OR_RETURN(p, eplb_placement(counts, {.n_workers = n_workers, .redundant = c.redundant}));
    }
    out.profile_max_over_mean.push_back(max_over_mean_under(p, share));
  }
  double sum = 0, max = 0;
  for (int64_t l = 0; l < n_layers; ++l) {
    const double v = out.profile_max_over_mean[static_cast<size_t>(l % n_profiles)];
    sum += v;
    max = std::max(max, v);
  }
  out.mean = sum / static_cast<double>(n_layers);
  out.max = max;
  return out;
}

}  // namespace afd::plan
