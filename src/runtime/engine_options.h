// EngineOptions: everything make_engine needs to know besides the weights, each setting with
// its one default. The `afd` engine flags (apps/engine_flags.h) bind to these members.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "runtime/topology.h"

namespace afd {

class TraceRecorder;

enum class Precision {
  reference,  // f32 activations, f32 KV: matches an f64 reference to ~1e-5 in logits
  fast,       // bf16 activations into the matrix products, bf16 (or fp8) KV
};
// "reference" | "fast"
bool precision_from_name(const std::string& s, Precision* out);
const char* precision_name(Precision p);

// The KV cache of each attention engine.
struct KvOptions {
  // KV element type; f32 is forced in reference precision. bf16 | f8_e4m3 for fast.
  DType dtype = DType::bf16;
  int64_t block_size = 16;
  // Tokens the KV cache can hold across all sequences; 0: min(max_seqs * max_position_embeddings, 131072).
  int64_t capacity_tokens = 0;
  int64_t max_seqs = 256;
  // Automatic prefix caching (kv/paged_kv_cache.h): full KV blocks are kept by content after
  // their sequence ends and mapped into new sequences with the same token prefix
  // (Engine::reuse_prefix). On by default, as in vLLM V1; --no-prefix-cache turns it off.
  bool prefix_caching = true;
};

// The AFD wiring: where the FFN workers are, this process's place in the bundle, the wire's
// sizes and how lost or slow FFN workers are handled.
struct AfdOptions {
  // Remote FFN workers ("host:port" of `afd worker --role ffn`), in shard order. This
  // process then hosts attention worker attention_index of the topology's x.
  std::vector<std::string> ffn_addresses;
  int attention_index = 0;
  // With ffn_addresses: attention workers [attention_index, attention_index + local_attention)
  // of the topology's x run in this process (each with its own UCX endpoint).
  int local_attention = 1;
  int64_t max_batch_tokens = 4096;  // most tokens in one AFD micro-batch (wire buffers)
  // FP8 dispatch scale group on the wire (and of EmulationOptions::fp8_dispatch): 0 per-token
  // scale; 128 per-128-channel block.
  int64_t fp8_group = 0;
  int ffn_timeout_ms = 10000;       // an FFN reply later than this fails the step
  int ffn_connect_timeout_ms = 60000;  // FFN workers not connected by then: an error
  int ffn_probe_ms = 1000;             // idle time before a liveness ping to the FFN workers; 0: none
  // An FFN worker unreachable this long leaves the expert assignment and the others take over
  // its experts (FfnClientOptions::takeover_ms; whole experts only, not with ffn_tp > 1); it
  // joins again when back. 0: never (the bundle waits for it).
  int ffn_takeover_ms = 10000;
  // Parts the routed experts are cut into for re-homing (FfnClientOptions::parts): the unit of
  // BF16 rounding, and the most FFN workers that hold experts (more are standbys); the results
  // equal mono --afd-rounding ffn_parts. 0: y. Whole experts only (ffn_tp 1).
  int ffn_parts = 0;
  // Expert placement (--eplb; FfnClientOptions::expert_placement, runtime/afd/expert_placement.h):
  // the attention side places the routed experts, with eplb_redundant extra replicas per layer,
  // replanned by EPLB every eplb_interval_s (0: kept contiguous). Whole experts only.
  bool eplb = false;
  double eplb_interval_s = 10;
  int64_t eplb_redundant = 0;
  // UCX transports (remote FFN workers): how long a thread waiting for a message drives the
  // worker itself before it sleeps (comm::UcxOptions::waiter_spin_ns); -1: the default.
  int ucx_spin_us = -1;
  // FFN tensor-parallel degree t (runtime/topology.h; --ffn-tp): divides the topology's y;
  // t FFN workers per EP group each hold I/t of every expert's intermediate rows. 1 = pure EP,
  // y = pure TP. In mono it applies to EmulationOptions::afd_rounding_shards (reproduce a TP
  // bundle's rounding). With remote FFN workers, t > 1 is checked against what they announce
  // (1: accept any).
  int ffn_tp = 1;
};

// What the engines record for inspection.
struct ObservabilityOptions {
  // When set, every engine and local FFN worker records pipeline spans into it (--trace).
  std::shared_ptr<TraceRecorder> trace;
};

// Emulation for comparisons and benchmarks: the monolithic engine rounding as an AFD bundle
// does, and an artificial network delay.
struct EmulationOptions {
  // Round the FFN input through FP8 as AFD dispatch does (for AFD-vs-mono comparisons).
  bool fp8_dispatch = false;
  // Monolithic only: also round the FFN output as an xAyF bundle with y = this does (BF16
  // partials per expert shard), so mono and AFD outputs are bit-comparable. Implies fp8_dispatch.
  int afd_rounding_shards = 0;
  // Benchmarks: hold every A<->F message this long before it is sent (a one-way network
  // delay, comm::FaultTransport), on both sides of a local bundle / the attention side.
  int64_t inject_delay_us = 0;
  // Tests and benchmarks: emulated stage costs read from this JSON file (runtime/stage_emulation.h,
  // --emulate-stage-costs); empty: none.
  std::string stage_costs_file;
};

// Speculative decoding (runtime/speculative.h; --speculative, --draft-tokens, --ngram-min,
// --ngram-max): how drafts are proposed; verification runs inside the engine's step.
enum class SpeculativeMethod {
  none,
  ngram,  // prompt lookup, any model
  mtp,    // DeepSeek's MTP module (checkpoints with num_nextn_predict_layers > 0)
};
// "none" | "ngram" | "mtp"
bool speculative_method_from_name(const std::string& s, SpeculativeMethod* out);
const char* speculative_method_name(SpeculativeMethod m);

struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::none;
  // Drafts per sequence and step, k: 1..3 for mtp (the one module applied recursively),
  // 1..8 for ngram.
  int64_t draft_tokens = 1;
  // n-gram lengths tried, longest first: 1 <= ngram_min <= ngram_max <= 16.
  int64_t ngram_min = 2, ngram_max = 4;
  // Drafts only in steps with at most this many decoding sequences (larger batches are
  // compute-bound, where verifying drafts costs more than it saves; docs/BENCHMARKS.md
  // "Speculative decoding" measures where); 0: every step; kMaxBatchAuto: per batch size,
  // whichever of drafting or not gave more tokens/s while decoding (runtime/speculation_governor.h).
  static constexpr int64_t kMaxBatchAuto = -1;
  int64_t max_batch = 0;
  Status validate() const;
};

// Whether the CPU kernels run batch-invariant for a --deterministic flag and a precision: with
// the flag, and always in reference precision (EngineOptions::batch_invariant()).
inline bool batch_invariant_kernels(bool deterministic, Precision precision) {
  return deterministic || precision == Precision::reference;
}

struct EngineOptions {
  // Where the weights come from (the caller loads them: make_engine takes them loaded).
  std::string model_dir;
  Precision precision = Precision::fast;
  // Batch-invariant inference (--deterministic; docs/ARCHITECTURE.md "Batch invariance"): a
  // sequence's logits are bit-identical whatever else is in the batch, the micro-batches, the
  // wiring, the thread count, chunk boundaries and prefix-cache hits. Selects the attention
  // paths whose per-query arithmetic depends only on the query's position and the products'
  // canonical order (kernels::LinearOrder::batch_invariant). Not with a CUDA FFN.
  bool deterministic = false;
  // Whether the CPU kernels run batch-invariant: with --deterministic, and always in reference
  // precision (the exactness precision: a sequence's greedy tokens with and without speculative
  // drafts, in any wiring, agree bit for bit; its f32 products cost about the same in either
  // order, docs/BENCHMARKS.md "Batch-invariant mode"). A CUDA FFN is not batch-invariant.
  bool batch_invariant() const { return batch_invariant_kernels(deterministic, precision); }
  int n_threads = 0;  // 0: all cores
  // Wiring (runtime/topology.h): mono (FFN in the attention thread), xAyF (AFD bundle:
  // in-process workers, or remote FFN workers when afd.ffn_addresses is set), EPn (expert-
  // parallel baseline: n workers each running attention and an expert shard on shared cores).
  // Its ffn_tp is not read: afd.ffn_tp is the one TP degree.
  Topology topology;
  // Micro-batches per attention engine (1..4); 0: the wiring's default (pipeline_microbatches()).
  int microbatches = 0;
  // Where FFN halves computed in this process run (runtime/cuda_ffn.h): "cpu" | "cuda". Applies
  // to the monolithic engine and in-process FFN workers; remote workers choose their own.
  std::string ffn_device = "cpu";
  KvOptions kv;
  AfdOptions afd;
  ObservabilityOptions observability;
  EmulationOptions emulation;
  SpeculativeOptions speculative;
  Status validate() const;
  // The part of validate() an FFN worker process (which has no attention engine) also needs:
  // the FFN device against --deterministic.
  Status validate_ffn_device() const;
  // The micro-batch count the pipeline runs: `microbatches`, or when that is 0 the wiring's
  // default: 3 for xAyF (the Step-3 pipeline of Figure 7: attention, both transfers and the
  // FFN each busy with another micro-batch), 1 for mono and EPn (their FFN runs on the
  // attention thread's cores, so extra micro-batches only re-read expert weights).
  int pipeline_microbatches() const;
};

}  // namespace afd
