// Grammar-constrained decoding cost: the per-token mask of a GBNF grammar over a real tokenizer's
// vocabulary (serve/structured/), and the time to compile the grammar.
//
// Walks N random valid paths through the grammar: at each step the mask is computed (timed), a
// random allowed token is taken (biased towards tokens that close strings and objects, so paths
// finish), until the grammar can end (then the end id is taken with probability 1/2, always once
// must_end) or --max-steps. The same paths run twice: first on a freshly compiled grammar (each
// state's token entry is built the first time a path reaches it), then again on the warm grammar
// (what every later request with the same schema gets from the cache). Compile times: parse +
// automaton cold, then a GrammarCache hit.
//
// Usage: bench_grammar TOKENIZER_JSON GBNF_FILE [GBNF_FILE...] [--paths 100] [--max-steps 400]
//                      [--seed 1]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/timer.h"
#include "serve/structured/compiled_grammar.h"
#include "serve/structured/gbnf.h"
#include "serve/structured/grammar_cache.h"
#include "serve/structured/matcher.h"
#include "serve/structured/token_vocab.h"
#include "serve/text/tokenizer.h"

using namespace afd;
using namespace afd::serve;

namespace {

struct Args {
  std::string tokenizer;
  std::vector<std::string> grammars;
  int paths = 100, max_steps = 400;
  uint32_t seed = 1;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void print_row(const char* what, const std::vector<double>& us) {
  std::printf("  %-34s n=%-7zu median %8.1f us  p90 %8.1f us  p99 %8.1f us  max %9.1f us\n", what, us.size(),
              percentile(us, 0.5), percentile(us, 0.9), percentile(us, 0.99), percentile(us, 1.0));
}

// One token path per seed: mask times (us) and accept times (us) appended.
struct PathStats {
  std::vector<double> mask_us, accept_us;
  int64_t n_tokens = 0, n_finished = 0, n_bytes = 0;
};

void walk(const std::shared_ptr<const CompiledGrammar>& g, int32_t end_id, uint32_t seed, int max_steps,
          PathStats* stats) {
  const TokenVocab& v = g->vocab();
  std::mt19937 rng(seed);
  GrammarMatcher m(g);
  std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
  std::vector<int32_t> allowed, closing;
  for (int step = 0; step < max_steps; ++step) {
    const int64_t t0 = now_ns();
    m.fill_next_token_mask(mask.data());
    stats->mask_us.push_back(static_cast<double>(now_ns() - t0) * 1e-3);
    allowed.clear();
    closing.clear();
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint64_t x = mask[w]; x; x &= x - 1) {
        const int32_t t = static_cast<int32_t>(w * 64 + __builtin_ctzll(x));
        if (v.is_end(t)) continue;
        allowed.push_back(t);
        std::string_view b = v.bytes(t);
        if (b.find_first_of("\"}]") != std::string_view::npos) closing.push_back(t);
      }
    if (m.can_end() && (allowed.empty() || rng() % 2 == 0)) {
      if (!m.accept_token(end_id)) std::fprintf(stderr, "end id refused after can_end\n");
      ++stats->n_finished;
      return;
    }
    if (allowed.empty()) {
      std::fprintf(stderr, "dead end: no token allowed and the grammar cannot end\n");
      return;
    }
    // Towards the end of a path, prefer tokens that close something.
    const bool close = !closing.empty() && static_cast<int>(rng() % static_cast<uint32_t>(max_steps)) < 4 * step;
    const std::vector<int32_t>& from = close ? closing : allowed;
    const int32_t t = from[rng() % from.size()];
    const int64_t t1 = now_ns();
    if (!m.accept_token(t)) std::fprintf(stderr, "token %d was in the mask but refused\n", t);
    stats->accept_us.push_back(static_cast<double>(now_ns() - t1) * 1e-3);
    ++stats->n_tokens;
    stats->n_bytes += static_cast<int64_t>(v.bytes(t).size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--paths" && i + 1 < argc) {
      args.paths = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--max-steps" && i + 1 < argc) {
      args.max_steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seed" && i + 1 < argc) {
      args.seed = static_cast<uint32_t>(std::atoi(argv[++i]));
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: bench_grammar TOKENIZER_JSON GBNF_FILE [GBNF_FILE...] [--paths N] "
                           "[--max-steps N] [--seed N]\n");
      return 2;
    } else if (args.tokenizer.empty()) {
      args.tokenizer = a;
    } else {
      args.grammars.push_back(a);
    }
  }
  if (args.tokenizer.empty() || args.grammars.empty()) {
    std::fprintf(stderr, "usage: bench_grammar TOKENIZER_JSON GBNF_FILE [GBNF_FILE...] [--paths N]\n");
    return 2;
  }
  auto tok = Tokenizer::load(args.tokenizer);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::vector<int32_t> end_ids;
  for (const char* name : {"<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"})
    if (int32_t id = (*tok)->token_id(name); id >= 0) end_ids.push_back(id);
  if (end_ids.empty()) {
    std::fprintf(stderr, "no end token found in %s\n", args.tokenizer.c_str());
    return 1;
  }
  int64_t t0 = now_ns();
  auto vocab = TokenVocab::build(**tok, end_ids);
  const double vocab_ms = static_cast<double>(now_ns() - t0) * 1e-6;
  std::printf("tokenizer %s: %lld ids, %d trie nodes, TokenVocab::build %.1f ms\n", args.tokenizer.c_str(),
              static_cast<long long>(vocab->vocab_size()), vocab->n_nodes(), vocab_ms);

  for (const std::string& path : args.grammars) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    // Compile: cold, through the cache (miss then hit).
    std::vector<double> cold_ms;
    for (int rep = 0; rep < 5; ++rep) {
      t0 = now_ns();
      auto g = parse_gbnf(text);
      if (!g.ok()) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), g.status().to_string().c_str());
        return 1;
      }
      auto c = CompiledGrammar::compile(*g, vocab);
      cold_ms.push_back(static_cast<double>(now_ns() - t0) * 1e-6);
    }
    GrammarCache cache(vocab);
    t0 = now_ns();
    auto compiled = cache.get(text);
    const double miss_ms = static_cast<double>(now_ns() - t0) * 1e-6;
    t0 = now_ns();
    auto again = cache.get(text);
    const double hit_us = static_cast<double>(now_ns() - t0) * 1e-3;
    if (!compiled.ok() || !again.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), compiled.status().to_string().c_str());
      return 1;
    }
    const auto& a = (*compiled)->automaton();
    std::printf("\n%s: %zu bytes, %d automaton states, %d byte classes\n", path.c_str(), text.size(), a.n_states,
                a.n_classes);
    std::printf("  compile (parse + automaton)        median of 5 %.2f ms (min %.2f)\n", percentile(cold_ms, 0.5),
                percentile(cold_ms, 0.0));
    std::printf("  GrammarCache::get                  miss %.2f ms, hit %.1f us\n", miss_ms, hit_us);

    for (int pass = 0; pass < 2; ++pass) {
      PathStats st;
      const int64_t w0 = now_ns();
      for (int p = 0; p < args.paths; ++p)
        walk(*compiled, end_ids[0], args.seed + static_cast<uint32_t>(p), args.max_steps, &st);
      const double wall_s = static_cast<double>(now_ns() - w0) * 1e-9;
      std::printf("  %s: %d paths, %lld tokens (%.1f bytes/token), %lld finished, %.2f s\n",
                  pass == 0 ? "pass 1 (fresh grammar: entries built on first use)" : "pass 2 (warm grammar, same paths)",
                  args.paths, static_cast<long long>(st.n_tokens),
                  st.n_tokens ? static_cast<double>(st.n_bytes) / static_cast<double>(st.n_tokens) : 0.0,
                  static_cast<long long>(st.n_finished), wall_s);
      print_row("fill_next_token_mask", st.mask_us);
      print_row("accept_token", st.accept_us);
    }
    std::printf(
        "  token entries cached %lld, holding %.1f MiB (grammar total %.1f MiB); shared %lld; built uncached %lld\n",
        static_cast<long long>((*compiled)->n_cached_entries()),
        static_cast<double>((*compiled)->cached_bytes()) / (1024.0 * 1024.0),
        static_cast<double>((*compiled)->memory_bytes()) / (1024.0 * 1024.0),
        static_cast<long long>((*compiled)->n_shared_entries()),
        static_cast<long long>((*compiled)->n_uncached_builds()));
  }
  return 0;
}
