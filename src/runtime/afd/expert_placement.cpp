#include "runtime/afd/expert_placement.h"

#include <algorithm>
#include <utility>

#include "core/dtype.h"
#include "plan/eplb.h"

namespace afd {

ExpertPlacement contiguous_expert_placement(const ModelConfig& c, std::span<const int> slots) {
  ExpertPlacement p;
  p.n_experts = c.n_experts;
  p.replicas.resize(static_cast<size_t>(c.n_layers));
  const int64_t E = c.n_experts, n = static_cast<int64_t>(slots.size());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!c.is_moe_layer(l) || n == 0) continue;
    auto& row = p.replicas[static_cast<size_t>(l)];
    row.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) row[static_cast<size_t>(e)] = {slots[static_cast<size_t>(e * n / E)]};
  }
  return p;
}

ExpertLoadCounter::ExpertLoadCounter(const ModelConfig& c) : counts_(static_cast<size_t>(c.n_layers)) {
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (c.is_moe_layer(l)) counts_[static_cast<size_t>(l)].assign(static_cast<size_t>(c.n_experts), 0.0);
}

void ExpertLoadCounter::add(int64_t layer, std::span<const int32_t> topk_ids) {
  std::vector<double>& row = counts_[static_cast<size_t>(layer)];
  if (row.empty()) return;
  for (int32_t e : topk_ids) row[static_cast<size_t>(e)] += 1;
  total_ += static_cast<double>(topk_ids.size());
}

void ExpertLoadCounter::decay(double f) {
  for (auto& row : counts_)
    for (double& v : row) v *= f;
  total_ *= f;
}

Result<PlacementPlan> plan_expert_placement(const ModelConfig& c, const ExpertLoadCounter& counts,
                                            std::span<const int> slots, int64_t redundant) {
  const int64_t E = c.n_experts, y = static_cast<int64_t>(slots.size());
  if (y < 1) return invalid_argument("expert placement: no FFN worker to place experts on");
  if (redundant < 0) return invalid_argument("expert placement: redundant replicas must be >= 0");
  // (E + R) must divide over the slots, and no slot may hold an expert twice: (E + R) / y <= E,
  // so at most E (y - 1) replicas (all of them on every slot; none with one slot).
  int64_t R = std::min(redundant, E * (y - 1));
  while ((E + R) % y != 0) ++R;
  PlacementPlan out;
  out.redundant = R;
  out.placement.n_experts = E;
  out.placement.replicas.resize(static_cast<size_t>(c.n_layers));
  plan::EplbOptions o;
  o.n_workers = static_cast<int>(y);
  o.redundant = R;
  AFD_RETURN_IF_ERROR(plan::check_eplb_options(E, o));
  double sum_c = 0, sum_p = 0, worst_c = 1, worst_p = 1;
  int layers = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::vector<double>& row = counts.layer(l);
    AFD_ASSIGN_OR_RETURN(plan::LayerPlacement lp, plan::eplb_placement(row, o));
    const plan::LayerPlacement cp = plan::contiguous_placement(row, static_cast<int>(y));
    auto& dst = out.placement.replicas[static_cast<size_t>(l)];
    dst.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      for (int32_t wk : lp.expert_workers[static_cast<size_t>(e)]) dst[static_cast<size_t>(e)].push_back(slots[wk]);
    sum_c += cp.max_over_mean();
    sum_p += lp.max_over_mean();
    worst_c = std::max(worst_c, cp.max_over_mean());
    worst_p = std::max(worst_p, lp.max_over_mean());
    ++layers;
  }
  if (layers > 0) {
    out.contiguous_mean = sum_c / layers;
    out.planned_mean = sum_p / layers;
  }
  out.contiguous_worst = worst_c;
  out.planned_worst = worst_p;
  return out;
}

Status route_placed(const ExpertPlacement& p, int64_t layer, const TokenRoutes& in, std::span<const int> slots,
                    int shared_slot, bool shared_rows, std::vector<int64_t>* turn, std::vector<PlacedSlot>* out) {
  const size_t ns = slots.size();
  out->resize(ns);
  const int64_t n = in.n, K = in.moe ? in.top_k : 0, E = p.n_experts;
  // slot -> its index in `slots`.
  int max_slot = 0;
  for (int s : slots) max_slot = std::max(max_slot, s);
  std::vector<int> index_of(static_cast<size_t>(max_slot) + 1, -1);
  for (size_t i = 0; i < ns; ++i) index_of[static_cast<size_t>(slots[i])] = static_cast<int>(i);
  const int shared_i = shared_slot >= 0 && shared_slot <= max_slot ? index_of[static_cast<size_t>(shared_slot)] : -1;
  std::vector<uint8_t> takes(ns * static_cast<size_t>(n), 0);  // [slot index][token]
  for (size_t i = 0; i < ns; ++i) {
    PlacedSlot& s = (*out)[i];
    s.rows.clear();
    s.reply_rows.clear();
    s.reply_parts.clear();
    s.ids.assign(static_cast<size_t>(n * K), -1);
  }
  if (K > 0) {
    const auto& rep = p.replicas[static_cast<size_t>(layer)];
    if (turn->size() != static_cast<size_t>(E)) turn->assign(static_cast<size_t>(E), 0);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = in.topk_ids[static_cast<size_t>(t * K + k)];
        if (e < 0 || e >= E)
          return invalid_argument("expert placement: token " + std::to_string(t) + " is routed to expert " +
                                  std::to_string(e) + ", outside [0, " + std::to_string(E) + ")");
        const std::vector<int>& r = rep[static_cast<size_t>(e)];
        if (r.empty()) return invalid_argument("expert placement: expert " + std::to_string(e) + " of layer " +
                                               std::to_string(layer) + " has no replica");
        const int slot = r[static_cast<size_t>((*turn)[static_cast<size_t>(e)]++ % static_cast<int64_t>(r.size()))];
        const int i = slot <= max_slot ? index_of[static_cast<size_t>(slot)] : -1;
        if (i < 0)
          return invalid_argument("expert placement: expert " + std::to_string(e) + " of layer " +
                                  std::to_string(layer) + " is placed on FFN slot " + std::to_string(slot) +
                                  ", which is not in the assignment");
        (*out)[static_cast<size_t>(i)].ids[static_cast<size_t>(t * K + k)] = e;
        takes[static_cast<size_t>(i) * static_cast<size_t>(n) + static_cast<size_t>(t)] = 1;
      }
    }
  }
  if (shared_rows && shared_i >= 0)
    for (int64_t t = 0; t < n; ++t) takes[static_cast<size_t>(shared_i) * static_cast<size_t>(n) + static_cast<size_t>(t)] = 1;
  std::vector<std::pair<int32_t, int32_t>> pairs;  // (expert, token) of one slot
  for (size_t i = 0; i < ns; ++i) {
    PlacedSlot& s = (*out)[i];
    for (int64_t t = 0; t < n; ++t)
      if (takes[i * static_cast<size_t>(n) + static_cast<size_t>(t)]) s.rows.push_back(static_cast<int32_t>(t));
    pairs.clear();
    for (int32_t t : s.rows)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = s.ids[static_cast<size_t>(t * K + k)];
        if (e >= 0) pairs.emplace_back(e, t);
      }
    std::sort(pairs.begin(), pairs.end());
    for (auto [e, t] : pairs) {
      s.reply_rows.push_back(t);
      s.reply_parts.push_back(e);
    }
    if (shared_rows && static_cast<int>(i) == shared_i)
      for (int32_t t : s.rows) {
        s.reply_rows.push_back(t);
        s.reply_parts.push_back(static_cast<int32_t>(E));
      }
  }
  return Status();
}

void sum_placed_replies(std::span<const PlacedSlot> slots, std::span<const uint16_t* const> replies, int64_t n,
                        int64_t H, float* out) {
  struct Entry {
    int32_t part;
    const uint16_t* row;
  };
  std::vector<int64_t> start(static_cast<size_t>(n + 1), 0);
  for (const PlacedSlot& s : slots)
    for (int32_t t : s.reply_rows) ++start[static_cast<size_t>(t) + 1];
  for (int64_t t = 0; t < n; ++t) start[t + 1] += start[t];
  std::vector<Entry> entries(static_cast<size_t>(start[n]));
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (size_t i = 0; i < slots.size(); ++i) {
    const PlacedSlot& s = slots[i];
    for (size_t r = 0; r < s.reply_rows.size(); ++r)
      entries[static_cast<size_t>(fill[static_cast<size_t>(s.reply_rows[r])]++)] =
          Entry{s.reply_parts[r], replies[i] + static_cast<int64_t>(r) * H};
  }
  std::fill(out, out + n * H, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    auto b = entries.begin() + start[t], e = entries.begin() + start[t + 1];
    std::sort(b, e, [](const Entry& x, const Entry& y) { return x.part < y.part; });
    float* o = out + t * H;
    for (auto it = b; it != e; ++it)
      for (int64_t c = 0; c < H; ++c) o[c] += bf16_to_f32(it->row[c]);
  }
}

}  // namespace afd
