#include "runtime/trace.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

namespace afd {
namespace {

// The first line of a written trace; its numbers are the part's origin and drop count.
constexpr const char* kHeadFormat = "{\"otherData\":{\"origin_ns\":%" PRId64 ",\"dropped_spans\":%" PRIu64
                                    "},\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
constexpr const char* kTail = "]}\n";

std::string head_line(int64_t origin, uint64_t dropped) {
  char buf[200];
  std::snprintf(buf, sizeof buf, kHeadFormat, origin, dropped);
  return buf;
}

// Writes the head, the event lines (comma-separated), and the tail.
Status write_file(const std::string& path, int64_t origin, uint64_t dropped, const std::vector<std::string>& events) {
  std::ofstream out(path);
  out << head_line(origin, dropped);
  for (size_t i = 0; i < events.size(); ++i) out << events[i] << (i + 1 < events.size() ? ",\n" : "\n");
  out << kTail;
  out.flush();
  if (!out) return io_error("cannot write trace to " + path);
  return Status::ok();
}

}  // namespace

void TraceRecorder::span(std::string name, int pid, int tid, int64_t t0_ns, int64_t t1_ns, int64_t layer,
                         int64_t microbatch, int64_t tokens) {
  std::lock_guard<std::mutex> lk(mu_);
  if (spans_.size() >= max_spans_) {
    ++dropped_;
    return;
  }
  spans_.push_back(Span{std::move(name), pid, tid, t0_ns, t1_ns, layer, microbatch, tokens});
}

void TraceRecorder::name_process(int pid, std::string name) {
  std::lock_guard<std::mutex> lk(mu_);
  names_.emplace_back(pid, std::move(name));
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return spans_.size();
}

size_t TraceRecorder::dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_;
}

Status TraceRecorder::write(const std::string& path) const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t origin = spans_.empty() ? 0 : std::numeric_limits<int64_t>::max();
  for (const Span& s : spans_) origin = std::min(origin, s.t0);
  std::vector<std::string> ev;
  ev.reserve(names_.size() + spans_.size());
  for (const auto& [pid, name] : names_)
    ev.push_back(
        nlohmann::json{{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}}.dump());
  for (const Span& s : spans_) {
    nlohmann::json args = nlohmann::json::object();
    if (s.layer >= 0) args["layer"] = s.layer;
    if (s.mb >= 0) args["microbatch"] = s.mb;
    if (s.tokens >= 0) args["tokens"] = s.tokens;
    ev.push_back(nlohmann::json{{"name", s.name},
                                {"ph", "X"},
                                {"pid", s.pid},
                                {"tid", s.tid},
                                {"ts", static_cast<double>(s.t0 - origin) / 1000.0},
                                {"dur", static_cast<double>(s.t1 - s.t0) / 1000.0},
                                {"args", args}}
                     .dump());
  }
  return write_file(path, origin, dropped_, ev);
}

Status merge_trace_files(const std::vector<std::string>& parts, const std::string& out,
                         std::vector<SkippedTracePart>* skipped) {
  struct Part {
    int64_t origin = 0;
    uint64_t dropped = 0;
    bool timed = false;  // has events with a time (a part without spans has origin 0)
    std::vector<nlohmann::json> events;
  };
  std::vector<Part> read;
  for (const std::string& path : parts) {
    std::ifstream in(path);
    std::string line;
    Part p;
    auto skip = [&](const std::string& why) {
      if (skipped) skipped->push_back({path, why});
    };
    if (!in || !std::getline(in, line)) {
      skip("cannot read it");
      continue;
    }
    if (std::sscanf(line.c_str(), kHeadFormat, &p.origin, &p.dropped) != 2 ||
        line + "\n" != head_line(p.origin, p.dropped)) {
      skip("not a trace written by afd (first line)");
      continue;
    }
    bool ended = false, bad = false;
    while (std::getline(in, line)) {
      if (line + "\n" == kTail) {
        ended = true;
        break;
      }
      if (!line.empty() && line.back() == ',') line.pop_back();
      nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!e.is_object()) {
        bad = true;
        break;
      }
      p.timed = p.timed || e.contains("ts");
      p.events.push_back(std::move(e));
    }
    if (bad || !ended) {
      skip(bad ? "an event line is not JSON" : "truncated (no closing line)");
      continue;
    }
    read.push_back(std::move(p));
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
