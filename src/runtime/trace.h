// TraceRecorder: spans of the micro-batch pipeline, written as Chrome trace-event JSON
// ("X" complete events; open the file in Perfetto or chrome://tracing).
//
// Two ways to get the file:
// - in memory: spans are kept until write(path);
// - streamed (stream_to(path), what the commands use): a background thread appends the
//   spans recorded so far to the file every flush interval, and finish() closes it. A
//   process that is killed (SIGKILL, a crash) leaves a file with every span up to its last
//   flush and no closing line: merge_trace_files reads such a part, and says it was cut.
// Size is bounded either way: past max_spans, further spans are dropped and counted (a
// long-running `afd serve --trace` keeps its first max_spans spans); the file says how many.
// Threading: span() and name_process() may be called from any thread; the rest from one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace afd {

class TraceRecorder {
 public:
  // Process lanes: attention engine i is pid 1 + i, FFN worker j is pid 100 + j.
  static constexpr int kAttentionPid = 1;
  static constexpr int kFfnPid = 100;
  static constexpr size_t kDefaultMaxSpans = size_t{1} << 20;  // ~100 MB of spans
  static constexpr int64_t kDefaultFlushMs = 200;

  explicit TraceRecorder(size_t max_spans = kDefaultMaxSpans) : max_spans_(max_spans) {}
  ~TraceRecorder();  // finish()es a stream (its error, if any, is lost: call finish() first)
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  void span(std::string name, int pid, int tid, int64_t t0_ns, int64_t t1_ns, int64_t layer = -1,
            int64_t microbatch = -1, int64_t tokens = -1);
  void name_process(int pid, std::string name);
  size_t size() const;     // spans kept (in memory, or streamed)
  size_t dropped() const;  // spans dropped past max_spans

  // Starts streaming to `path` (created or truncated now, so a path that cannot be written is
  // an error here rather than at the end of a run), flushed every flush_ms. Times in the file
  // count from now (its origin_ns). Only before the first span and only once (an internal
  // error otherwise).
  Status stream_to(const std::string& path, int64_t flush_ms = kDefaultFlushMs);
  bool streaming() const { return file_ != nullptr; }
  const std::string& stream_path() const { return stream_path_; }
  // Ends a stream: writes the spans not yet written, the closing line, and the final dropped
  // count (into the first line, which has room for it); the file is then complete JSON.
  // Spans recorded later are dropped. Does nothing when not streaming (or already finished).
  Status finish();

  // In memory only (an internal error for a streamed recorder): writes {"otherData": {"origin_ns":
  // O, "dropped_spans": D}, "displayTimeUnit": "ms", "traceEvents": [...]} with times in
  // microseconds from the first span, whose now_ns() reading is O; one event per line
  // (merge_trace_files reads it back line by line).
  Status write(const std::string& path) const;

 private:
  struct Span {
    std::string name;
    int pid, tid;
    int64_t t0, t1, layer, mb, tokens;
  };
  static std::string span_event(const Span& s, int64_t origin);  // one JSON line, ts from origin
  void flush_loop(int64_t flush_ms);
  // Appends these to the stream and flushes it: the flusher thread, then (after joining it)
  // finish(), so one writer at a time.
  void write_events(const std::vector<std::pair<int, std::string>>& names, const std::vector<Span>& spans);

  mutable std::mutex mu_;  // guards the fields below it
  std::vector<Span> spans_;  // in memory: all kept spans; streaming: those not yet written
  std::vector<std::pair<int, std::string>> names_;  // likewise for process names
  size_t kept_ = 0;
  size_t dropped_ = 0;
  size_t max_spans_;
  bool closed_ = false;  // a finished stream: later spans are dropped, the flusher ends

  // Streaming: set by stream_to, then used by the flusher thread and, after it has
  // ended, by finish().
  std::FILE* file_ = nullptr;
  std::string stream_path_;
  int64_t origin_ = 0;
  long dropped_at_ = 0;  // file offset of the dropped count in the first line
  bool wrote_event_ = false;
  bool write_failed_ = false;
  std::thread flusher_;
  std::condition_variable flush_cv_;  // with mu_: wakes the flusher when closed_
};

// Merges trace files written by TraceRecorder (write() or a stream) — e.g. one per worker
// process of a local bundle, whose now_ns() clocks agree (CLOCK_MONOTONIC of one host; not
// across hosts) — into one file at `out`, each part's events shifted by its origin_ns.
// A part that is missing or not such a file is left out; a stream whose process stopped
// before finishing it (no closing line) is merged with every complete event line it has.
// Both are listed, with why, in *notes (merged says which), as is a part listed twice
// (merged once). Errors, writing nothing: no part could be read; `out` cannot be written
// (it is written to a file beside it and renamed over it, so it keeps what it held). `out`
// may be one of the parts.
struct TracePartNote {
  std::string path, why;
  bool merged = false;  // true: cut short but its events were merged; false: left out
};
Status merge_trace_files(const std::vector<std::string>& parts, const std::string& out,
                         std::vector<TracePartNote>* notes);

}  // namespace afd
