// Engine flags shared by the subcommands that build an engine (generate, bench, serve).
// One table of flags, each with an AFD_* environment mirror.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/afd/ffn_worker.h"
#include "runtime/engine_factory.h"
#include "runtime/trace.h"

namespace afd::cli {

// A comma-separated host:port list (--ffn, --attention-workers): every entry must contain a
// ':', none may appear twice; errors name `flag`.
Result<std::vector<std::string>> parse_address_list(const std::string& flag, const std::string& csv);

// --kv-dtype's spelling of a KV element type: "bf16" | "fp8" | "f32".
const char* kv_dtype_flag(DType t);

// The engine flags of one command. A flag that sets an EngineOptions member as it is
// (--model, --kv-block, --ffn-timeout-ms, ...) is bound to that member of `options`, so its
// default is the one EngineOptions has. A flag whose text is not the option's value (a name,
// a list, seconds for milliseconds, a negation) has a member here, converted by to_options(),
// whose default is written from EngineOptions'; the rest configure the command, not the engine.
struct EngineFlags {
  EngineOptions options;
  std::string precision = precision_name(EngineOptions{}.precision);  // EngineOptions::precision
  std::string kv_dtype = kv_dtype_flag(KvOptions{}.dtype);           // KvOptions::dtype
  bool no_prefix_cache = !KvOptions{}.prefix_caching;                // KvOptions::prefix_caching
  std::string speculative = speculative_method_name(SpeculativeOptions{}.method);  // SpeculativeOptions::method
  std::string speculative_max_batch = std::to_string(SpeculativeOptions{}.max_batch);  // SpeculativeOptions::max_batch
  std::string topology = Topology{}.to_string();                     // EngineOptions::topology
  std::string microbatches;  // EngineOptions::microbatches; empty: the wiring's default; bench accepts a list
  std::string ffn;           // AfdOptions::ffn_addresses: remote FFN workers "host:port,host:port" (shard order)
  double ffn_takeover_s = AfdOptions{}.ffn_takeover_ms / 1000.0;  // AfdOptions::ffn_takeover_ms
  // FFN worker processes this command starts (apps/local_ffn.h): their --peer-timeout-ms.
  // Registered by `afd serve` only (--ffn-peer-timeout-ms).
  int ffn_peer_timeout_ms = FfnWorkerOptions{}.peer_timeout_ms;
  bool spawn_ffn = false;    // start the FFN workers as local processes (apps/local_ffn.h)
  std::string trace;         // Chrome trace-event JSON of the pipeline (written by the command)
  int64_t trace_max_spans = static_cast<int64_t>(TraceRecorder::kDefaultMaxSpans);  // later spans are dropped

  void add_to(CLI::App* cmd, bool model_required = true);
  // `options` with the converted flags; errors name the flag. open_trace: with --trace, start
  // the trace file (EngineOptions::observability.trace); false only validates (--print-config).
  Result<EngineOptions> to_options(bool open_trace = true) const;
};

// Parses "1,300,1234" into ids; errors name the offending element.
Result<std::vector<int32_t>> parse_id_list(const std::string& s);
// Parses "1,8,32" into positive integers.
Result<std::vector<int64_t>> parse_int_list(const std::string& s, const char* what);

// Print "afd <cmd>: error: <message>" and throw CLI::RuntimeError(1).
[[noreturn]] void fail(const char* cmd, const std::string& message);
[[noreturn]] void fail(const char* cmd, const Status& s);

}  // namespace afd::cli
