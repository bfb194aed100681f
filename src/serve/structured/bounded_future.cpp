#include "serve/structured/bounded_future.h"

#include <array>
#include <limits>
#include <vector>

namespace afd::serve {
namespace {

// States described by bounded_future_key(): enough to tell apart what differs near a state, few
// enough to cost a few microseconds.
constexpr int32_t kKeyStates = 64;

inline void mix(uint64_t* h, int64_t x) {
  *h ^= static_cast<uint64_t>(x);
  *h *= 0xBF58476D1CE4E5B9ull;
  *h ^= *h >> 31;
}

}  // namespace

uint64_t bounded_future_key(const GrammarAutomaton& a, int32_t state, int32_t depth) {
  // Breadth-first from state: each listed state with its flags, calls and targets named by order of
  // discovery; past kMaxNamed named states, a new target is named -2 (the same on equal futures).
  constexpr size_t kMaxNamed = 2 * kKeyStates, kSlots = 512;  // kSlots > 2 * kMaxNamed: open addressing
  std::array<int32_t, kSlots> slot_state, slot_name;
  slot_state.fill(-1);
  std::vector<int32_t> found, dist;
  auto name = [&](int32_t t, int32_t d) -> int64_t {
    size_t i = (static_cast<uint32_t>(t) * 0x9E3779B1u) % kSlots;
    while (slot_state[i] >= 0 && slot_state[i] != t) i = (i + 1) % kSlots;
    if (slot_state[i] == t) return slot_name[i];
    if (found.size() >= kMaxNamed) return -2;
    slot_state[i] = t;
    slot_name[i] = static_cast<int32_t>(found.size());
    found.push_back(t);
    dist.push_back(d);
    return slot_name[i];
  };
  name(state, 0);
  uint64_t h = 0x9E3779B97F4A7C15ull;
  mix(&h, a.call_free(state));
  const size_t k = static_cast<size_t>(a.n_classes);
  for (size_t i = 0; i < found.size() && i < static_cast<size_t>(kKeyStates); ++i) {
    const int32_t x = found[i], d = dist[i];
    mix(&h, a.final_[x] | a.consumes_[x] << 1 | int32_t{d < depth} << 2);
    for (int32_t c = a.call_begin[x]; c < a.call_begin[x + 1]; ++c) {
      mix(&h, a.calls[c].start);
      const bool later = !a.machine_nullable[a.machine[a.calls[c].start]];
      mix(&h, a.calls[c].ret < 0 ? -1 : later && d >= depth ? -3 : name(a.calls[c].ret, later ? d + 1 : d));
    }
    if (d >= depth) continue;
    const int32_t* row = a.next_.data() + size_t(x) * k;
    for (size_t c = 0; c < k; ++c) mix(&h, row[c] < 0 ? -1 : name(row[c], d + 1));
  }
  return h;
}

bool same_bounded_future(const GrammarAutomaton& a, int32_t x, int32_t y, int32_t depth, int32_t max_pairs) {
  if (a.call_free(x) != a.call_free(y)) return false;
  constexpr int32_t kFar = std::numeric_limits<int32_t>::max();
  const size_t n = static_cast<size_t>(a.n_states), k = static_cast<size_t>(a.n_classes);
  // pair[u]: the y-side state u is paired with; dist[u]: the least distance the pair was reached at.
  // Pairs are checked layer by layer; a return pairs into the layer being checked.
  std::vector<int32_t> pair(n, -1), dist(n, kFar), layer, next_layer;
  std::vector<uint8_t> checked(n, 0);
  int32_t n_pairs = 0;
  auto relate = [&](int32_t u, int32_t v, int32_t d, std::vector<int32_t>* into) {
    if (pair[u] < 0) {
      pair[u] = v;
      ++n_pairs;
    } else if (pair[u] != v) {
      return false;
    }
    if (dist[u] > d) dist[u] = d, into->push_back(u);
    return true;
  };
  relate(x, y, 0, &layer);
  for (int32_t d = 0; !layer.empty(); ++d) {
    for (size_t i = 0; i < layer.size(); ++i) {
      const int32_t u = layer[i], v = pair[u];
      if (checked[u] || dist[u] != d) continue;
      checked[u] = 1;
      if (n_pairs > max_pairs) return false;
      if (u == v) continue;  // the same state: the same future
      if (a.final_[u] != a.final_[v] || a.consumes_[u] != a.consumes_[v]) return false;
      const int32_t cu = a.call_begin[u], cv = a.call_begin[v];
      if (a.call_begin[u + 1] - cu != a.call_begin[v + 1] - cv) return false;
      for (int32_t c = 0; c < a.call_begin[u + 1] - cu; ++c) {
        const GrammarAutomaton::Call &p = a.calls[cu + c], &q = a.calls[cv + c];
        if (p.start != q.start || (p.ret < 0) != (q.ret < 0)) return false;
        if (p.ret < 0) continue;
        // A callee that consumes a byte returns one byte later at least: past the depth, never.
        const bool later = !a.machine_nullable[a.machine[p.start]];
        if (later && d >= depth) continue;
        if (!relate(p.ret, q.ret, later ? d + 1 : d, later ? &next_layer : &layer)) return false;
      }
      if (d >= depth) continue;
      const int32_t* ru = a.next_.data() + size_t(u) * k;
      const int32_t* rv = a.next_.data() + size_t(v) * k;
      for (size_t c = 0; c < k; ++c) {
        if ((ru[c] < 0) != (rv[c] < 0)) return false;
        if (ru[c] >= 0 && !relate(ru[c], rv[c], d + 1, &next_layer)) return false;
      }
    }
    layer.swap(next_layer);
    next_layer.clear();
  }
  return true;
}

}  // namespace afd::serve
