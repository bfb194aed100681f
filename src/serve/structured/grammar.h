// Grammar: a parsed, checked, immutable context-free grammar over bytes (what parse_gbnf() in gbnf.h
// returns). Code-point classes and literals are already expanded into UTF-8 byte sequences, so every
// terminal is a set of bytes. Rules may be recursive; left recursion, undefined rules and rules that
// can never complete are refused when the grammar is made. The byte automaton the matcher runs
// (grammar_automaton.h) is built with it, so a Grammar that exists can be matched.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd::serve {

// Bounds on what a grammar may cost; request data past them is refused (invalid_argument).
struct GrammarLimits {
  int64_t max_text_bytes = 1 << 20;  // GBNF text
  int64_t max_rules = 20000;
  int64_t max_elements = 500000;          // expression nodes, counting each copy a repetition {m,n} makes
  int64_t max_automaton_states = 200000;  // byte-automaton states (NFA and DFA each), all rules together
  // Work of the subset construction: NFA states visited over all DFA states built. A grammar
  // whose DFA states each hold many NFA states (`("x"{1,9999})*`: the k-th holds k) costs the
  // square of its size; past this it is refused instead of taking seconds of CPU per request.
  int64_t max_construction_work = 4000000;
};

// 256 bits: byte b is in the set iff bit b is set.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

enum class ExprKind : uint8_t {
  bytes,   // one byte from `bytes`
  seq,     // children in order (none: the empty string)
  alt,     // one of children
  ref,     // rule `rule`
  repeat,  // children[0] between `min` and `max` times (max -1: unbounded)
};

struct GrammarExpr {
  ExprKind kind = ExprKind::seq;
  int32_t rule = -1;
  int32_t min = 0, max = 0;
  ByteSet bytes;
  std::vector<int32_t> children;  // indices into Grammar::exprs()
  int32_t line = 0, column = 0;   // where it starts in the text (1-based)
};

struct GrammarRule {
  std::string name;
  int32_t expr = -1;                     // body; -1 while only referenced
  int32_t line = 0, column = 0;          // of the definition
  int32_t ref_line = 0, ref_column = 0;  // of the first reference
};

struct GrammarAutomaton;

class Grammar {
 public:
  // Checks the rules and builds the automaton. root: index of the start rule. Children of an
  // expression come before it, and each rule's body is one contiguous range of exprs ending at the
  // body (what the parser makes). Errors
  // (invalid_argument, naming the rule and its line/column): a rule referenced but never defined,
  // left recursion, a rule that can never complete, an automaton past the limits.
  static Result<std::shared_ptr<const Grammar>> make(std::vector<GrammarRule> rules, std::vector<GrammarExpr> exprs,
                                                     int32_t root, const GrammarLimits& limits);
  ~Grammar();

  const std::vector<GrammarRule>& rules() const { return rules_; }
  const std::vector<GrammarExpr>& exprs() const { return exprs_; }
  int32_t root() const { return root_; }
  const GrammarAutomaton& automaton() const { return *automaton_; }
  // Whether rule r can reach itself through references (it is then called, never inlined).
  bool is_recursive(int32_t r) const { return recursive_[r]; }

 private:
  Grammar() = default;
  std::vector<GrammarRule> rules_;
  std::vector<GrammarExpr> exprs_;
  int32_t root_ = -1;
  std::vector<uint8_t> recursive_;
  std::unique_ptr<GrammarAutomaton> automaton_;
};

}  // namespace afd::serve
