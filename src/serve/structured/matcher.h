// GrammarMatcher: where one sequence stands in its grammar, and which tokens may come next.
// A copyable value: a copy is a snapshot (to check a speculative draft, copy and accept on the copy).
// Not thread-safe itself; any number of matchers share one CompiledGrammar across threads.
//
// Bounds (stack_set.h: pathological ambiguity or nesting): the mask and accept_* decide a token per
// stack of the set, so they agree. A stack that alone would need a stack deeper than kMaxStackDepth
// or more than kMaxStacks stacks for the token does not take it. When the stacks together pass
// kMaxStacks, each steps alone and the union is cut to the kMaxStacks smallest (some parses of a
// hugely ambiguous text are dropped; the token is still accepted).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "serve/structured/compiled_grammar.h"
#include "serve/structured/stack_set.h"

namespace afd::serve {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> g);

  int64_t mask_words() const { return g_->vocab().mask_words(); }
  // mask: [mask_words()]. Bit t of mask[t / 64] (1 << t % 64) set <=> token t may come next: its
  // bytes can all be consumed, or it is an end id and can_end(). After is_finished(), no bit is set.
  void fill_next_token_mask(uint64_t* mask) const;
  // The same decision for one token, without a full mask.
  bool is_allowed(int32_t token) const;
  // False and no change when the token is not allowed. An end id is accepted when can_end(); then
  // is_finished().
  bool accept_token(int32_t token);
  // False and no change when the bytes cannot all be consumed.
  bool accept_bytes(std::string_view bytes);
  // The bytes so far are a complete `root`.
  bool can_end() const { return !finished_ && stacks_.ended; }
  // Complete and no byte can follow (only an end id is allowed).
  bool must_end() const { return can_end() && stacks_.live.empty(); }
  // An end id was accepted.
  bool is_finished() const { return finished_; }
  const CompiledGrammar& grammar() const { return *g_; }

 private:
  // The stacks after `bytes`, or false when they cannot all be consumed.
  bool advance(std::string_view bytes, StackSet* out) const;

  std::shared_ptr<const CompiledGrammar> g_;
  StackSet stacks_;
  bool finished_ = false;
};

}  // namespace afd::serve
