// TraceRecorder: bounded recording, the written file, and merging several processes' files.
#include "runtime/trace.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace afd {
namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("afd_test_trace_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());  // throws (fails the test) if not JSON
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
  std::vector<SkippedTracePart> skipped;
  // The output may be one of the parts (it is read before it is written).
  ASSERT_TRUE(merge_trace_files({pa, pe, bad, pf, cut, missing}, pa, &skipped).is_ok());
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_EQ(skipped[0].path, bad);
  EXPECT_EQ(skipped[0].why.rfind("not a trace", 0), 0u) << skipped[0].why;
  EXPECT_EQ(skipped[1].path, cut);
  EXPECT_EQ(skipped[1].why.rfind("truncated", 0), 0u) << skipped[1].why;
  EXPECT_EQ(skipped[2].path, missing);
  EXPECT_EQ(skipped[2].why.rfind("cannot read", 0), 0u) << skipped[2].why;
  const nlohmann::json j = read_json(pa);
  EXPECT_EQ(j["otherData"]["origin_ns"], 5000000);
  const auto ts = times(j);
  EXPECT_DOUBLE_EQ(ts.at({1, "attention"})[0], 0.0);
  EXPECT_DOUBLE_EQ(ts.at({1, "wait FFN"})[0], 2.0);
  EXPECT_DOUBLE_EQ(ts.at({100, "ffn"})[0], 7.0);
  int names = 0;
  for (const auto& e : j["traceEvents"]) names += e["ph"] == "M" ? 1 : 0;
  EXPECT_EQ(names, 2);
  // A merged file merges again.
  skipped.clear();
  ASSERT_TRUE(merge_trace_files({pa}, pe, &skipped).is_ok());
  EXPECT_TRUE(skipped.empty());
  EXPECT_EQ(times(read_json(pe)).at({100, "ffn"})[0], 7.0);
  for (const auto& p : {pa, pf, pe, bad, cut}) std::filesystem::remove(p);
  // An output that cannot be written is an error.
  EXPECT_FALSE(merge_trace_files({}, "/nonexistent-dir/x.json", nullptr).is_ok());
}

}  // namespace
}  // namespace afd
