// --trace FILE for the commands: writing this process's pipeline trace, and merging the
// traces of worker processes it started (each writes its own part when it stops) into FILE,
// so a local multi-process bundle gives one timeline (runtime/trace.h: merge_trace_files).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/trace.h"

namespace afd::cli {

// The file worker `role` `index` of a bundle traced to `path` writes its part to, per life of
// its process (ChildProcesses::kLifeToken, replaced when it is started or restarted):
// "t.json" -> "t.<role><index>.life{life}.json". A restarted worker's lives are all merged.
// Also removes parts an earlier run left there (a crashed launcher does not merge them), so
// the merge collects this run's lives only.
std::string trace_part_path(const std::string& path, const std::string& role, int index);

// Completes `t`'s file at path — finishes its stream (TraceRecorder::stream_to), or writes it if it
// was kept in memory — and logs (stderr) how many spans, and how many were dropped past
// --trace-max-spans.
Status write_trace(const char* cmd, TraceRecorder& t, const std::string& path);

// Merges the parts (and path itself first, if include_path and it exists) into path, then
// removes the parts that were merged. A part with the life token stands for every life's
// file that exists (a life killed before it opened its stream has none); one with no file at
// all, and parts that are unreadable, are logged and left where they are. A life killed
// mid-run left a part cut short: it is merged (up to its last flush) and logged.
Status merge_trace_parts(const char* cmd, const std::string& path, const std::vector<std::string>& parts,
                         bool include_path);

}  // namespace afd::cli
