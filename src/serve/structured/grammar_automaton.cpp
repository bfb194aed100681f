#include "serve/structured/grammar_automaton.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "serve/structured/automaton_passes.h"
#include "serve/structured/grammar.h"

namespace afd::serve {
namespace {

// Inlining a rule reference recurses through the referenced body; past this depth of build
// recursion a reference becomes a call instead (bounds the C++ stack on any grammar).
constexpr int32_t kMaxInlineDepth = 256;
// A repetition X{m,n} is built copy by copy. When its body takes at least kMinCalledBodyStates NFA
// states and the copies together would take more than kMaxInlineRepeatStates, the body becomes a
// machine of its own and each copy is a call to it (one state per copy instead of the body's
// size): an array of up to 50 objects compiles instead of passing max_automaton_states. Inlined
// copies keep masks cheap (a token inside the repetition is one DFA walk) while every return from
// a call costs stack steps, so only large bodies, which a token rarely crosses, are called; a
// small body such as one JSON string character stays inlined (a call per character makes masks
// cost milliseconds).
constexpr int64_t kMaxInlineRepeatStates = 32768;
constexpr int64_t kMinCalledBodyStates = 256;

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Thompson NFA of all machines: byte edges, epsilon edges, call edges.
class NfaBuilder {
 public:
  NfaBuilder(const Grammar& g, const GrammarLimits& limits) : g_(g), limits_(limits) {
    machine_of_expr_.assign(g.exprs().size(), -1);
    inline_size_.assign(g.exprs().size(), -1);
  }

  struct Edge {
    int32_t set, to;
  };
  struct CallEdge {
    int32_t machine, to;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int32_t> eps;
    std::vector<CallEdge> calls;
    int32_t machine = -1;
    bool in_long_repeat = false;
  };
  // A machine matches one expression: a rule's body, or the body of a repetition built as calls.
  struct Machine {
    int32_t expr, start, accept;
  };

  // Builds the machine of rule `root` and of every machine it calls; returns the root's machine.
  Result<int32_t> build_all(int32_t root) {
    enqueue(g_.rules()[root].expr);
    for (size_t m = 0; m < machines_.size(); ++m) {
      current_ = static_cast<int32_t>(m);
      AFD_ASSIGN_OR_RETURN(int32_t start, new_state());
      AFD_ASSIGN_OR_RETURN(int32_t end, build(machines_[m].expr, start, 0));
      machines_[m].start = start;
      machines_[m].accept = end;
    }
    return 0;
  }

  std::vector<State> states_;
  std::vector<Machine> machines_;
  std::vector<int32_t> machine_of_expr_;  // [exprs] -> machine, -1: none
  std::vector<ByteSet> sets_;

 private:
  Result<int32_t> new_state() {
    if (static_cast<int64_t>(states_.size()) >= limits_.max_automaton_states)
      return invalid_argument("the grammar needs more than " + std::to_string(limits_.max_automaton_states) +
                              " automaton states");
    states_.emplace_back();
    states_.back().machine = current_;
    return static_cast<int32_t>(states_.size() - 1);
  }
  // The machine of expression e, queued for building when new.
  int32_t enqueue(int32_t e) {
    if (machine_of_expr_[e] < 0) {
      machine_of_expr_[e] = static_cast<int32_t>(machines_.size());
      machines_.push_back({e, -1, -1});
    }
    return machine_of_expr_[e];
  }
  // NFA states build(e) adds when inlined, saturated at kSizeCap (a call counts one state).
  // Iterative over children-before-parents order: every child index is below its parent's.
  static constexpr int64_t kSizeCap = int64_t{1} << 40;
  int64_t inline_size(int32_t e) {
    if (inline_size_[e] >= 0) return inline_size_[e];
    // Children (and inlined rule bodies) have lower indices only for children; a rule body may come
    // later, so resolve by an explicit stack.
    std::vector<int32_t> todo = {e};
    while (!todo.empty()) {
      const int32_t x = todo.back();
      if (inline_size_[x] >= 0) {
        todo.pop_back();
        continue;
      }
      const GrammarExpr& ex = g_.exprs()[x];
      std::vector<int32_t> deps = ex.children;
      const bool inlined_ref = ex.kind == ExprKind::ref && !g_.is_recursive(ex.rule);
      if (inlined_ref) deps.push_back(g_.rules()[ex.rule].expr);
      bool ready = true;
      for (int32_t d : deps)
        if (inline_size_[d] < 0) ready = false, todo.push_back(d);
      if (!ready) continue;
      todo.pop_back();
      int64_t n = 0;
      switch (ex.kind) {
        case ExprKind::bytes: n = 1; break;
        case ExprKind::seq:
          for (int32_t c : ex.children) n += inline_size_[c];
          break;
        case ExprKind::alt:
          n = 1;
          for (int32_t c : ex.children) n += 1 + inline_size_[c];
          break;
        case ExprKind::ref: n = inlined_ref ? inline_size_[deps.back()] : 1; break;
        case ExprKind::repeat: {
          const int64_t copies = ex.max < 0 ? int64_t{ex.min} + 1 : ex.max;
          n = 2 + std::min(kSizeCap, copies * inline_size_[ex.children[0]]);
          break;
        }
      }
      inline_size_[x] = std::min(n, kSizeCap);
    }
    return inline_size_[e];
  }
  int32_t set_index(const ByteSet& s) {
    auto [it, inserted] = set_ids_.emplace(s.bits, static_cast<int32_t>(sets_.size()));
    if (inserted) sets_.push_back(s);
    return it->second;
  }
  // Adds expression e starting at state `from`; returns the state where it ends.
  Result<int32_t> build(int32_t e, int32_t from, int32_t depth) {
    if (++n_elements_ > limits_.max_elements)
      return invalid_argument("the grammar expands to more than " + std::to_string(limits_.max_elements) +
                              " elements (repetitions counted per copy)");
    const GrammarExpr& x = g_.exprs()[e];
    switch (x.kind) {
      case ExprKind::bytes: {
        AFD_ASSIGN_OR_RETURN(int32_t to, new_state());
        states_[from].edges.push_back({set_index(x.bytes), to});
        return to;
      }
      case ExprKind::seq: {
        int32_t cur = from;
        for (int32_t c : x.children) {
          AFD_ASSIGN_OR_RETURN(cur, build(c, cur, depth + 1));
        }
        return cur;
      }
      case ExprKind::alt: {
        AFD_ASSIGN_OR_RETURN(int32_t to, new_state());
        for (int32_t c : x.children) {
          AFD_ASSIGN_OR_RETURN(int32_t begin, new_state());
          states_[from].eps.push_back(begin);
          AFD_ASSIGN_OR_RETURN(int32_t end, build(c, begin, depth + 1));
          states_[end].eps.push_back(to);
        }
        return to;
      }
      case ExprKind::ref: {
        if (!g_.is_recursive(x.rule) && depth < kMaxInlineDepth) return build(g_.rules()[x.rule].expr, from, depth + 1);
        return build_call(g_.rules()[x.rule].expr, from);
      }
      case ExprKind::repeat: {
        const int32_t body = x.children[0];
        // One copy of the body from `at`: inlined, or a call to the body's own machine.
        const int64_t copies = x.max < 0 ? int64_t{x.min} + 1 : x.max;
        const int64_t size = inline_size(body);
        const bool call = size >= kMinCalledBodyStates && copies * size > kMaxInlineRepeatStates;
        // A body that is a reference to a non-recursive rule shares that rule's machine.
        int32_t callee = body;
        while (g_.exprs()[callee].kind == ExprKind::ref && !g_.is_recursive(g_.exprs()[callee].rule))
          callee = g_.rules()[g_.exprs()[callee].rule].expr;
        auto copy = [&](int32_t at) -> Result<int32_t> {
          if (call) return build_call(callee, at);
          return build(body, at, depth + 1);
        };
        if (copies >= kLongRepeatCopies) {
          const size_t first = states_.size();
          AFD_ASSIGN_OR_RETURN(int32_t end, build_copies(x, from, copy));
          for (size_t s = first; s < states_.size(); ++s) states_[s].in_long_repeat = true;
          states_[from].in_long_repeat = true;
          return end;
        }
        return build_copies(x, from, copy);
      }
    }
    return internal_error("unknown grammar expression kind");
  }
  // The copies of repetition x from `from` (copy(at) adds one); returns the state where they end.
  template <typename Copy>
  Result<int32_t> build_copies(const GrammarExpr& x, int32_t from, const Copy& copy) {
    int32_t cur = from;
    for (int32_t i = 0; i < x.min; ++i) {
      AFD_ASSIGN_OR_RETURN(cur, copy(cur));
    }
    if (x.max < 0) {
      AFD_ASSIGN_OR_RETURN(int32_t loop, new_state());
      states_[cur].eps.push_back(loop);
      AFD_ASSIGN_OR_RETURN(int32_t end, copy(loop));
      states_[end].eps.push_back(loop);
      return loop;
    }
    AFD_ASSIGN_OR_RETURN(int32_t to, new_state());
    for (int32_t i = x.min; i < x.max; ++i) {
      states_[cur].eps.push_back(to);
      AFD_ASSIGN_OR_RETURN(cur, copy(cur));
    }
    states_[cur].eps.push_back(to);
    return to;
  }
  // A call from `from` to the machine of expression e; returns the state the call returns to.
  Result<int32_t> build_call(int32_t e, int32_t from) {
    const int32_t m = enqueue(e);
    AFD_ASSIGN_OR_RETURN(int32_t to, new_state());
    states_[from].calls.push_back({m, to});
    return to;
  }

  const Grammar& g_;
  const GrammarLimits& limits_;
  int32_t current_ = -1;
  int64_t n_elements_ = 0;
  std::vector<int64_t> inline_size_;  // [exprs] memo of inline_size(), -1: not computed
  std::map<std::array<uint64_t, 4>, int32_t> set_ids_;
};

}  // namespace

Result<GrammarAutomaton> build_grammar_automaton(const Grammar& g, const GrammarLimits& limits) {
  NfaBuilder nfa(g, limits);
  AFD_ASSIGN_OR_RETURN(int32_t root_machine, nfa.build_all(g.root()));
  const auto& ns = nfa.states_;
  const int32_t n_nfa = static_cast<int32_t>(ns.size());

  GrammarAutomaton a;
  // Byte classes: bytes that every set treats alike share a class.
  {
    std::array<int32_t, 256> cls{};
    int32_t n = 1;
    for (const ByteSet& s : nfa.sets_) {
      std::vector<int32_t> remap(size_t(n) * 2, -1);
      int32_t m = 0;
      for (int b = 0; b < 256; ++b) {
        int32_t& slot = remap[size_t(cls[b]) * 2 + s.test(static_cast<uint8_t>(b))];
        if (slot < 0) slot = m++;
        cls[b] = slot;
      }
      n = m;
    }
    a.n_classes = n;
    for (int b = 0; b < 256; ++b) a.byte_class[b] = static_cast<uint8_t>(cls[b]);
  }
  std::vector<uint8_t> rep(a.n_classes);  // a byte of each class
  for (int b = 255; b >= 0; --b) rep[a.byte_class[b]] = static_cast<uint8_t>(b);
  std::vector<std::vector<int32_t>> set_classes(nfa.sets_.size());
  for (size_t s = 0; s < nfa.sets_.size(); ++s)
    for (int32_t c = 0; c < a.n_classes; ++c)
      if (nfa.sets_[s].test(rep[c])) set_classes[s].push_back(c);

  // Subset construction over all machines at once (epsilon closure never follows calls).
  std::vector<uint32_t> mark(n_nfa, 0);
  uint32_t stamp = 0;
  std::vector<int32_t> todo;
  auto closure = [&](std::vector<int32_t>& set) {
    ++stamp;
    todo = set;
    set.clear();
    for (int32_t s : todo) mark[s] = stamp;
    while (!todo.empty()) {
      int32_t s = todo.back();
      todo.pop_back();
      set.push_back(s);
      for (int32_t t : ns[s].eps)
        if (mark[t] != stamp) mark[t] = stamp, todo.push_back(t);
    }
    std::sort(set.begin(), set.end());
  };
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
  // Kernel (a set before its closure) -> DFA state: most (state, class) pairs of a state lead to a
  // kernel seen before, which then costs a hash lookup instead of a closure.
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> kernel_ids;
  std::vector<std::vector<int32_t>> sets;
  int64_t work = 0;
  auto intern = [&](const std::vector<int32_t>& kernel) -> Result<int32_t> {
    if (kernel.empty()) return -1;
    if (auto k = kernel_ids.find(kernel); k != kernel_ids.end()) return k->second;
    std::vector<int32_t> set = kernel;
    closure(set);
    work += static_cast<int64_t>(set.size());
    if (work > limits.max_construction_work)
      return invalid_argument("the grammar is too complex to compile (its automaton construction passes " +
                              std::to_string(limits.max_construction_work) +
                              " steps; ambiguous repetitions such as (\"x\"{1,9999})* cost the square of their size)");
    auto it = ids.find(set);
    if (it != ids.end()) {
      kernel_ids.emplace(kernel, it->second);
      return it->second;
    }
    if (static_cast<int64_t>(sets.size()) >= limits.max_automaton_states)
      return invalid_argument("the grammar needs more than " + std::to_string(limits.max_automaton_states) +
                              " automaton states");
    const int32_t id = static_cast<int32_t>(sets.size());
    ids.emplace(set, id);
    kernel_ids.emplace(kernel, id);
    sets.push_back(std::move(set));
    return id;
  };
  std::vector<int32_t> machine_start(nfa.machines_.size(), -1);
  auto start_of = [&](int32_t m) -> Result<int32_t> {
    if (machine_start[m] < 0) {
      AFD_ASSIGN_OR_RETURN(machine_start[m], intern({nfa.machines_[m].start}));
    }
    return machine_start[m];
  };
  AFD_ASSIGN_OR_RETURN(a.root_start, start_of(root_machine));
  std::vector<std::vector<int32_t>> buckets(a.n_classes);
  std::vector<std::pair<int32_t, int32_t>> call_targets;  // (machine, to)
  constexpr size_t kMaxSeenKernels = 8;
  std::vector<std::pair<int32_t, int32_t>> seen;  // (class, DFA state) of this state's first distinct kernels
  a.call_begin.push_back(0);
  for (size_t d = 0; d < sets.size(); ++d) {
    // sets grows while this loop runs; copy the member list (references would dangle).
    const std::vector<int32_t> members = sets[d];
    const int32_t m = ns[members[0]].machine;
    a.machine.push_back(m);
    bool long_repeat = false;
    for (int32_t s : members) long_repeat = long_repeat || ns[s].in_long_repeat;
    a.in_long_repeat.push_back(long_repeat);
    bool fin = false;
    for (auto& b : buckets) b.clear();
    call_targets.clear();
    for (int32_t s : members) {
      if (s == nfa.machines_[m].accept) fin = true;
      for (const auto& e : ns[s].edges)
        for (int32_t c : set_classes[e.set]) buckets[c].push_back(e.to);
      for (const auto& c : ns[s].calls) call_targets.push_back({c.machine, c.to});
    }
    a.final_.push_back(fin);
    bool consumes = false;
    seen.clear();
    for (int32_t c = 0; c < a.n_classes; ++c) {
      std::vector<int32_t>& kernel = buckets[c];
      std::sort(kernel.begin(), kernel.end());
      kernel.erase(std::unique(kernel.begin(), kernel.end()), kernel.end());
      // Classes of one state mostly share a few kernels: compare with this state's earlier ones first.
      int32_t t = -2;
      for (const auto& [earlier, id] : seen)
        if (buckets[earlier] == kernel) {
          t = id;
          break;
        }
      if (t == -2) {
        AFD_ASSIGN_OR_RETURN(t, intern(kernel));
        if (seen.size() < kMaxSeenKernels) seen.push_back({c, t});
      }
      a.next_.push_back(t);
      consumes = consumes || t >= 0;
    }
    a.consumes_.push_back(consumes);
    std::sort(call_targets.begin(), call_targets.end());
    for (size_t i = 0; i < call_targets.size();) {
      const int32_t callee = call_targets[i].first;
      std::vector<int32_t> rets;
      for (; i < call_targets.size() && call_targets[i].first == callee; ++i) rets.push_back(call_targets[i].second);
      AFD_ASSIGN_OR_RETURN(int32_t start, start_of(callee));
      AFD_ASSIGN_OR_RETURN(int32_t ret, intern(rets));
      a.calls.push_back({start, ret});
    }
    a.call_begin.push_back(static_cast<int32_t>(a.calls.size()));
  }
  a.n_states = static_cast<int32_t>(sets.size());
  drop_dead_states(&a);
  // A return state that can only end adds nothing: drop the caller's frame instead (tail call),
  // so right recursion and loops through calls keep stacks flat.
  for (auto& c : a.calls)
    if (c.ret >= 0 && a.final_[c.ret] && !a.consumes_[c.ret] && !a.has_calls(c.ret)) c.ret = -1;
  a.machine_calls.assign(nfa.machines_.size(), 0);
  for (int32_t s = 0; s < a.n_states; ++s)
    if (a.has_calls(s)) a.machine_calls[a.machine[s]] = 1;
  merge_equivalent_states(&a);
  mark_nullable_machines(&a);
  return a;
}

}  // namespace afd::serve
