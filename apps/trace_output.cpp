#include "trace_output.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "child_processes.h"
#include "core/log.h"

namespace afd::cli {

namespace {

// The files a part names: itself, or with the life token, every existing life's file in
// life order (0, 1, ...); empty if there is none.
std::vector<std::string> part_files(const std::string& part) {
  const std::string token = ChildProcesses::kLifeToken;
  const size_t at = part.find(token);
  if (at == std::string::npos) return {part};
  const std::filesystem::path prefix(part.substr(0, at));
  const std::string suffix = part.substr(at + token.size());
  const std::filesystem::path dir = prefix.has_parent_path() ? prefix.parent_path() : std::filesystem::path(".");
  const std::string head = prefix.filename().string();
  std::vector<std::pair<long, std::string>> lives;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= head.size() + suffix.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string life = name.substr(head.size(), name.size() - head.size() - suffix.size());
    if (life.size() > 9 || !std::all_of(life.begin(), life.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    lives.emplace_back(std::stol(life), (dir / name).string());
  }
  std::sort(lives.begin(), lives.end());
  std::vector<std::string> out;
  for (auto& l : lives) out.push_back(std::move(l.second));
  return out;
}

}  // namespace

std::string trace_part_path(const std::string& path, const std::string& role, int index) {
  const std::string ext = ".json";
  const bool json = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  const std::string base = json ? path.substr(0, path.size() - ext.size()) : path;
  const std::string part = base + "." + role + std::to_string(index) + ".life" + ChildProcesses::kLifeToken + ext;
  std::error_code ec;
  for (const std::string& stale : part_files(part)) {
    if (std::filesystem::remove(stale, ec)) spdlog::info("removed a trace part an earlier run left: {}", stale);
  }
  return part;
}

Status write_trace(const char* cmd, TraceRecorder& t, const std::string& path) {
  AFD_RETURN_IF_ERROR(t.stream_path().empty() ? t.write(path) : t.finish());
  const size_t dropped = t.dropped();
  std::fprintf(stderr, "afd %s: wrote %zu trace spans to %s%s\n", cmd, t.size(), path.c_str(),
               dropped == 0 ? "" : (" (" + std::to_string(dropped) + " more dropped past --trace-max-spans)").c_str());
  return Status();
}

Status merge_trace_parts(const char* cmd, const std::string& path, const std::vector<std::string>& parts,
                         bool include_path) {
  if (parts.empty()) return Status();
  std::vector<std::string> files;
  for (const std::string& p : parts) {
    std::vector<std::string> f = part_files(p);
    if (f.empty()) spdlog::warn("afd {}: no trace from {} (its process ended before it opened one)", cmd, p);
    files.insert(files.end(), f.begin(), f.end());
  }
  if (files.empty()) return Status();
  std::vector<std::string> all;
  std::error_code ec;
  if (include_path && std::filesystem::exists(path, ec)) all.push_back(path);
  all.insert(all.end(), files.begin(), files.end());
  std::vector<TracePartNote> notes;
  AFD_RETURN_IF_ERROR(merge_trace_files(all, path, &notes));
  for (const TracePartNote& n : notes)
    spdlog::warn("afd {}: trace part {}: {}: {}", cmd, n.merged ? "merged" : "left out", n.path, n.why);
  size_t merged = 0;
  for (const std::string& p : files) {
    if (std::any_of(notes.begin(), notes.end(), [&](const TracePartNote& n) { return n.path == p && !n.merged; }))
      continue;
    std::filesystem::remove(p, ec);
    ++merged;
  }
  std::fprintf(stderr, "afd %s: merged %zu worker process trace%s into %s\n", cmd, merged,
               merged == 1 ? "" : "s", path.c_str());
  return Status();
}

}  // namespace afd::cli
