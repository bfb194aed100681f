// TraceRecorder: spans of the micro-batch pipeline, written as Chrome trace-event JSON
// ("X" complete events; open the file in Perfetto or chrome://tracing).
// Memory is bounded: past max_spans, further spans are dropped and counted (a long-running
// `afd serve --trace` keeps its first max_spans spans); the file says how many.
// Threading: span() may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace afd {

class TraceRecorder {
 public:
  // Process lanes: attention engine i is pid 1 + i, FFN worker j is pid 100 + j.
  static constexpr int kAttentionPid = 1;
  static constexpr int kFfnPid = 100;
  static constexpr size_t kDefaultMaxSpans = size_t{1} << 20;  // ~100 MB of spans

  explicit TraceRecorder(size_t max_spans = kDefaultMaxSpans) : max_spans_(max_spans) {}

  void span(std::string name, int pid, int tid, int64_t t0_ns, int64_t t1_ns, int64_t layer = -1,
            int64_t microbatch = -1, int64_t tokens = -1);
  void name_process(int pid, std::string name);
  size_t size() const;
  size_t dropped() const;
  // Writes {"otherData": {"origin_ns": O, "dropped_spans": D}, "displayTimeUnit": "ms",
  // "traceEvents": [...]} with times in microseconds from the first span, whose now_ns()
  // reading is O; one event per line (merge_trace_files reads it back line by line).
  Status write(const std::string& path) const;

 private:
  struct Span {
    std::string name;
    int pid, tid;
    int64_t t0, t1, layer, mb, tokens;
  };
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<std::pair<int, std::string>> names_;
  size_t max_spans_;
  size_t dropped_ = 0;
};

// Merges trace files written by TraceRecorder::write — e.g. one per worker process of a
// local bundle, whose now_ns() clocks agree (CLOCK_MONOTONIC of one host; not across hosts)
// — into one file at `out`, each part's events shifted by its origin_ns. A part that is
// missing or not such a file is left out and listed, with why, in *skipped; error only if
// `out` cannot be written. `out` may be one of the parts.
struct SkippedTracePart {
  std::string path, why;
};
Status merge_trace_files(const std::vector<std::string>& parts, const std::string& out,
                         std::vector<SkippedTracePart>* skipped);

}  // namespace afd
