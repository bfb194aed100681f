// The tokens one stack accepts, from the TokenEntry of each of its frames (token_entry.h).
//
// For a stack f[0..j] (bottom first), a token is accepted when the top's entry accepts it; or,
// below a top that can end before any byte, when f[0..j-1] accepts it; or, for a split of it at
// `at`, when f[0..j-1] accepts its rest: when the rest is a vocabulary token, that token's answer
// on f[0..j-1] (the same question one frame down, memoised per call); otherwise the rest is
// stepped through f[j-1] (simulating the stack only where that frame calls). Tokens in the entry's
// check_on_stack are simulated on f[0..j]. Frames are looked at only as deep as some token reaches.
// Where an entry's local simulation and the frames below it could together pass kMaxStackDepth, the
// stack is simulated whole instead (a trie walk), so the answer always equals stepping the stack
// byte by byte.
#pragma once

#include <cstdint>

#include "serve/structured/compiled_grammar.h"
#include "serve/structured/stack_set.h"

namespace afd::serve {

// Sets bit t of mask (CompiledGrammar::vocab().mask_words() words) for every text token t whose
// bytes `stack` consumes; end ids are not touched.
void or_stack_mask(const CompiledGrammar& g, const GrammarStack& stack, uint64_t* mask);

}  // namespace afd::serve
