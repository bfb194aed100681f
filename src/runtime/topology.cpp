#include "runtime/topology.h"

#include <cctype>
#include <cstdlib>

namespace afd {

namespace {
bool parse_small_int(const std::string& s, int lo, int hi, int* out) {
  if (s.empty() || s.size() > 3) return false;
  for (char ch : s) if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  int v = std::atoi(s.c_str());
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace

std::string Topology::to_string() const {
  switch (wiring) {
    case Wiring::mono: return "mono";
    case Wiring::afd: return std::to_string(n_attention) + "A" + std::to_string(n_ffn) + "F";
    case Wiring::ep: return "EP" + std::to_string(n_ffn);
  }
  return "?";
}

ExpertRange ffn_shard_range(int shard, int n_ffn, int tp, int64_t n_experts) {
  const int y = n_ffn > 0 ? n_ffn : 1;
  const int t = tp > 0 && y % tp == 0 ? tp : 1;
  const int groups = y / t, g = shard / t;
  ExpertRange r;
  r.begin = g * n_experts / groups;
  r.end = (g + 1) * n_experts / groups;
  r.holds_shared = g == 0;
  r.tp_rank = shard % t;
  r.tp_degree = t;
  return r;
}

ExpertRange Topology::ffn_shard(int shard, int64_t n_experts) const {
  return ffn_shard_range(shard, n_ffn, ffn_tp, n_experts);
}

Result<Topology> parse_topology(const std::string& s) {
  Topology t;
  if (s == "mono" || s == "monolithic") return t;
  if (s.size() > 2 && (s[0] == 'E' || s[0] == 'e') && (s[1] == 'P' || s[1] == 'p')) {
    int n;
    if (!parse_small_int(s.substr(2), 1, 64, &n))
      return invalid_argument("topology '" + s + "': expected EPn with 1 <= n <= 64");
    t.wiring = Wiring::ep;
    t.n_attention = n;
    t.n_ffn = n;
    return t;
  }
  const size_t a = s.find_first_of("Aa");
  const bool ends_f = !s.empty() && (s.back() == 'F' || s.back() == 'f');
  int x, y;
  if (a == std::string::npos || !ends_f || !parse_small_int(s.substr(0, a), 1, 64, &x) ||
      !parse_small_int(s.substr(a + 1, s.size() - a - 2), 1, 64, &y))
    return invalid_argument("topology '" + s + "': expected 'mono', 'xAyF' (e.g. 2A1F, 1 <= x, y <= 64) or 'EPn'");
  t.wiring = Wiring::afd;
  t.n_attention = x;
  t.n_ffn = y;
  return t;
}

Status parse_shard(const std::string& s, int* shard, int* n_shards) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || !parse_small_int(s.substr(0, slash), 0, 63, shard) ||
      !parse_small_int(s.substr(slash + 1), 1, 64, n_shards) || *shard >= *n_shards)
    return invalid_argument("shard '" + s + "': expected i/y with 0 <= i < y <= 64");
  return Status();
}

}  // namespace afd
