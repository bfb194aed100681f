// TraceRecorder: spans of the micro-batch pipeline, written as Chrome trace-event JSON
// ("X" complete events; open the file in Perfetto or chrome://tracing).
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

  void span(std::string name, int pid, int tid, int64_t t0_ns, int64_t t1_ns, int64_t layer = -1,
            int64_t microbatch = -1, int64_t tokens = -1);
  void name_process(int pid, std::string name);
  size_t size() const;
  // Writes {"traceEvents": [...]} with times in microseconds from the first span.
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
};

}  // namespace afd
