// TraceRecorder: bounded recording, the written file, and merging several processes' files.
#include "runtime/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/timer.h"

namespace afd {
namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("afd_test_trace_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_text(path));  // throws (fails the test) if not JSON
}

// ts (µs) of every complete event, by (pid, name).
std::map<std::pair<int, std::string>, std::vector<double>> times(const nlohmann::json& j) {
  std::map<std::pair<int, std::string>, std::vector<double>> out;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") out[{e["pid"].get<int>(), e["name"].get<std::string>()}].push_back(e["ts"].get<double>());
  return out;
}

TEST(TraceRecorder, KeepsAtMostMaxSpansAndSaysHowManyWereDropped) {
  TraceRecorder t(3);
  t.name_process(1, "attention 0");
  for (int i = 0; i < 5; ++i) t.span("attention", 1, 0, 1000000 + i * 1000, 1000500 + i * 1000, i, 0, 8);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.dropped(), 2u);
  const std::string p = tmp_path("bounded.json");
  ASSERT_TRUE(t.write(p).is_ok());
  const nlohmann::json j = read_json(p);
  EXPECT_EQ(j["otherData"]["dropped_spans"], 2);
  EXPECT_EQ(j["otherData"]["origin_ns"], 1000000);
  const auto ts = times(j);
  ASSERT_EQ(ts.at({1, "attention"}).size(), 3u);
  EXPECT_DOUBLE_EQ(ts.at({1, "attention"})[0], 0.0);  // microseconds from the first span
  EXPECT_DOUBLE_EQ(ts.at({1, "attention"})[2], 2.0);
  std::filesystem::remove(p);
}

TEST(TraceRecorder, MergedProcessesShareOneClock) {
  // Two processes' recorders: the FFN worker's first span is 7 µs after the attention's.
  TraceRecorder a, f;
  a.name_process(1, "attention 0");
  a.span("attention", 1, 0, 5000000, 5002000, 0, 0, 4);
  a.span("wait FFN", 1, 0, 5002000, 5010000, 0, 0, 4);
  f.name_process(100, "ffn 0");
  f.span("ffn", 100, 1, 5007000, 5009000, 0, 0, 4);
  TraceRecorder empty;  // a worker that recorded nothing
  const std::string pa = tmp_path("a.json"), pf = tmp_path("f.json"), pe = tmp_path("e.json"),
                    bad = tmp_path("bad.json"), cut = tmp_path("cut.json"), missing = tmp_path("missing.json");
  ASSERT_TRUE(a.write(pa).is_ok());
  ASSERT_TRUE(f.write(pf).is_ok());
  ASSERT_TRUE(empty.write(pe).is_ok());
  std::ofstream(bad) << "{\"traceEvents\": []}\n";  // JSON, but not what write() makes
  {
    std::ifstream in(pf);
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    std::ofstream(cut) << first << "\n" << second << "\n";  // no closing line: a part cut short
  }
  std::vector<TracePartNote> notes;
  // The output may be one of the parts (it is read before it is written).
  ASSERT_TRUE(merge_trace_files({pa, pe, bad, pf, cut, missing}, pa, &notes).is_ok());
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_EQ(notes[0].path, bad);
  EXPECT_EQ(notes[0].why.rfind("not a trace", 0), 0u) << notes[0].why;
  EXPECT_FALSE(notes[0].merged);
  // A part cut short is merged with its complete lines (here: the process name only).
  EXPECT_EQ(notes[1].path, cut);
  EXPECT_EQ(notes[1].why.rfind("cut short", 0), 0u) << notes[1].why;
  EXPECT_NE(notes[1].why.find("merged its 1 complete events"), std::string::npos) << notes[1].why;
  EXPECT_TRUE(notes[1].merged);
  EXPECT_EQ(notes[2].path, missing);
  EXPECT_EQ(notes[2].why.rfind("cannot read", 0), 0u) << notes[2].why;
  EXPECT_FALSE(notes[2].merged);
  const nlohmann::json j = read_json(pa);
  EXPECT_EQ(j["otherData"]["origin_ns"], 5000000);
  const auto ts = times(j);
  EXPECT_DOUBLE_EQ(ts.at({1, "attention"})[0], 0.0);
  EXPECT_DOUBLE_EQ(ts.at({1, "wait FFN"})[0], 2.0);
  EXPECT_DOUBLE_EQ(ts.at({100, "ffn"})[0], 7.0);
  int names = 0;
  for (const auto& e : j["traceEvents"]) names += e["ph"] == "M" ? 1 : 0;
  EXPECT_EQ(names, 3);  // attention 0, ffn 0, and ffn 0 again from the cut part
  // A merged file merges again.
  notes.clear();
  ASSERT_TRUE(merge_trace_files({pa}, pe, &notes).is_ok());
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(times(read_json(pe)).at({100, "ffn"})[0], 7.0);
  for (const auto& p : {pa, pf, pe, bad, cut}) std::filesystem::remove(p);
  // An output that cannot be written is an error.
  EXPECT_FALSE(merge_trace_files({}, "/nonexistent-dir/x.json", nullptr).is_ok());
}

TEST(TraceRecorder, MergeOfNothingReadableWritesNothing) {
  TraceRecorder t(8);
  t.span("ffn", 100, 0, 5000, 6000, 0, 0, 4);
  const std::string keep = tmp_path("keep.json"), bad = tmp_path("garbage.json");
  ASSERT_TRUE(t.write(keep).is_ok());
  const std::string before = read_text(keep);
  std::ofstream(bad) << "not a trace\n";
  std::vector<TracePartNote> notes;
  const Status s = merge_trace_files({tmp_path("missing.json"), bad}, keep, &notes);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("none of the files"), std::string::npos) << s.to_string();
  EXPECT_EQ(notes.size(), 2u);
  EXPECT_EQ(read_text(keep), before);  // the existing output is untouched
  EXPECT_FALSE(merge_trace_files({}, keep, nullptr).is_ok());
  EXPECT_EQ(read_text(keep), before);
  // No temporary file is left beside it.
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(keep).parent_path()))
    EXPECT_EQ(e.path().string().find(keep + ".tmp"), std::string::npos) << e.path();
  for (const auto& p : {keep, bad}) std::filesystem::remove(p);
}

TEST(TraceRecorder, MergeReadsAPartListedTwiceOnce) {
  TraceRecorder t(8);
  t.span("ffn", 100, 0, 5000, 6000, 0, 0, 4);
  const std::string p = tmp_path("twice.json"), m = tmp_path("twice_merged.json");
  ASSERT_TRUE(t.write(p).is_ok());
  std::vector<TracePartNote> notes;
  ASSERT_TRUE(merge_trace_files({p, p}, m, &notes).is_ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_FALSE(notes[0].merged);
  EXPECT_NE(notes[0].why.find("listed twice"), std::string::npos);
  EXPECT_EQ(times(read_json(m)).at({100, "ffn"}).size(), 1u);
  for (const auto& f : {p, m}) std::filesystem::remove(f);
}

TEST(TraceRecorder, StreamedFileIsCompleteAfterFinish) {
  const std::string p = tmp_path("stream.json");
  {
    TraceRecorder t(4);
    ASSERT_TRUE(t.stream_to(p, 1).is_ok());
    EXPECT_TRUE(t.streaming());
    t.name_process(100, "ffn 0");
    const int64_t t0 = now_ns();
    for (int i = 0; i < 6; ++i) t.span("ffn", 100, 1, t0 + i * 1000, t0 + i * 1000 + 500, i, 0, 4);
    EXPECT_EQ(t.size(), 4u);
    EXPECT_EQ(t.dropped(), 2u);
    ASSERT_TRUE(t.finish().is_ok());
    EXPECT_FALSE(t.streaming());
    t.span("ffn", 100, 1, t0, t0 + 1);  // after finish: not recorded
    EXPECT_EQ(t.size(), 4u);
    EXPECT_FALSE(t.write(tmp_path("other.json")).is_ok());  // streamed, not kept in memory
  }
  const nlohmann::json j = read_json(p);
  EXPECT_EQ(j["otherData"]["dropped_spans"], 2);
  const auto ts = times(j);
  ASSERT_EQ(ts.at({100, "ffn"}).size(), 4u);
  // Times count from stream_to(), which came before the first span.
  EXPECT_GE(ts.at({100, "ffn"})[0], 0.0);
  EXPECT_DOUBLE_EQ(ts.at({100, "ffn"})[1] - ts.at({100, "ffn"})[0], 1.0);
  // A streamed file merges like a written one.
  const std::string m = tmp_path("stream_merged.json");
  std::vector<TracePartNote> notes;
  ASSERT_TRUE(merge_trace_files({p}, m, &notes).is_ok());
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(times(read_json(m)).at({100, "ffn"}).size(), 4u);
  EXPECT_EQ(read_json(m)["otherData"]["dropped_spans"], 2);
  std::filesystem::remove(p);
  std::filesystem::remove(m);
}

TEST(TraceRecorder, StreamOfAKilledProcessKeepsItsFlushedSpans) {
  // What SIGKILL leaves: the file as it is between two flushes, without the closing line.
  const std::string p = tmp_path("killed.json"), snap = tmp_path("killed_snapshot.json"),
                    m = tmp_path("killed_merged.json");
  TraceRecorder t;
  ASSERT_TRUE(t.stream_to(p, 1).is_ok());
  t.name_process(1, "attention 0");
  const int64_t t0 = now_ns();
  for (int i = 0; i < 3; ++i) t.span("attention", 1, 0, t0 + i * 1000, t0 + i * 1000 + 500, i, 0, 8);
  std::string text;
  for (int k = 0; k < 2000 && std::count(text.begin(), text.end(), '\n') < 4; ++k) {  // head, name, 3 spans
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    text = read_text(p);
  }
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;  // the last span has no newline yet
  std::ofstream(snap) << text;
  std::vector<TracePartNote> notes;
  ASSERT_TRUE(merge_trace_files({snap}, m, &notes).is_ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(notes[0].merged);
  EXPECT_NE(notes[0].why.find("merged its 4 complete events"), std::string::npos) << notes[0].why;
  EXPECT_EQ(times(read_json(m)).at({1, "attention"}).size(), 3u);
  // Killed in the middle of writing a line: that line is dropped, the rest merged.
  std::ofstream(snap) << text << ",\n{\"name\":\"attent";
  notes.clear();
  ASSERT_TRUE(merge_trace_files({snap}, m, &notes).is_ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(notes[0].merged);
  EXPECT_NE(notes[0].why.find("not the cut last line"), std::string::npos) << notes[0].why;
  EXPECT_EQ(times(read_json(m)).at({1, "attention"}).size(), 3u);
  // A bad line that is not the last one is not a cut: the part is left out (it being the
  // only one, the merge fails and leaves the earlier output as it was).
  std::ofstream(snap) << text << ",\nnot json,\n" << text.substr(text.rfind('\n') + 1);
  notes.clear();
  EXPECT_FALSE(merge_trace_files({snap}, m, &notes).is_ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_FALSE(notes[0].merged);
  EXPECT_EQ(times(read_json(m)).at({1, "attention"}).size(), 3u);
  ASSERT_TRUE(t.finish().is_ok());
  EXPECT_EQ(times(read_json(p)).at({1, "attention"}).size(), 3u);
  for (const auto& f : {p, snap, m}) std::filesystem::remove(f);
}

TEST(TraceRecorder, StreamToFailsClearly) {
  TraceRecorder t;
  Status s = t.stream_to("/nonexistent-dir/t.json");
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("/nonexistent-dir/t.json"), std::string::npos) << s.to_string();
  EXPECT_FALSE(t.streaming());
  TraceRecorder u;
  u.span("attention", 1, 0, 1, 2);
  EXPECT_FALSE(u.stream_to(tmp_path("late.json")).is_ok());  // only before the first span
}

}  // namespace
}  // namespace afd
