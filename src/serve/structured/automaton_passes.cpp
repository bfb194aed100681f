#include "serve/structured/automaton_passes.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace afd::serve {

// Drops what can never complete: a state is live when its machine can end from it — it is final,
// or a byte leads to a live state, or it calls a live start whose return state is live (or that
// returns past it). Transitions into dead states and calls into or returning to them go, so every
// stack a match reaches can still complete (an alternative such as `"a" []`, whose empty class
// matches nothing, would otherwise accept "a" and then allow nothing).
void drop_dead_states(GrammarAutomaton* a) {
  const int32_t n = a->n_states, k = a->n_classes;
  // Reverse byte edges, and calls by the states they wait on (start and return).
  std::vector<int32_t> rev_begin(size_t(n) + 1, 0), rev;
  for (int32_t s = 0; s < n; ++s)
    for (int32_t c = 0; c < k; ++c)
      if (int32_t t = a->next_[size_t(s) * k + c]; t >= 0) ++rev_begin[t + 1];
  for (int32_t s = 0; s < n; ++s) rev_begin[s + 1] += rev_begin[s];
  rev.resize(static_cast<size_t>(rev_begin[n]));
  {
    std::vector<int32_t> fill(rev_begin.begin(), rev_begin.end() - 1);
    for (int32_t s = 0; s < n; ++s)
      for (int32_t c = 0; c < k; ++c)
        if (int32_t t = a->next_[size_t(s) * k + c]; t >= 0) rev[fill[t]++] = s;
  }
  std::vector<std::vector<int32_t>> waiting(n);  // state -> calls (indices) that wait on it
  std::vector<int32_t> caller(a->calls.size());
  for (int32_t s = 0; s < n; ++s)
    for (int32_t i = a->call_begin[s]; i < a->call_begin[s + 1]; ++i) {
      caller[i] = s;
      waiting[a->calls[i].start].push_back(i);
      if (a->calls[i].ret >= 0) waiting[a->calls[i].ret].push_back(i);
    }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> todo;
  auto mark = [&](int32_t s) {
    if (!live[s]) live[s] = 1, todo.push_back(s);
  };
  for (int32_t s = 0; s < n; ++s)
    if (a->final_[s]) mark(s);
  while (!todo.empty()) {
    const int32_t t = todo.back();
    todo.pop_back();
    for (int32_t i = rev_begin[t]; i < rev_begin[t + 1]; ++i) mark(rev[i]);
    for (int32_t i : waiting[t]) {
      const GrammarAutomaton::Call& c = a->calls[i];
      if (live[c.start] && (c.ret < 0 || live[c.ret])) mark(caller[i]);
    }
  }
  std::vector<GrammarAutomaton::Call> calls;
  std::vector<int32_t> call_begin{0};
  for (int32_t s = 0; s < n; ++s) {
    bool consumes = false;
    for (int32_t c = 0; c < k; ++c) {
      int32_t& t = a->next_[size_t(s) * k + c];
      if (t >= 0 && !live[t]) t = -1;
      consumes = consumes || t >= 0;
    }
    a->consumes_[s] = consumes;
    for (int32_t i = a->call_begin[s]; i < a->call_begin[s + 1]; ++i) {
      const GrammarAutomaton::Call& c = a->calls[i];
      if (live[c.start] && (c.ret < 0 || live[c.ret])) calls.push_back(c);
    }
    call_begin.push_back(static_cast<int32_t>(calls.size()));
  }
  a->calls = std::move(calls);
  a->call_begin = std::move(call_begin);
}

// Merges states that behave alike: same machine, finality, calls and transitions into merged
// states, for a few rounds (each round merges what the previous one made alike; most merges come
// in the first rounds, long chains of them are left). Each merge is sound (the merged states accept
// the same continuations), so matching is unchanged; fewer states means fewer token entries to
// build. States keep their order (a class is numbered by its smallest member).
constexpr int kMergeRounds = 4;
void merge_equivalent_states(GrammarAutomaton* a) {
  const int32_t n = a->n_states, k = a->n_classes;
  std::vector<int32_t> rep(n);
  for (int32_t s = 0; s < n; ++s) rep[s] = s;
  std::vector<std::pair<int32_t, int32_t>> calls_a, calls_b;
  auto calls_of = [&](int32_t s, std::vector<std::pair<int32_t, int32_t>>* out) {
    out->clear();
    for (int32_t i = a->call_begin[s]; i < a->call_begin[s + 1]; ++i)
      out->push_back({rep[a->calls[i].start], a->calls[i].ret < 0 ? -1 : rep[a->calls[i].ret]});
    std::sort(out->begin(), out->end());
    out->erase(std::unique(out->begin(), out->end()), out->end());
  };
  auto target = [&](int32_t s, int32_t c) {
    const int32_t t = a->next_[size_t(s) * k + c];
    return t < 0 ? -1 : rep[t];
  };
  auto same = [&](int32_t x, int32_t y) {
    if (a->final_[x] != a->final_[y] || a->machine[x] != a->machine[y]) return false;
    for (int32_t c = 0; c < k; ++c)
      if (target(x, c) != target(y, c)) return false;
    calls_of(x, &calls_a);
    calls_of(y, &calls_b);
    return calls_a == calls_b;
  };
  std::vector<std::pair<uint64_t, int32_t>> order(n);
  std::vector<int32_t> next_rep(n), distinct;
  for (int round = 0; round < kMergeRounds; ++round) {
    for (int32_t s = 0; s < n; ++s) {
      uint64_t h = (uint64_t{a->final_[s]} << 32) ^ static_cast<uint32_t>(a->machine[s]);
      for (int32_t c = 0; c < k; ++c) h = (h ^ static_cast<uint32_t>(target(s, c) + 1)) * 1099511628211ull;
      calls_of(s, &calls_a);
      for (const auto& [start, ret] : calls_a)
        h = (h ^ (uint64_t(uint32_t(start)) << 32 | uint32_t(ret + 1))) * 0x9E3779B97F4A7C15ull;
      order[s] = {h, s};
    }
    std::sort(order.begin(), order.end());
    bool changed = false;
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      distinct.clear();
      for (; j < order.size() && order[j].first == order[i].first; ++j) {
        const int32_t s = order[j].second;
        int32_t r = s;
        for (int32_t d : distinct)
          if (same(d, s)) {
            r = d;
            break;
          }
        if (r == s) distinct.push_back(s);
        next_rep[s] = r;
      }
      i = j;
    }
    for (int32_t s = 0; s < n; ++s) changed = changed || next_rep[s] != rep[s];
    if (!changed) break;
    rep.swap(next_rep);
  }
  // Renumber: class representatives in order.
  std::vector<int32_t> id(n, -1);
  int32_t m = 0;
  for (int32_t s = 0; s < n; ++s)
    if (rep[s] == s) id[s] = m++;
  if (m == n) return;
  auto map = [&](int32_t t) { return t < 0 ? -1 : id[rep[t]]; };
  GrammarAutomaton b;
  b.n_states = m;
  b.n_classes = k;
  b.byte_class = a->byte_class;
  b.root_start = map(a->root_start);
  b.call_begin.push_back(0);
  for (int32_t s = 0; s < n; ++s) {
    if (rep[s] != s) continue;
    for (int32_t c = 0; c < k; ++c) b.next_.push_back(map(a->next_[size_t(s) * k + c]));
    b.final_.push_back(a->final_[s]);
    b.consumes_.push_back(a->consumes_[s]);
    b.machine.push_back(a->machine[s]);
    b.in_long_repeat.push_back(a->in_long_repeat[s]);
    std::vector<GrammarAutomaton::Call> calls;
    for (int32_t i = a->call_begin[s]; i < a->call_begin[s + 1]; ++i)
      calls.push_back({map(a->calls[i].start), map(a->calls[i].ret)});
    std::sort(calls.begin(), calls.end(),
              [](const auto& x, const auto& y) { return x.start != y.start ? x.start < y.start : x.ret < y.ret; });
    calls.erase(std::unique(calls.begin(), calls.end(),
                            [](const auto& x, const auto& y) { return x.start == y.start && x.ret == y.ret; }),
                calls.end());
    b.calls.insert(b.calls.end(), calls.begin(), calls.end());
    b.call_begin.push_back(static_cast<int32_t>(b.calls.size()));
  }
  b.machine_calls = a->machine_calls;
  *a = std::move(b);
}

// machine_nullable: a machine is nullable when its start reaches a final state through calls of
// nullable machines alone, found by rounds until nothing changes; after kMaxNullableRounds every
// machine not yet found non-nullable counts as nullable (an over-approximation is safe).
constexpr int kMaxNullableRounds = 64;
void mark_nullable_machines(GrammarAutomaton* a) {
  const size_t n_machines = a->machine_calls.size();
  std::vector<int32_t> start(n_machines, -1);
  for (const GrammarAutomaton::Call& c : a->calls) start[a->machine[c.start]] = c.start;
  std::vector<uint8_t>& nullable = a->machine_nullable;
  nullable.assign(n_machines, 0);
  std::vector<int32_t> todo;
  std::vector<uint32_t> seen(static_cast<size_t>(a->n_states), 0);  // == stamp: visited by this search
  uint32_t stamp = 0;
  // Whether s reaches the end of its machine without a byte (a search within s's machine: every
  // round visits each state once at most).
  auto ends_without_byte = [&](int32_t s) {
    ++stamp;
    todo.assign(1, s);
    seen[s] = stamp;
    while (!todo.empty()) {
      const int32_t x = todo.back();
      todo.pop_back();
      if (a->final_[x]) return true;
      for (int32_t i = a->call_begin[x]; i < a->call_begin[x + 1]; ++i) {
        const GrammarAutomaton::Call& c = a->calls[i];
        if (!nullable[a->machine[c.start]]) continue;
        if (c.ret < 0) return true;
        if (seen[c.ret] != stamp) seen[c.ret] = stamp, todo.push_back(c.ret);
      }
    }
    return false;
  };
  for (int round = 0;; ++round) {
    if (round == kMaxNullableRounds) {
      std::fill(nullable.begin(), nullable.end(), 1);
      return;
    }
    bool changed = false;
    for (size_t m = 0; m < n_machines; ++m)
      if (!nullable[m] && start[m] >= 0 && ends_without_byte(start[m])) nullable[m] = 1, changed = true;
    if (!changed) return;
  }
}

}  // namespace afd::serve
