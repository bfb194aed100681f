#include "runtime/speculation_governor.h"

#include <algorithm>

namespace afd {

int SpeculationGovernor::bucket(int64_t n_decoding) {
  int b = 0;
  while (b + 1 < kBuckets && (int64_t{1} << b) < n_decoding) ++b;
  return b;
}

int SpeculationGovernor::preferred(int b) const {
  const Bucket& k = buckets_[static_cast<size_t>(b)];
  const int64_t warm = std::max<int64_t>(1, opt_.warmup);
  if (k.side[0].samples < warm || k.side[1].samples < warm) return 0;
  return k.side[1].rate() >= k.side[0].rate() ? 1 : -1;
}

bool SpeculationGovernor::use_drafts(int64_t n_decoding) {
  const int b = bucket(n_decoding);
  Bucket& k = buckets_[static_cast<size_t>(b)];
  ++k.steps;
  const int p = preferred(b);
  if (p == 0) return k.side[1].samples <= k.side[0].samples;  // warming up: the side with fewer steps
  const bool best = p > 0;
  return k.steps % std::max<int64_t>(2, opt_.explore_every) == 0 ? !best : best;
}

void SpeculationGovernor::record(int64_t n_decoding, bool drafts, double seconds, int64_t tokens) {
  if (!(seconds > 0) || tokens < 0) return;
  Side& s = buckets_[static_cast<size_t>(bucket(n_decoding))].side[drafts ? 1 : 0];
  const double a = s.samples == 0 ? 1.0 : std::clamp(opt_.smoothing, 1e-6, 1.0);
  s.tokens = (1.0 - a) * s.tokens + a * static_cast<double>(tokens);
  s.seconds = (1.0 - a) * s.seconds + a * seconds;
  ++s.samples;
}

const char* SpeculationGovernor::bucket_name(int b) {
  static constexpr const char* kNames[kBuckets] = {"1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65+"};
  return kNames[std::clamp(b, 0, kBuckets - 1)];
}

std::string SpeculationGovernor::summary() const {
  std::string out;
  for (int b = 0; b < kBuckets; ++b) {
    const int p = preferred(b);
    if (p == 0) continue;
    if (!out.empty()) out += ' ';
    out += std::string(bucket_name(b)) + (p > 0 ? ":on" : ":off");
  }
  return out.empty() ? "warming up" : out;
}

}  // namespace afd
