#include "trace_output.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/log.h"

namespace afd::cli {

std::string trace_part_path(const std::string& path, const std::string& role, int index) {
  const std::string ext = ".json";
  const bool json = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  const std::string base = json ? path.substr(0, path.size() - ext.size()) : path;
  return base + "." + role + std::to_string(index) + ext;
}

Status write_trace(const char* cmd, const TraceRecorder& t, const std::string& path) {
  AFD_RETURN_IF_ERROR(t.write(path));
  const size_t dropped = t.dropped();
  std::fprintf(stderr, "afd %s: wrote %zu trace spans to %s%s\n", cmd, t.size(), path.c_str(),
               dropped == 0 ? "" : (" (" + std::to_string(dropped) + " more dropped past --trace-max-spans)").c_str());
  return Status::ok();
}

Status merge_trace_parts(const char* cmd, const std::string& path, const std::vector<std::string>& parts,
                         bool include_path) {
  if (parts.empty()) return Status::ok();
  std::vector<std::string> all;
  std::error_code ec;
  if (include_path && std::filesystem::exists(path, ec)) all.push_back(path);
  all.insert(all.end(), parts.begin(), parts.end());
  std::vector<SkippedTracePart> skipped;
  AFD_RETURN_IF_ERROR(merge_trace_files(all, path, &skipped));
  for (const SkippedTracePart& s : skipped) spdlog::warn("afd {}: trace part left out: {}: {}", cmd, s.path, s.why);
  size_t merged = 0;
  for (const std::string& p : parts) {
    if (std::any_of(skipped.begin(), skipped.end(), [&](const SkippedTracePart& s) { return s.path == p; })) continue;
    std::filesystem::remove(p, ec);
    ++merged;
  }
  std::fprintf(stderr, "afd %s: merged the traces of %zu worker process%s into %s\n", cmd, merged,
               merged == 1 ? "" : "es", path.c_str());
  return Status::ok();
}

}  // namespace afd::cli
