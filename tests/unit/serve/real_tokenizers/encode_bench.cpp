// afd_tokenizer_bench: encode throughput of one tokenizer.json.
// Usage: afd_tokenizer_bench TOKENIZER_JSON REPEAT REPS FILE...
// The text is the files' contents (a JSON array of strings, like corpus.json, gives its
// strings joined by "\n") concatenated, REPEAT times. Prints the first (cold) and the
// best of REPS encodes of one tokenizer. Under valgrind --tool=callgrind
// --instr-atstart=no only the first encode is measured. Uses only the API shared with
// older afd versions (Tokenizer::load, encode(text)), so the same file benchmarks both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serve/text/tokenizer.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON REPEAT REPS FILE...\n", argv[0]);
    return 2;
  }
  auto tok = afd::serve::Tokenizer::load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  const int repeat = std::atoi(argv[2]), reps = std::max(1, std::atoi(argv[3]));
  std::string one;
  for (int a = 4; a < argc; ++a) {
    std::ifstream f(argv[a], std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "cannot open %s\n", argv[a]);
      return 1;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_array()) {
      for (const auto& t : j)
        if (t.is_string()) one += t.get<std::string>() + "\n";
    } else {
      one += ss.str();
    }
  }
  std::string text;
  for (int r = 0; r < repeat; ++r) text += one;
  double first = 0, best = 1e30;
  size_t n = 0;
  for (int r = 0; r < reps; ++r) {
    if (r == 0) CALLGRIND_START_INSTRUMENTATION;
    auto t0 = std::chrono::steady_clock::now();
    n = (*tok)->encode(text).size();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) CALLGRIND_STOP_INSTRUMENTATION;
    if (r == 0) first = s;
    best = std::min(best, s);
  }
  std::printf("%zu bytes -> %zu tokens; first encode %.4f s (%.1f MB/s), best of %d %.4f s (%.1f MB/s)\n", text.size(),
              n, first, text.size() / first / 1e6, reps, best, text.size() / best / 1e6);
  return n > 0 ? 0 : 1;
}
