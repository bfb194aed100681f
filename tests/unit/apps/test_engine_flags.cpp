// EngineFlags: the flags bind to EngineOptions' members, so a command line that sets nothing
// yields EngineOptions' own defaults; the converted flags (names, lists, seconds) reach their
// options; bad values are errors naming the flag.
#include <gtest/gtest.h>

#include "engine_flags.h"

namespace afd::cli {
namespace {

struct Cmd {
  CLI::App app{"test"};
  EngineFlags engine;
  Cmd() { engine.add_to(&app, /*model_required=*/false); }
  Result<EngineOptions> parse(const std::string& line) {
    app.parse(line, /*program_name_included=*/false);
    return engine.to_options(/*open_trace=*/false);
  }
};

TEST(EngineFlags, NoFlagsGiveTheOptionDefaults) {
  Cmd c;
  auto o = c.parse("");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  const EngineOptions d;
  EXPECT_EQ(o->model_dir, d.model_dir);
  EXPECT_EQ(o->precision, d.precision);
  EXPECT_EQ(o->deterministic, d.deterministic);
  EXPECT_EQ(o->n_threads, d.n_threads);
  EXPECT_EQ(o->topology.to_string(), d.topology.to_string());
  EXPECT_EQ(o->microbatches, d.microbatches);
  EXPECT_EQ(o->ffn_device, d.ffn_device);
  EXPECT_EQ(o->kv.dtype, d.kv.dtype);
  EXPECT_EQ(o->kv.block_size, d.kv.block_size);
  EXPECT_EQ(o->kv.capacity_tokens, d.kv.capacity_tokens);
  EXPECT_EQ(o->kv.max_seqs, d.kv.max_seqs);
  EXPECT_EQ(o->kv.prefix_caching, d.kv.prefix_caching);
  EXPECT_TRUE(o->afd.ffn_addresses.empty());
  EXPECT_EQ(o->afd.attention_index, d.afd.attention_index);
  EXPECT_EQ(o->afd.fp8_group, d.afd.fp8_group);
  EXPECT_EQ(o->afd.ffn_timeout_ms, d.afd.ffn_timeout_ms);
  EXPECT_EQ(o->afd.ffn_connect_timeout_ms, d.afd.ffn_connect_timeout_ms);
  EXPECT_EQ(o->afd.ffn_probe_ms, d.afd.ffn_probe_ms);
  EXPECT_EQ(o->afd.ffn_takeover_ms, d.afd.ffn_takeover_ms);
  EXPECT_EQ(o->afd.ffn_parts, d.afd.ffn_parts);
  EXPECT_EQ(o->afd.ucx_spin_us, d.afd.ucx_spin_us);
  EXPECT_EQ(o->afd.ffn_tp, d.afd.ffn_tp);
  EXPECT_EQ(o->emulation.fp8_dispatch, d.emulation.fp8_dispatch);
  EXPECT_EQ(o->emulation.afd_rounding_shards, d.emulation.afd_rounding_shards);
  EXPECT_EQ(o->observability.trace, nullptr);
}

TEST(EngineFlags, FlagsReachTheirOptions) {
  Cmd c;
  auto o = c.parse(
      "--model m --precision reference --deterministic --kv-dtype fp8 --kv-block 32 --kv-capacity 4096 --max-seqs 8 "
      "--no-prefix-cache --threads 3 --topology 2A2F --microbatches 2 --fp8-group 128 --ffn-timeout-ms 500 "
      "--ffn-connect-timeout-ms 700 --ffn-probe-ms 0 --ffn-takeover-s 2.5 --ffn-parts 4 --ucx-spin-us 5");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->model_dir, "m");
  EXPECT_EQ(o->precision, Precision::reference);
  EXPECT_TRUE(o->deterministic);
  EXPECT_EQ(o->kv.dtype, DType::f8_e4m3);
  EXPECT_EQ(o->kv.block_size, 32);
  EXPECT_EQ(o->kv.capacity_tokens, 4096);
  EXPECT_EQ(o->kv.max_seqs, 8);
  EXPECT_FALSE(o->kv.prefix_caching);
  EXPECT_EQ(o->n_threads, 3);
  EXPECT_EQ(o->topology.wiring, Wiring::afd);
  EXPECT_EQ(o->topology.n_attention, 2);
  EXPECT_EQ(o->topology.n_ffn, 2);
  EXPECT_EQ(o->microbatches, 2);
  EXPECT_EQ(o->afd.fp8_group, 128);
  EXPECT_EQ(o->afd.ffn_timeout_ms, 500);
  EXPECT_EQ(o->afd.ffn_connect_timeout_ms, 700);
  EXPECT_EQ(o->afd.ffn_probe_ms, 0);
  EXPECT_EQ(o->afd.ffn_takeover_ms, 2500);
  EXPECT_EQ(o->afd.ffn_parts, 4);
  EXPECT_EQ(o->afd.ucx_spin_us, 5);
  Cmd s;
  auto spec = s.parse("--speculative ngram --speculative-max-batch 16");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->speculative.max_batch, 16);
  Cmd a;
  auto aut = a.parse("--speculative ngram --speculative-max-batch auto");
  ASSERT_TRUE(aut.ok()) << aut.status().to_string();
  EXPECT_EQ(aut->speculative.max_batch, SpeculativeOptions::kMaxBatchAuto);
}

// A bare --ffn list with the default topology is 1A{n}F; with a topology it must match it.
TEST(EngineFlags, BareFfnListMeansOneAttentionWorker) {
  Cmd c;
  auto o = c.parse("--ffn h:1,h:2,h:3");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->topology.to_string(), "1A3F");
  EXPECT_EQ(o->afd.ffn_addresses, (std::vector<std::string>{"h:1", "h:2", "h:3"}));
  Cmd c2;
  auto bad = c2.parse("--ffn h:1 --topology 1A2F");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("1A2F has 2 FFN workers but 1"), std::string::npos) << bad.status().to_string();
}

TEST(EngineFlags, BadValuesNameTheFlag) {
  struct Case {
    const char* line;
    const char* expect;
  };
  for (const Case& k : {Case{"--precision fp4", "--precision must be 'reference' or 'fast', got 'fp4'"},
                        Case{"--kv-dtype int4", "--kv-dtype must be bf16, fp8 or f32, got 'int4'"},
                        Case{"--topology 3Z", "topology '3Z': expected"},
                        Case{"--microbatches 5", "--microbatches: micro-batches must be one value in 1..4"},
                        Case{"--ffn h:1,h:1", "--ffn: h:1 is listed twice"},
                        Case{"--speculative-max-batch -2", "--speculative-max-batch must be auto or an integer >= 0"},
                        Case{"--speculative-max-batch sometimes", "--speculative-max-batch must be auto or an integer"}}) {
    Cmd c;
    auto o = c.parse(k.line);
    ASSERT_FALSE(o.ok()) << k.line;
    EXPECT_EQ(o.status().code(), StatusCode::invalid_argument) << k.line;
    EXPECT_NE(o.status().message().find(k.expect), std::string::npos) << o.status().to_string();
  }
}

TEST(EngineFlags, KvDtypeNamesRoundTrip) {
  for (DType t : {DType::bf16, DType::f8_e4m3, DType::f32}) {
    Cmd c;
    auto o = c.parse(std::string("--kv-dtype ") + kv_dtype_flag(t));
    ASSERT_TRUE(o.ok()) << kv_dtype_flag(t);
    EXPECT_EQ(o->kv.dtype, t);
  }
}

}  // namespace
}  // namespace afd::cli
