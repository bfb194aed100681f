// libFuzzer target for PromMerger (serve/metrics/prom_merge.h), which merges the Prometheus text of
// workers that may send anything. The input is split at its first 0xff byte (or in half)
// into two sources added with different labels. Nothing may crash or hang, and the merged
// exposition must parse again with nothing dropped (the invariant the front end's /metrics
// relies on to stay valid whatever a worker sends).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/metrics/prom_merge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t cut = all.find('\xff');
  if (cut == std::string_view::npos) cut = size / 2;
  const std::string_view first = all.substr(0, cut), second = all.substr(cut == size ? cut : cut + 1);
  afd::serve::PromMerger m;
  m.add(first, "attention=\"0\"");
  m.add(second, "");
  m.add(first, "w=\"1\"");
  const std::string out = m.render();
  afd::serve::PromMerger again;
  if (size_t dropped = again.add(out, "x=\"y\""); dropped != 0) {
    std::fprintf(stderr, "merged output dropped %zu lines on re-parse:\n%s\n", dropped, out.c_str());
    std::abort();
  }
  return 0;
}
