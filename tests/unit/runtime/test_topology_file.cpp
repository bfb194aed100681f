// TopologyFile parsing: a full file as flag-keyed settings (no defaults of its own),
// per-worker overrides, what a worker's or the front end's settings are, and bad files whose
// errors name the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "runtime/topology_file.h"

namespace afd {
namespace {

// The value of the last setting with `key` in `s`, or null JSON when there is none.
nlohmann::json value_of(const std::vector<TopologySetting>& s, const std::string& key) {
  nlohmann::json v;
  for (const auto& x : s)
    if (x.key == key) v = x.value;
  return v;
}

const char* kGood = R"({
  "model": "/m/default", "precision": "reference", "microbatches": 2, "threads": 3,
  "peer_timeout_ms": 500, "ffn_probe_ms": 250, "ffn_takeover_s": 4, "ffn_parts": 3,
  "frontend": {"listen": "0.0.0.0:8000", "api_key": "k"},
  "attention": [{"address": "a1:8101", "listen": "0.0.0.0:8101"},
                {"address": "a2:8101", "microbatches": 4, "model": "/m/other"}],
  "ffn": [{"address": "f1:7100"}, {"address": "[::1]:7100", "threads": 8, "device": "cuda"}]
})";

TEST(TopologyFile, ParsesEveryField) {
  auto t = parse_topology_file(kGood, "t.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->topology(), "2A2F");
  EXPECT_EQ(t->ffn_addresses(), "f1:7100,[::1]:7100");
  EXPECT_EQ(value_of(t->settings, "precision"), "reference");
  EXPECT_EQ(value_of(t->settings, "peer_timeout_ms"), 500);
  EXPECT_TRUE(value_of(t->settings, "ffn_timeout_ms").is_null());  // not in the file: no value of its own
  EXPECT_EQ(t->find("ffn_timeout_ms"), nullptr);
  EXPECT_EQ(value_of(t->settings, "ffn_probe_ms"), 250);
  EXPECT_EQ(value_of(t->settings, "ffn_takeover_s"), 4);
  EXPECT_EQ(value_of(t->settings, "ffn_parts"), 3);
  ASSERT_NE(t->find("ffn_parts"), nullptr);
  EXPECT_EQ(t->find("ffn_parts")->where, "ffn_parts");
  EXPECT_EQ(t->frontend.listen, "0.0.0.0:8000");
  EXPECT_EQ(t->frontend.api_key, "k");
  EXPECT_EQ(t->frontend.model_dir, "/m/default");
  EXPECT_EQ(t->attention[0].listen, "0.0.0.0:8101");
  EXPECT_EQ(t->attention[1].listen, "a2:8101");  // defaults to the address
  EXPECT_EQ(t->attention[1].model_dir, "/m/other");
  EXPECT_EQ(t->ffn[0].model_dir, "/m/default");
  EXPECT_EQ(value_of(t->ffn[1].settings, "threads"), 8);

  // A worker's settings: the file's, its own (later, so they win), then what its entry implies.
  const auto a0 = t->worker_settings(/*attention=*/true, 0);
  EXPECT_EQ(value_of(a0, "microbatches"), 2);
  EXPECT_EQ(value_of(a0, "threads"), 3);
  EXPECT_EQ(value_of(a0, "listen"), "0.0.0.0:8101");
  EXPECT_EQ(value_of(a0, "topology"), "2A2F");
  EXPECT_EQ(value_of(a0, "ffn"), "f1:7100,[::1]:7100");
  EXPECT_EQ(value_of(a0, "attention_index"), 0);
  EXPECT_EQ(value_of(a0, "attention"), 2);
  EXPECT_EQ(value_of(a0, "model"), "/m/default");
  const auto a1 = t->worker_settings(true, 1);
  EXPECT_EQ(value_of(a1, "microbatches"), 4);
  EXPECT_EQ(value_of(a1, "model"), "/m/other");
  EXPECT_EQ(value_of(a1, "attention_index"), 1);
  bool own_last = false;
  for (const auto& x : a1) own_last = x.key == "microbatches" ? x.where == "attention[1].microbatches" : own_last;
  EXPECT_TRUE(own_last);
  const auto f1 = t->worker_settings(false, 1);
  EXPECT_EQ(value_of(f1, "threads"), 8);
  EXPECT_EQ(value_of(f1, "ffn_device"), "cuda");
  EXPECT_EQ(value_of(f1, "shard"), "1/2");
  EXPECT_EQ(value_of(f1, "listen"), "[::1]:7100");
  EXPECT_TRUE(value_of(f1, "ffn").is_null());
  EXPECT_TRUE(value_of(f1, "attention_index").is_null());
  const auto fe = t->frontend_settings();
  EXPECT_EQ(value_of(fe, "host"), "0.0.0.0");
  EXPECT_EQ(value_of(fe, "port"), 8000);
  EXPECT_EQ(value_of(fe, "api_key"), "k");
  EXPECT_EQ(value_of(fe, "model"), "/m/default");

  // Without "microbatches" anywhere: no setting, i.e. the flag's default (the engine's).
  std::string none(kGood);
  none.erase(none.find("\"microbatches\": 2, "), std::string("\"microbatches\": 2, ").size());
  auto t0 = parse_topology_file(none, "t.json");
  ASSERT_TRUE(t0.ok()) << t0.status().to_string();
  EXPECT_TRUE(value_of(t0->worker_settings(true, 0), "microbatches").is_null());
  EXPECT_EQ(value_of(t0->worker_settings(true, 1), "microbatches"), 4);
  EXPECT_EQ(t0->ffn[0].metrics_listen, "");  // no metrics server unless asked
  EXPECT_TRUE(value_of(t0->worker_settings(false, 0), "metrics_listen").is_null());
  std::string with_metrics(kGood);
  with_metrics.replace(with_metrics.find("{\"address\": \"f1:7100\"}"), std::string("{\"address\": \"f1:7100\"}").size(),
                       "{\"address\": \"f1:7100\", \"metrics\": \"0.0.0.0:9100\"}");
  auto tm = parse_topology_file(with_metrics, "t.json");
  ASSERT_TRUE(tm.ok()) << tm.status().to_string();
  EXPECT_EQ(tm->ffn[0].metrics_listen, "0.0.0.0:9100");
  EXPECT_EQ(value_of(tm->worker_settings(false, 0), "metrics_listen"), "0.0.0.0:9100");
  EXPECT_EQ(tm->ffn[1].metrics_listen, "");
}

TEST(TopologyFile, LoadResolvesRelativeModelDirs) {
  const auto dir = std::filesystem::temp_directory_path() / ("afd_topo_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "t.json");
    f << R"({"model": "models/tiny", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2", "model": "/abs"}]})";
  }
  auto t = load_topology_file((dir / "t.json").string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->attention[0].model_dir, (dir / "models/tiny").string());
  EXPECT_EQ(t->frontend.model_dir, (dir / "models/tiny").string());
  EXPECT_EQ(t->ffn[0].model_dir, "/abs");
  EXPECT_EQ(t->frontend.listen, "");  // not in the file: afd serve's --host / --port
  EXPECT_TRUE(value_of(t->frontend_settings(), "host").is_null());
  EXPECT_EQ(value_of(t->frontend_settings(), "model"), (dir / "models/tiny").string());
  std::filesystem::remove_all(dir);
  auto missing = load_topology_file((dir / "t.json").string());
  EXPECT_EQ(missing.status().code(), StatusCode::not_found);
}

struct BadCase {
  const char* json;
  const char* expect;  // substring of the error
};

TEST(TopologyFile, BadFilesNameTheField) {
  const BadCase cases[] = {
      {"{", "not valid JSON"},
      {"{\n  \"model\": \"m\",\n  \"attention\": [}", "not valid JSON: parse error at line 3, column"},
      {R"({"model": "m", "model": "n", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "key \"model\" appears twice"},
      {R"({"model": "m", "attention": [{"address": "h:1", "address": "h:3"}], "ffn": [{"address": "h:2"}]})",
       "key \"address\" appears twice"},
      {"[]", "must be a JSON object"},
      {R"({"model": "m", "ffn": [{"address": "h:1"}]})", "attention: missing"},
      {R"({"model": "m", "attention": [], "ffn": [{"address": "h:1"}]})", "attention: must be an array of 1 to 64"},
      {R"({"model": "m", "attention": [{"address": "h:1"}], "ffn": [{}]})", "ffn[0].address: missing"},
      {R"({"model": "m", "attention": [{"address": "h"}], "ffn": [{"address": "h:2"}]})", "attention[0].address: 'h' is not host:port"},
      {R"({"model": "m", "attention": [{"address": "h:70000"}], "ffn": [{"address": "h:2"}]})", "attention[0].address: 'h:70000': port"},
      {R"({"model": "m", "attention": [{"address": "h:1", "microbatches": 9}], "ffn": [{"address": "h:2"}]})",
       "attention[0].microbatches: 9 is outside [1, 4]"},
      {R"({"model": "m", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2", "microbatches": 2}]})",
       "ffn[0].microbatches: unknown field"},
      {R"({"model": "m", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2", "metrics": "h"}]})",
       "ffn[0].metrics: 'h' is not host:port"},
      {R"({"model": "m", "attention": [{"address": "h:1", "metrics": "h:3"}], "ffn": [{"address": "h:2"}]})",
       "attention[0].metrics: unknown field"},
      {R"({"model": "m", "atention": [], "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "atention: unknown field"},
      {R"({"model": "m", "precision": "fastest", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "precision: must be 'fast' or 'reference'"},
      {R"({"model": 3, "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})", "model: must be a string"},
      {R"({"attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})", "model: missing"},
      {R"({"frontend": {"model": "m"}, "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "attention[0].model: missing"},
      {R"({"model": "m", "threads": "2", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "threads: must be an integer"},
      {R"({"model": "m", "attention": [{"address": "h:1"}], "ffn": [{"address": "h:1"}]})",
       "ffn[0].address: 'h:1' is used twice"},
      {R"({"model": "m", "frontend": {"listen": "x"}, "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "frontend.listen: 'x' is not host:port"},
      {R"({"model": "m", "frontend": 1, "attention": [{"address": "h:1"}], "ffn": [{"address": "h:2"}]})",
       "frontend: must be an object"},
      {R"({"model": "m", "attention": ["h:1"], "ffn": [{"address": "h:2"}]})", "attention[0]: must be an object"},
  };
  for (const auto& c : cases) {
    auto t = parse_topology_file(c.json, "t.json");
    ASSERT_FALSE(t.ok()) << c.json;
    EXPECT_EQ(t.status().code(), StatusCode::invalid_argument) << c.json;
    EXPECT_NE(t.status().message().find(std::string("t.json: ")), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << "got: " << t.status().message();
  }
}

// "ffn_tp": optional FFN tensor-parallel degree (default 1), must divide the FFN worker count.
TEST(TopologyFile, FfnTp) {
  auto t = parse_topology_file(kGood, "t.json");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->find("ffn_tp"), nullptr);  // absent: --ffn-tp's default
  std::string two(kGood);
  two.replace(two.find("\"peer_timeout_ms\""), 0, "\"ffn_tp\": 2, ");
  auto t2 = parse_topology_file(two, "t.json");
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  EXPECT_EQ(value_of(t2->settings, "ffn_tp"), 2);
  std::string three(kGood);
  three.replace(three.find("\"peer_timeout_ms\""), 0, "\"ffn_tp\": 3, ");
  auto t3 = parse_topology_file(three, "t.json");
  ASSERT_FALSE(t3.ok());
  EXPECT_NE(t3.status().message().find("t.json: ffn_tp: 3 does not divide the 2 FFN workers"), std::string::npos)
      << t3.status().to_string();
  std::string zero(kGood);
  zero.replace(zero.find("\"peer_timeout_ms\""), 0, "\"ffn_tp\": 0, ");
  EXPECT_FALSE(parse_topology_file(zero, "t.json").ok());
}

// "deterministic": a JSON boolean, passed to every worker as --deterministic.
TEST(TopologyFile, Deterministic) {
  auto t = parse_topology_file(kGood, "t.json");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->find("deterministic"), nullptr);  // absent: --deterministic's default
  std::string on(kGood);
  on.replace(on.find("\"peer_timeout_ms\""), 0, "\"deterministic\": true, ");
  auto t2 = parse_topology_file(on, "t.json");
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  EXPECT_EQ(value_of(t2->settings, "deterministic"), true);
  std::string bad(kGood);
  bad.replace(bad.find("\"peer_timeout_ms\""), 0, "\"deterministic\": 1, ");
  auto t3 = parse_topology_file(bad, "t.json");
  ASSERT_FALSE(t3.ok());
  EXPECT_NE(t3.status().message().find("t.json: deterministic: must be true or false"), std::string::npos)
      << t3.status().to_string();
}

// Speculative decoding: the method by name, the counts in their flags' ranges.
TEST(TopologyFile, Speculative) {
  std::string on(kGood);
  on.replace(on.find("\"peer_timeout_ms\""), 0,
             "\"speculative\": \"ngram\", \"draft_tokens\": 5, \"ngram_min\": 1, \"ngram_max\": 3, ");
  auto t = parse_topology_file(on, "t.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(value_of(t->settings, "speculative"), "ngram");
  EXPECT_EQ(value_of(t->settings, "draft_tokens"), 5);
  EXPECT_EQ(value_of(t->settings, "ngram_max"), 3);
  for (const char* bad : {"\"speculative\": \"eagle\", ", "\"draft_tokens\": 0, ", "\"draft_tokens\": 9, ",
                          "\"ngram_min\": 0, ", "\"speculative\": 1, "}) {
    std::string b(kGood);
    b.replace(b.find("\"peer_timeout_ms\""), 0, bad);
    EXPECT_FALSE(parse_topology_file(b, "t.json").ok()) << bad;
  }
}

TEST(TopologyFile, SchedulerLimitsAndUcxSpin) {
  auto t = parse_topology_file(kGood, "t.json");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->find("max_running"), nullptr);  // absent: the worker's own defaults
  EXPECT_EQ(t->find("ucx_spin_us"), nullptr);
  std::string with(kGood);
  with.replace(with.find("\"peer_timeout_ms\""), 0,
               "\"ucx_spin_us\": 20, \"scheduler\": {\"max_running\": 8, \"max_queue\": 0, "
               "\"max_batch_tokens\": 512, \"max_context\": 2048, \"max_seqs\": 16, \"kv_capacity\": 32768, "
               "\"kv_block\": 32, \"step_retry_s\": 0, \"drain_timeout_s\": 5}, ");
  auto t2 = parse_topology_file(with, "t.json");
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  const auto& st = t2->settings;
  EXPECT_EQ(value_of(st, "ucx_spin_us"), 20);
  EXPECT_EQ(value_of(st, "max_running"), 8);
  EXPECT_EQ(t2->find("max_running")->where, "scheduler.max_running");
  EXPECT_EQ(value_of(st, "max_queue"), 0);
  EXPECT_EQ(value_of(st, "max_batch_tokens"), 512);
  EXPECT_EQ(value_of(st, "max_context"), 2048);
  EXPECT_EQ(value_of(st, "max_seqs"), 16);
  EXPECT_EQ(value_of(st, "kv_capacity"), 32768);
  EXPECT_EQ(value_of(st, "kv_block"), 32);
  EXPECT_EQ(value_of(st, "step_retry_s"), 0);
  EXPECT_EQ(value_of(st, "drain_timeout_s"), 5);
  EXPECT_EQ(t->find("step_retry_s"), nullptr);
  std::string typo(kGood);
  typo.replace(typo.find("\"peer_timeout_ms\""), 0, "\"scheduler\": {\"max_runing\": 8}, ");
  auto t3 = parse_topology_file(typo, "t.json");
  ASSERT_FALSE(t3.ok());
  EXPECT_NE(t3.status().message().find("t.json: scheduler.max_runing: unknown field"), std::string::npos)
      << t3.status().to_string();
  std::string zero(kGood);
  zero.replace(zero.find("\"peer_timeout_ms\""), 0, "\"scheduler\": {\"max_running\": 0}, ");
  auto t4 = parse_topology_file(zero, "t.json");
  ASSERT_FALSE(t4.ok());
  EXPECT_NE(t4.status().message().find("scheduler.max_running: 0 is outside"), std::string::npos)
      << t4.status().to_string();
}

TEST(TopologyFile, FfnWorkerDevice) {
  auto t = parse_topology_file(kGood, "t.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(value_of(t->ffn[0].settings, "ffn_device").is_null());  // absent: --ffn-device's default (cpu)
  EXPECT_EQ(value_of(t->ffn[1].settings, "ffn_device"), "cuda");
  std::string bad(kGood);
  bad.replace(bad.find("\"cuda\""), 6, "\"gpu\"");
  auto t2 = parse_topology_file(bad, "t.json");
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find("t.json: ffn[1].device: must be 'cpu' or 'cuda'"), std::string::npos)
      << t2.status().to_string();
  std::string on_attention(kGood);
  on_attention.replace(on_attention.find("\"listen\": \"0.0.0.0:8101\""), 0, "\"device\": \"cuda\", ");
  auto t3 = parse_topology_file(on_attention, "t.json");
  ASSERT_FALSE(t3.ok());
  EXPECT_NE(t3.status().message().find("device: unknown field"), std::string::npos) << t3.status().to_string();
}

TEST(TopologyFile, SplitHostPort) {
  std::string h;
  int p = 0;
  ASSERT_TRUE(split_host_port("0.0.0.0:7100", &h, &p).is_ok());
  EXPECT_EQ(h, "0.0.0.0");
  EXPECT_EQ(p, 7100);
  ASSERT_TRUE(split_host_port("[::1]:80", &h, &p).is_ok());
  EXPECT_EQ(h, "::1");
  EXPECT_FALSE(split_host_port(":80", &h, &p).is_ok());
  EXPECT_FALSE(split_host_port("h:", &h, &p).is_ok());
  EXPECT_FALSE(split_host_port("h:0", &h, &p).is_ok());
  EXPECT_FALSE(split_host_port("h:8x", &h, &p).is_ok());
}

}  // namespace
}  // namespace afd
