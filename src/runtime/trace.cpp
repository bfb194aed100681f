#include "runtime/trace.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "core/timer.h"

namespace afd {
namespace {

// The first line of a trace: its numbers are the part's origin and drop count. The count
// is padded to a fixed width (JSON allows the spaces) so that a stream can write the final
// one in place when it finishes.
constexpr const char* kHeadFormat = "{\"otherData\":{\"origin_ns\":%" PRId64 ",\"dropped_spans\":%20" PRIu64
                                    "},\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
constexpr const char* kHeadScan = "{\"otherData\":{\"origin_ns\":%" SCNd64 ",\"dropped_spans\":%" SCNu64;
constexpr const char* kHeadEnd = "\"traceEvents\":[";
constexpr const char* kTail = "]}\n";

std::string head_line(int64_t origin, uint64_t dropped) {
  char buf[200];
  std::snprintf(buf, sizeof buf, kHeadFormat, origin, dropped);
  return buf;
}

// Writes the head, the event lines (comma-separated), and the tail: into a file beside
// `path`, renamed over it once complete, so a failed write leaves what `path` held.
Status write_file(const std::string& path, int64_t origin, uint64_t dropped, const std::vector<std::string>& events) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << head_line(origin, dropped);
    for (size_t i = 0; i < events.size(); ++i) out << events[i] << (i + 1 < events.size() ? ",\n" : "\n");
    out << kTail;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return io_error("cannot write trace to " + path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return io_error("cannot write trace to " + path + ": " + std::strerror(e));
  }
  return Status();
}

std::string name_event(int pid, const std::string& name) {
  return nlohmann::json{{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}}.dump();
}

}  // namespace

std::string TraceRecorder::span_event(const Span& s, int64_t origin) {
  nlohmann::json args = nlohmann::json::object();
  if (s.layer >= 0) args["layer"] = s.layer;
  if (s.mb >= 0) args["microbatch"] = s.mb;
  if (s.tokens >= 0) args["tokens"] = s.tokens;
  return nlohmann::json{{"name", s.name},
                        {"ph", "X"},
                        {"pid", s.pid},
                        {"tid", s.tid},
                        {"ts", static_cast<double>(s.t0 - origin) / 1000.0},
                        {"dur", static_cast<double>(s.t1 - s.t0) / 1000.0},
                        {"args", args}}
      .dump();
}

TraceRecorder::~TraceRecorder() { (void)finish(); }

void TraceRecorder::span(std::string name, int pid, int tid, int64_t t0_ns, int64_t t1_ns, int64_t layer,
                         int64_t microbatch, int64_t tokens) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return;
  if (kept_ >= max_spans_) {
    ++dropped_;
    return;
  }
  ++kept_;
  spans_.push_back(Span{std::move(name), pid, tid, t0_ns, t1_ns, layer, microbatch, tokens});
}

void TraceRecorder::name_process(int pid, std::string name) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!closed_) names_.emplace_back(pid, std::move(name));
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return kept_;
}

size_t TraceRecorder::dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_;
}

Status TraceRecorder::stream_to(const std::string& path, int64_t flush_ms) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stream_path_.empty()) return internal_error("trace: already streamed to " + stream_path_);
    if (kept_ + dropped_ > 0) return internal_error("trace: stream_to after spans were recorded");
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return io_error("cannot write trace to " + path + ": " + std::strerror(errno));
  origin_ = now_ns();
  const std::string head = head_line(origin_, 0);
  if (std::fputs(head.c_str(), f) < 0 || std::fflush(f) != 0) {
    std::fclose(f);
    return io_error("cannot write trace to " + path + ": " + std::strerror(errno));
  }
  dropped_at_ = static_cast<long>(head.find("\"dropped_spans\":") + std::strlen("\"dropped_spans\":"));
  stream_path_ = path;
  file_ = f;
  flusher_ = std::thread([this, flush_ms] { flush_loop(std::max<int64_t>(flush_ms, 1)); });
  return Status();
}

void TraceRecorder::write_events(const std::vector<std::pair<int, std::string>>& names,
                                 const std::vector<Span>& spans) {
  auto put = [&](const std::string& ev) {
    if (std::fputs(wrote_event_ ? ",\n" : "", file_) < 0 || std::fputs(ev.c_str(), file_) < 0) write_failed_ = true;
    wrote_event_ = true;
  };
  for (const auto& [pid, name] : names) put(name_event(pid, name));
  for (const Span& s : spans) put(span_event(s, origin_));
  if (std::fflush(file_) != 0) write_failed_ = true;
}

void TraceRecorder::flush_loop(int64_t flush_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!closed_) {
    flush_cv_.wait_for(lk, std::chrono::milliseconds(flush_ms));
    if (closed_) break;  // finish() writes the rest
    if (spans_.empty() && names_.empty()) continue;
    std::vector<Span> spans;
    std::vector<std::pair<int, std::string>> names;
    spans.swap(spans_);
    names.swap(names_);
    lk.unlock();
    write_events(names, spans);
    lk.lock();
  }
}

Status TraceRecorder::finish() {
  if (file_ == nullptr) return Status();
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  flush_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  std::vector<Span> spans;
  std::vector<std::pair<int, std::string>> names;
  uint64_t dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    spans.swap(spans_);
    names.swap(names_);
    dropped = dropped_;
  }
  write_events(names, spans);
  if (std::fputs(wrote_event_ ? "\n" : "", file_) < 0 || std::fputs(kTail, file_) < 0) write_failed_ = true;
  char count[32];
  std::snprintf(count, sizeof count, "%20" PRIu64, dropped);
  if (std::fseek(file_, dropped_at_, SEEK_SET) != 0 || std::fputs(count, file_) < 0) write_failed_ = true;
  if (std::fclose(file_) != 0) write_failed_ = true;
  file_ = nullptr;
  if (write_failed_) return io_error("cannot write trace to " + stream_path_ + ": " + std::strerror(errno));
  return Status();
}

Status TraceRecorder::write(const std::string& path) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (!stream_path_.empty()) return internal_error("trace: streamed to " + stream_path_ + ", not kept in memory");
  int64_t origin = spans_.empty() ? 0 : std::numeric_limits<int64_t>::max();
  for (const Span& s : spans_) origin = std::min(origin, s.t0);
  std::vector<std::string> ev;
  ev.reserve(names_.size() + spans_.size());
  for (const auto& [pid, name] : names_) ev.push_back(name_event(pid, name));
  for (const Span& s : spans_) ev.push_back(span_event(s, origin));
  return write_file(path, origin, dropped_, ev);
}

Status merge_trace_files(const std::vector<std::string>& parts, const std::string& out,
                         std::vector<TracePartNote>* notes) {
  struct Part {
    int64_t origin = 0;
    uint64_t dropped = 0;
    bool timed = false;  // has events with a time (a part without spans has origin 0)
    std::vector<nlohmann::json> events;
  };
  std::vector<Part> read;
  std::vector<std::string> seen;  // canonical paths of the parts read so far
  std::string why_none;           // the first part's reason, for the error if none is read
  for (const std::string& path : parts) {
    std::ifstream in(path);
    std::string line;
    Part p;
    auto note = [&](const std::string& why, bool merged) {
      if (notes) notes->push_back({path, why, merged});
      if (!merged && why_none.empty()) why_none = path + ": " + why;
    };
    std::error_code ec;
    const std::string canon = std::filesystem::weakly_canonical(path, ec).string();
    if (!ec && std::find(seen.begin(), seen.end(), canon) != seen.end()) {
      note("listed twice (merged once)", false);
      continue;
    }
    if (!ec) seen.push_back(canon);
    if (!in || !std::getline(in, line)) {
      note("cannot read it", false);
      continue;
    }
    if (std::sscanf(line.c_str(), kHeadScan, &p.origin, &p.dropped) != 2 || line.size() < std::strlen(kHeadEnd) ||
        line.compare(line.size() - std::strlen(kHeadEnd), std::string::npos, kHeadEnd) != 0) {
      note("not a trace written by afd (first line)", false);
      continue;
    }
    std::vector<std::string> lines;
    while (std::getline(in, line)) lines.push_back(std::move(line));
    const bool ended = !lines.empty() && lines.back() + "\n" == kTail;
    if (ended) lines.pop_back();
    bool bad = false, cut_line = false;
    for (size_t k = 0; k < lines.size(); ++k) {
      std::string& l = lines[k];
      if (!l.empty() && l.back() == ',') l.pop_back();
      nlohmann::json e = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
      if (!e.is_object()) {
        // The last line of a stream cut short may be cut itself.
        (!ended && k + 1 == lines.size() ? cut_line : bad) = true;
        break;
      }
      p.timed = p.timed || e.contains("ts");
      p.events.push_back(std::move(e));
    }
    if (bad) {
      note("an event line is not JSON", false);
      continue;
    }
    if (!ended) {
      note("cut short (no closing line: its process stopped without finishing it); merged its " +
               std::to_string(p.events.size()) + " complete events" + (cut_line ? ", not the cut last line" : ""),
           true);
    }
    read.push_back(std::move(p));
  }
  if (read.empty()) {
    return invalid_argument(parts.empty() ? std::string("no trace files to merge")
                                          : "none of the files is a trace written by afd --trace (" + why_none +
                                                "); " + out + " was not written");
  }
  int64_t origin = 0;
  uint64_t dropped = 0;
  bool first = true;
  for (const Part& p : read) {
    if (!p.timed) continue;
    origin = first ? p.origin : std::min(origin, p.origin);
    first = false;
  }
  std::vector<std::string> ev;
  for (Part& p : read) {
    dropped += p.dropped;
    const double shift_us = static_cast<double>(p.origin - origin) / 1000.0;
    for (nlohmann::json& e : p.events) {
      if (e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() + shift_us;
      ev.push_back(e.dump());
    }
  }
  return write_file(out, origin, dropped, ev);
}

}  // namespace afd
