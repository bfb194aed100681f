// afd trace merge: merges trace files written by --trace into one timeline, and completes a
// part whose process was killed before it finished it (runtime/trace.h: merge_trace_files).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "engine_flags.h"
#include "runtime/trace.h"

namespace afd::cli {

void register_trace(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "Work with --trace files");
  trace->require_subcommand(1);
  auto* merge = trace->add_subcommand(
      "merge",
      "Merge --trace files of processes of one host into one timeline (Perfetto); a file cut short by a killed "
      "process is completed with every event it holds");
  auto out = std::make_shared<std::string>();
  auto parts = std::make_shared<std::vector<std::string>>();
  merge->add_option("--out,-o", *out, "the merged file (may be one of the parts)")->required();
  merge->add_option("parts", *parts, "trace files written by --trace")->required();
  merge->callback([out, parts] {
    std::vector<TracePartNote> notes;
    const Status s = merge_trace_files(*parts, *out, &notes);
    size_t left_out = 0;
    for (const TracePartNote& n : notes) {
      std::fprintf(stderr, "afd trace merge: %s %s: %s\n", n.merged ? "merged" : "left out", n.path.c_str(),
                   n.why.c_str());
      left_out += n.merged ? 0 : 1;
    }
    if (!s.is_ok()) fail("trace merge", s);
    std::fprintf(stderr, "afd trace merge: merged %zu of %zu file(s) into %s\n", parts->size() - left_out,
                 parts->size(), out->c_str());
  });
}

}  // namespace afd::cli
