// Engine flags shared by the subcommands that build an engine (generate, bench, serve).
// One table of flags, each with an AFD_* environment mirror.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/engine_factory.h"
#include "runtime/trace.h"

namespace afd::cli {

// A comma-separated host:port list (--ffn, --attention-workers): every entry must contain a
// ':', none may appear twice; errors name `flag`.
Result<std::vector<std::string>> parse_address_list(const std::string& flag, const std::string& csv);

struct EngineFlags {
  std::string model_dir;
  std::string precision = "fast";
  std::string kv_dtype = "bf16";
  int64_t kv_capacity = 0;
  int64_t kv_block = 16;
  int64_t max_seqs = 256;
  bool no_prefix_cache = false;  // disables automatic prefix caching (EngineOptions::kv.prefix_caching)
  int threads = 0;
  std::string topology = "mono";
  std::string microbatches;  // one value, empty: the wiring's default; bench accepts a list
  bool fp8_dispatch = false;
  int afd_rounding = 0;
  int ffn_tp = 1;           // FFN tensor-parallel degree (EngineOptions::afd.ffn_tp)
  int64_t fp8_group = 0;
  std::string ffn;          // remote FFN workers "host:port,host:port" (shard order)
  int attention_index = 0;
  int ffn_timeout_ms = 10000;
  int ffn_connect_timeout_ms = 60000;
  int ffn_probe_ms = 1000;
  double ffn_takeover_s = 10;  // EngineOptions::afd.ffn_takeover_ms, in seconds
  int ffn_parts = 0;           // EngineOptions::afd.ffn_parts
  // FFN worker processes this command starts (apps/local_ffn.h): their --peer-timeout-ms.
  // Registered by `afd serve` only (--ffn-peer-timeout-ms).
  int ffn_peer_timeout_ms = 10000;
  int ucx_spin_us = -1;     // -1: UcxOptions default (EngineOptions::afd.ucx_spin_us)
  std::string ffn_device = "cpu";  // where FFN halves run: cpu | cuda (EngineOptions::ffn_device)
  bool spawn_ffn = false;    // start the FFN workers as local processes (apps/local_ffn.h)
  std::string trace;        // Chrome trace-event JSON of the pipeline (written by the command)
  int64_t trace_max_spans = static_cast<int64_t>(TraceRecorder::kDefaultMaxSpans);  // later spans are dropped

  void add_to(CLI::App* cmd, bool model_required = true);
  // Converts to EngineOptions; errors name the flag. open_trace: with --trace, start the
  // trace file (EngineOptions::observability.trace); false only validates (--print-config).
  Result<EngineOptions> to_options(bool open_trace = true) const;
};

// Parses "1,300,1234" into ids; errors name the offending element.
Result<std::vector<int32_t>> parse_id_list(const std::string& s);
// Parses "1,8,32" into positive integers.
Result<std::vector<int64_t>> parse_int_list(const std::string& s, const char* what);

// Prints "afd <cmd>: error: <status>" and throws CLI::RuntimeError(1).
[[noreturn]] void fail(const char* cmd, const Status& s);

}  // namespace afd::cli
