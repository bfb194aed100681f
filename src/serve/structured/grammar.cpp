#include "serve/structured/grammar.h"

#include <algorithm>
#include <string>

#include "serve/structured/grammar_automaton.h"

namespace afd::serve {
namespace {

// Deepest expression nesting accepted (the parser bounds it; make() checks it again so no
// recursion over request data can go deeper).
constexpr int32_t kMaxExprDepth = 512;

std::string at(int32_t line, int32_t column) {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

// Strongly connected components of adj (iterative Tarjan). Returns the component of each node;
// components are numbered so that every edge goes to a component of the same or a lower number.
std::vector<int32_t> components(const std::vector<std::vector<int32_t>>& adj) {
  const int32_t n = static_cast<int32_t>(adj.size());
  std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1), stack;
  std::vector<uint8_t> on(n, 0);
  struct Frame {
    int32_t v;
    size_t i;
  };
  std::vector<Frame> calls;
  int32_t next_index = 0, next_comp = 0;
  for (int32_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    auto enter = [&](int32_t v) {
      index[v] = low[v] = next_index++;
      stack.push_back(v);
      on[v] = 1;
      calls.push_back({v, 0});
    };
    enter(s);
    while (!calls.empty()) {
      Frame& f = calls.back();
      const int32_t v = f.v;
      if (f.i < adj[v].size()) {
        const int32_t w = adj[v][f.i++];
        if (index[w] < 0) {
          enter(w);
        } else if (on[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        int32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on[w] = 0;
          comp[w] = next_comp;
        } while (w != v);
        ++next_comp;
      }
      calls.pop_back();
      if (!calls.empty()) low[calls.back().v] = std::min(low[calls.back().v], low[v]);
    }
  }
  return comp;
}

// Indices of the expressions of a rule's body: children always come before their parent, and the
// parser creates one rule's body as one contiguous range ending at the body.
struct Span {
  int32_t first, last;
};

}  // namespace

Grammar::~Grammar() = default;

Result<std::shared_ptr<const Grammar>> Grammar::make(std::vector<GrammarRule> rules, std::vector<GrammarExpr> exprs,
                                                     int32_t root, const GrammarLimits& limits) {
  const int32_t n_rules = static_cast<int32_t>(rules.size());
  const int32_t n_exprs = static_cast<int32_t>(exprs.size());
  if (root < 0 || root >= n_rules) return invalid_argument("the grammar has no rule named 'root'");
  if (n_rules > limits.max_rules)
    return invalid_argument("the grammar has " + std::to_string(n_rules) + " rules, more than the limit " +
                            std::to_string(limits.max_rules));
  for (const GrammarRule& r : rules) {
    if (r.expr < 0) return invalid_argument(at(r.ref_line, r.ref_column) + ": rule '" + r.name + "' is not defined");
  }
  // Structure: children before parents, nesting bounded, references in range.
  std::vector<int32_t> depth(n_exprs, 1);
  for (int32_t e = 0; e < n_exprs; ++e) {
    const GrammarExpr& x = exprs[e];
    for (int32_t c : x.children) {
      if (c < 0 || c >= e) return internal_error("grammar expression " + std::to_string(e) + " has a later child");
      depth[e] = std::max(depth[e], depth[c] + 1);
    }
    if (depth[e] > kMaxExprDepth)
      return invalid_argument(at(x.line, x.column) + ": expression nested more than " + std::to_string(kMaxExprDepth) +
                              " deep");
    if (x.kind == ExprKind::ref && (x.rule < 0 || x.rule >= n_rules))
      return internal_error("grammar expression " + std::to_string(e) + " references no rule");
    if (x.kind == ExprKind::repeat && x.children.size() != 1)
      return internal_error("grammar repetition " + std::to_string(e) + " has no single body");
  }
  // Each rule's body span, and the reference graph.
  std::vector<Span> span(n_rules);
  {
    std::vector<std::pair<int32_t, int32_t>> bodies;  // (body expr, rule)
    for (int32_t r = 0; r < n_rules; ++r) bodies.push_back({rules[r].expr, r});
    std::sort(bodies.begin(), bodies.end());
    int32_t first = 0;
    for (auto [body, r] : bodies) {
      if (body < first) return internal_error("rules share grammar expressions");
      span[r] = {first, body};
      first = body + 1;
    }
  }
  std::vector<std::vector<int32_t>> refs(n_rules);
  for (int32_t r = 0; r < n_rules; ++r) {
    for (int32_t e = span[r].first; e <= span[r].last; ++e)
      if (exprs[e].kind == ExprKind::ref) refs[r].push_back(exprs[e].rule);
    std::sort(refs[r].begin(), refs[r].end());
    refs[r].erase(std::unique(refs[r].begin(), refs[r].end()), refs[r].end());
  }
  std::vector<int32_t> comp = components(refs);
  int32_t n_comp = 0;
  for (int32_t c : comp) n_comp = std::max(n_comp, c + 1);
  std::vector<std::vector<int32_t>> members(n_comp);
  for (int32_t r = 0; r < n_rules; ++r) members[comp[r]].push_back(r);

  // Nullable and productive (derives some finite string), per component, callees first.
  std::vector<uint8_t> nullable(n_exprs, 0), productive(n_exprs, 0);
  std::vector<uint8_t> rule_nullable(n_rules, 0), rule_productive(n_rules, 0);
  auto eval_rule = [&](int32_t r) {
    for (int32_t e = span[r].first; e <= span[r].last; ++e) {
      const GrammarExpr& x = exprs[e];
      bool n = false, p = false;
      switch (x.kind) {
        case ExprKind::bytes:
          n = false;
          p = !x.bytes.empty();
          break;
        case ExprKind::seq:
          n = p = true;
          for (int32_t c : x.children) n = n && nullable[c], p = p && productive[c];
          break;
        case ExprKind::alt:
          for (int32_t c : x.children) n = n || nullable[c], p = p || productive[c];
          break;
        case ExprKind::ref:
          n = rule_nullable[x.rule];
          p = rule_productive[x.rule];
          break;
        case ExprKind::repeat:
          n = x.min == 0 || nullable[x.children[0]];
          p = x.min == 0 || productive[x.children[0]];
          break;
      }
      nullable[e] = n;
      productive[e] = p;
    }
    bool changed = rule_nullable[r] != nullable[span[r].last] || rule_productive[r] != productive[span[r].last];
    rule_nullable[r] = nullable[span[r].last];
    rule_productive[r] = productive[span[r].last];
    return changed;
  };
  for (const std::vector<int32_t>& m : members) {
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t r : m) changed = eval_rule(r) || changed;
    }
  }
  // Left recursion: a cycle of references reachable without consuming a byte.
  std::vector<std::vector<int32_t>> first_refs(n_rules);
  {
    std::vector<int32_t> todo;
    for (int32_t r = 0; r < n_rules; ++r) {
      todo.assign(1, rules[r].expr);
      while (!todo.empty()) {
        const GrammarExpr& x = exprs[todo.back()];
        todo.pop_back();
        switch (x.kind) {
          case ExprKind::bytes: break;
          case ExprKind::ref: first_refs[r].push_back(x.rule); break;
          case ExprKind::alt:
            for (int32_t c : x.children) todo.push_back(c);
            break;
          case ExprKind::seq:
            for (int32_t c : x.children) {
              todo.push_back(c);
              if (!nullable[c]) break;
            }
            break;
          case ExprKind::repeat:
            if (x.max != 0) todo.push_back(x.children[0]);
            break;
        }
      }
      std::sort(first_refs[r].begin(), first_refs[r].end());
      first_refs[r].erase(std::unique(first_refs[r].begin(), first_refs[r].end()), first_refs[r].end());
    }
    std::vector<int32_t> lcomp = components(first_refs);
    std::vector<int32_t> comp_size(n_rules, 0);
    for (int32_t r = 0; r < n_rules; ++r) ++comp_size[lcomp[r]];
    for (int32_t r = 0; r < n_rules; ++r) {
      bool self = std::binary_search(first_refs[r].begin(), first_refs[r].end(), r);
      if (self || comp_size[lcomp[r]] > 1) {
        std::string cycle = rules[r].name;
        // Name one cycle: follow first references inside the component back to r.
        int32_t v = r;
        for (int32_t steps = 0; steps < n_rules && !self; ++steps) {
          int32_t w = -1;
          for (int32_t u : first_refs[v])
            if (lcomp[u] == lcomp[r]) {
              w = u;
              break;
            }
          if (w < 0) break;
          cycle += " -> " + rules[w].name;
          v = w;
          if (w == r) break;
        }
        if (self) cycle += " -> " + rules[r].name;
        return invalid_argument(at(rules[r].line, rules[r].column) + ": rule '" + rules[r].name +
                                "' is left-recursive (" + cycle + " without consuming input)");
      }
    }
  }
  // Every rule the root reaches must be able to complete.
  {
    std::vector<uint8_t> seen(n_rules, 0);
    std::vector<int32_t> todo = {root};
    seen[root] = 1;
    while (!todo.empty()) {
      int32_t r = todo.back();
      todo.pop_back();
      if (!rule_productive[r])
        return invalid_argument(at(rules[r].line, rules[r].column) + ": rule '" + rules[r].name +
                                "' can never complete (every alternative recurses or is an empty class)");
      for (int32_t s : refs[r])
        if (!seen[s]) seen[s] = 1, todo.push_back(s);
    }
  }
  std::shared_ptr<Grammar> g(new Grammar());
  g->rules_ = std::move(rules);
  g->exprs_ = std::move(exprs);
  g->root_ = root;
  g->recursive_.assign(n_rules, 0);
  std::vector<int32_t> comp_count(n_comp, 0);
  for (int32_t r = 0; r < n_rules; ++r) ++comp_count[comp[r]];
  for (int32_t r = 0; r < n_rules; ++r)
    g->recursive_[r] = comp_count[comp[r]] > 1 || std::binary_search(refs[r].begin(), refs[r].end(), r);
  AFD_ASSIGN_OR_RETURN(GrammarAutomaton a, build_grammar_automaton(*g, limits));
  g->automaton_ = std::make_unique<GrammarAutomaton>(std::move(a));
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace afd::serve
