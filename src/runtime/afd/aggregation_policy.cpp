#include "runtime/afd/aggregation_policy.h"

namespace afd {

AggregationPolicy::AggregationPolicy(uint32_t n_layers, int64_t peer_timeout_ns, int64_t gather_window_ns)
    : n_layers_(n_layers), peer_timeout_ns_(peer_timeout_ns), gather_window_ns_(gather_window_ns) {}

const AggSlot* AggregationPolicy::slot(const AggGrid& g, size_t peer, int mb) {
  const auto& row = g[peer];
  return mb >= 0 && static_cast<size_t>(mb) < row.size() ? row[static_cast<size_t>(mb)] : nullptr;
}

std::optional<BatchKey> AggregationPolicy::next_batch(const AggGrid& g, size_t rotate) const {
  std::optional<BatchKey> best;
  for (size_t k = 0; k < g.size(); ++k) {
    const size_t p = (rotate + k) % g.size();
    for (size_t m = 0; m < g[p].size(); ++m) {
      const AggSlot& s = *g[p][m];
      if (s.ready && (!best || s.layer < best->layer)) best = BatchKey{p, static_cast<int>(m), s.layer};
    }
  }
  return best;
}

bool AggregationPolicy::is_behind(const AggSlot& s, uint32_t layer) const {
  return !s.ready && s.receiving && s.expect_layer >= 0 && s.expect_layer < static_cast<int>(layer);
}

bool AggregationPolicy::is_expected(const AggSlot& s, uint32_t layer) const {
  if (s.ready) return false;
  if (layer > 0) return s.expect_layer == static_cast<int>(layer);
  return s.expect_layer < 0 && s.active_last_step;
}

std::vector<size_t> AggregationPolicy::behind(const AggGrid& g, const BatchKey& key) const {
  std::vector<size_t> out;
  for (size_t q = 0; q < g.size(); ++q) {
    const AggSlot* s = slot(g, q, key.mb);
    if (q != key.peer && s != nullptr && is_behind(*s, key.layer)) out.push_back(q);
  }
  return out;
}

std::vector<size_t> AggregationPolicy::give_up_behind(const AggGrid& g, const BatchKey& key) const {
  std::vector<size_t> late = behind(g, key);
  for (size_t q : late) g[q][static_cast<size_t>(key.mb)]->expect_layer = -1;
  return late;
}

std::vector<size_t> AggregationPolicy::waiting_for(const AggGrid& g, const BatchKey& key) const {
  std::vector<size_t> out;
  for (size_t q = 0; q < g.size(); ++q) {
    const AggSlot* s = slot(g, q, key.mb);
    if (q != key.peer && s != nullptr && s->receiving && is_expected(*s, key.layer)) out.push_back(q);
  }
  return out;
}

AggregationPolicy::GatherEnd AggregationPolicy::end_gather(const AggGrid& g, const BatchKey& key) const {
  GatherEnd end;
  for (size_t q = 0; q < g.size(); ++q) {
    const AggSlot* s = slot(g, q, key.mb);
    if (q == key.peer || s == nullptr || !is_expected(*s, key.layer)) continue;
    AggSlot& w = *g[q][static_cast<size_t>(key.mb)];
    if (key.layer == 0) {
      w.active_last_step = false;
      end.skipped.push_back(q);
    } else {
      w.expect_layer = -1;
      end.late.push_back(q);
    }
  }
  return end;
}

std::vector<size_t> AggregationPolicy::members(const AggGrid& g, const BatchKey& key) const {
  std::vector<size_t> out;
  for (size_t q = 0; q < g.size(); ++q) {
    const AggSlot* s = slot(g, q, key.mb);
    if (s != nullptr && s->ready && s->layer == key.layer) out.push_back(q);
  }
  return out;
}

void AggregationPolicy::served(AggSlot& s, uint32_t layer) const {
  const bool last = layer + 1 >= n_layers_;
  s.expect_layer = last ? -1 : static_cast<int>(layer + 1);
  if (last) s.active_last_step = true;
}

}  // namespace afd
