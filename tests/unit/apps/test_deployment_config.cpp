// DeploymentConfig: the order of the layers (default < topology file < environment < flag),
// the source recorded for each value, --print-config's JSON, and errors that name the key.
#include <gtest/gtest.h>

#include <cstdlib>

#include "deployment_config.h"
#include "engine_flags.h"

namespace afd::cli {
namespace {

// One command with the engine flag table, an --api-key and --print-config, parsed from
// `line` with the environment variables of `env` set during the parse.
struct Cmd {
  CLI::App app{"test"};
  CLI::App* cmd = nullptr;
  bool print = false;
  EngineFlags engine;
  std::string api_key;

  Cmd() {
    cmd = app.add_subcommand("serve");
    add_print_config(cmd, &print);
    engine.add_to(cmd, /*model_required=*/false);
    cmd->add_option("--api-key", api_key, "key")->envname("AFD_API_KEY");
  }
  void parse(const std::string& line, std::initializer_list<std::pair<const char*, const char*>> env = {}) {
    for (const auto& [k, v] : env) ::setenv(k, v, 1);
    try {
      app.parse(line, /*program_name_included=*/false);
    } catch (...) {
      for (const auto& [k, v] : env) ::unsetenv(k);
      throw;
    }
    for (const auto& [k, v] : env) ::unsetenv(k);
  }
};

TEST(DeploymentConfig, KeysAreFlagNames) {
  EXPECT_EQ(config_key("--kv-dtype"), "kv_dtype");
  EXPECT_EQ(config_key("ffn-timeout-ms"), "ffn_timeout_ms");
  EXPECT_EQ(config_key("threads"), "threads");
}

TEST(DeploymentConfig, LayersInOrderWithSources) {
  Cmd c;
  c.parse("serve --threads 2", {{"AFD_KV_BLOCK", "32"}, {"AFD_THREADS", "7"}});
  DeploymentConfig cfg = DeploymentConfig::of(c.cmd);
  // The file gives four values: a flag and an env mirror override two of them.
  const std::vector<TopologySetting> file = {{"threads", 5, "threads"},
                                             {"kv_block", 64, "scheduler.kv_block"},
                                             {"max_seqs", 8, "scheduler.max_seqs"},
                                             {"precision", "reference", "precision"},
                                             {"max_seqs", 9, "attention[0].max_seqs"}};  // later wins
  ASSERT_TRUE(cfg.apply(file, "t.json").is_ok());
  EXPECT_EQ(c.engine.options.n_threads, 2);      // flag over env and file
  EXPECT_EQ(c.engine.options.kv.block_size, 32);    // env over file
  EXPECT_EQ(c.engine.options.kv.max_seqs, 9);     // file over default
  EXPECT_EQ(c.engine.precision, "reference");
  EXPECT_EQ(c.engine.kv_dtype, "bf16");  // default
  EXPECT_EQ(cfg.find("threads")->source, ConfigSource::flag);
  EXPECT_EQ(cfg.find("threads")->origin, "flag --threads");
  EXPECT_EQ(cfg.find("kv_block")->source, ConfigSource::environment);
  EXPECT_EQ(cfg.find("kv_block")->origin, "env AFD_KV_BLOCK");
  EXPECT_EQ(cfg.find("max_seqs")->source, ConfigSource::topology_file);
  EXPECT_EQ(cfg.find("max_seqs")->origin, "topology file t.json: attention[0].max_seqs");
  EXPECT_EQ(cfg.find("kv_dtype")->source, ConfigSource::default_value);
  EXPECT_EQ(cfg.find("print_config"), nullptr);
  EXPECT_EQ(cfg.find("help"), nullptr);
  // The merged result is what the engine gets.
  auto o = c.engine.to_options(/*open_trace=*/false);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->kv.block_size, 32);
  EXPECT_EQ(o->kv.max_seqs, 9);
  EXPECT_EQ(o->n_threads, 2);
}

TEST(DeploymentConfig, JsonHasTypedValuesAndSources) {
  Cmd c;
  c.parse("serve --kv-dtype fp8 --api-key s3cret", {{"AFD_NO_PREFIX_CACHE", "1"}});
  DeploymentConfig cfg = DeploymentConfig::of(c.cmd);
  ASSERT_TRUE(cfg.apply({{"ffn_takeover_s", 4, "ffn_takeover_s"}}, "t.json").is_ok());
  const nlohmann::json j = cfg.to_json();
  EXPECT_EQ(j["kv_dtype"]["value"], "fp8");
  EXPECT_EQ(j["kv_dtype"]["source"], "flag --kv-dtype");
  EXPECT_EQ(j["kv_block"]["value"], 16);  // integer, not "16"
  EXPECT_EQ(j["kv_block"]["source"], "default");
  EXPECT_EQ(j["ffn_takeover_s"]["value"], 4.0);  // the flag is a number of seconds
  EXPECT_EQ(j["ffn_takeover_s"]["source"], "topology file t.json: ffn_takeover_s");
  EXPECT_EQ(j["no_prefix_cache"]["value"], true);
  EXPECT_EQ(j["no_prefix_cache"]["source"], "env AFD_NO_PREFIX_CACHE");
  EXPECT_EQ(j["spawn_ffn"]["value"], false);
  EXPECT_EQ(j["api_key"]["value"], "(set)");  // never the key itself
  EXPECT_EQ(j.dump().find("s3cret"), std::string::npos);
  EXPECT_FALSE(j.contains("print_config"));
}

TEST(DeploymentConfig, BadFileValuesNameTheKeyAndFlag) {
  struct Case {
    TopologySetting s;
    const char* expect;
  };
  const Case cases[] = {
      {{"ffn_device", "gpu", "ffn[1].device"}, "topology file t.json: ffn[1].device (--ffn-device)"},
      {{"kv_block", "many", "scheduler.kv_block"}, "topology file t.json: scheduler.kv_block (--kv-block)"},
      {{"trace_max_spans", 0, "trace_max_spans"}, "(--trace-max-spans)"},
      {{"bogus", 1, "bogus"}, "t.json: bogus: 'bogus' is not a setting of this command"},
  };
  for (const auto& k : cases) {
    Cmd c;
    c.parse("serve");
    DeploymentConfig cfg = DeploymentConfig::of(c.cmd);
    Status s = cfg.apply({k.s}, "t.json");
    ASSERT_FALSE(s.is_ok()) << k.s.key;
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find(k.expect), std::string::npos) << s.message();
  }
  // A value that passes the flag's conversion but not the one validation of the whole.
  Cmd c;
  c.parse("serve");
  DeploymentConfig cfg = DeploymentConfig::of(c.cmd);
  ASSERT_TRUE(cfg.apply({{"ffn_parts", 3, "ffn_parts"}, {"ffn_tp", 2, "ffn_tp"}, {"topology", "1A2F", "x"}}, "t.json")
                  .is_ok());
  auto o = c.engine.to_options(false);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--ffn-parts"), std::string::npos) << o.status().to_string();
  // with_sources says where the values of the flags the error names came from.
  const Status w = cfg.with_sources(o.status());
  EXPECT_EQ(w.code(), StatusCode::invalid_argument);
  EXPECT_EQ(w.message().find(o.status().message()), 0u) << w.message();
  EXPECT_NE(w.message().find("--ffn-parts: topology file t.json: ffn_parts"), std::string::npos) << w.message();
  EXPECT_NE(w.message().find("--ffn-tp: topology file t.json: ffn_tp"), std::string::npos) << w.message();
  // A flag named only as a prefix of a longer one, defaults and ok are left alone.
  EXPECT_EQ(cfg.with_sources(invalid_argument("--ffn-tp-x is odd")).message(), "--ffn-tp-x is odd");
  EXPECT_EQ(cfg.with_sources(invalid_argument("--kv-block is odd")).message(), "--kv-block is odd");
  EXPECT_TRUE(cfg.with_sources(Status()).is_ok());
}

TEST(DeploymentConfig, BadEnvironmentValueNamesTheFlag) {
  Cmd c;
  try {
    c.parse("serve", {{"AFD_TRACE_MAX_SPANS", "0"}});
    FAIL() << "AFD_TRACE_MAX_SPANS=0 was accepted";
  } catch (const CLI::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("--trace-max-spans"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace afd::cli
