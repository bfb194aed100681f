// TopologyFile: one JSON file that names every process of a multi-process / multi-host AFD
// deployment (docs/DEPLOYMENT.md), so each process is started with the same file and its
// role + index (`afd worker --topology-file F --role ffn|attention --index i`,
// `afd serve --topology-file F`):
//
//   {
//     "model": "/models/qwen3-moe",            // model directory on every host (required
//                                             //   unless every worker names its own)
//     "precision": "fast", "kv_dtype": "bf16", "microbatches": 2, "threads": 0,
//     "ffn_timeout_ms": 10000, "ffn_connect_timeout_ms": 60000, "peer_timeout_ms": 10000,
//     "ffn_probe_ms": 1000,                    // optional; afd worker --ffn-probe-ms (0: off)
//     "ffn_takeover_s": 10,                    // optional; afd worker --ffn-takeover-s (0: never)
//     "ffn_parts": 0,                          // optional; afd worker --ffn-parts (0: len(ffn))
//     "ffn_tp": 1,                             // optional FFN TP degree, divides len(ffn)
//     "ucx_spin_us": 200,                      // optional; afd worker --ucx-spin-us
//     "scheduler": {"max_running": 64, "max_queue": 1024, "max_batch_tokens": 1024,
//                   "max_context": 0, "max_seqs": 256, "kv_capacity": 0, "kv_block": 16,
//                   "step_retry_s": 30, "drain_timeout_s": 30},
//                                             // optional; attention workers' limits (the
//                                             //   afd worker flags of the same names)
//     "frontend":  {"listen": "0.0.0.0:8000", "api_key": "", "model_name": ""},
//     "attention": [{"address": "host1:8101", "listen": "0.0.0.0:8101"}, ...],
//     "ffn":       [{"address": "host3:7100", "metrics": "0.0.0.0:9100"},
//                   {"address": "host4:7100", "threads": 8},
//                   {"address": "gpu1:7100", "device": "cuda"}]
//   }
//
// attention[i] is attention worker i; ffn[j] holds expert shard j/len(ffn); the bundle's
// topology is {len(attention)}A{len(ffn)}F; with "ffn_tp": t, ffn[j] is TP rank j % t of EP
// group j / t (runtime/topology.h). "address" is how peers reach a worker; "listen"
// (default: the address) is what it binds. Per-worker "model", "threads" and (attention)
// "microbatches" override the top-level values; an FFN worker's "device" ("cpu" default |
// "cuda") is where it computes its experts (afd worker --ffn-device), its optional "metrics"
// the host:port of its GET /metrics and /health (afd worker --metrics-listen). Unknown keys are errors (typos would
// otherwise silently change a deployment). Relative model paths are resolved against the
// file's directory by load_topology_file.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace afd {

struct TopologyWorker {
  std::string address;  // host:port peers connect to
  std::string listen;   // host:port to bind (default: address)
  std::string model_dir;
  int threads = 0;       // 0: all cores
  int microbatches = 0;  // attention workers only; 0: the engine's default for xAyF (3)
  std::string device = "cpu";  // FFN workers only: cpu | cuda
  std::string metrics_listen;  // FFN workers only: host:port of GET /metrics and /health ("metrics"); empty: none
};

struct TopologyFrontend {
  std::string listen = "127.0.0.1:8000";
  std::string api_key;
  std::string model_name;
  std::string model_dir;
};

// Attention workers' scheduler and KV limits; -1: not in the file (the worker's default).
struct TopologyScheduler {
  int max_running = -1;
  int max_queue = -1;
  int max_batch_tokens = -1;
  int max_context = -1;
  int max_seqs = -1;
  int kv_capacity = -1;
  int kv_block = -1;
  int step_retry_s = -1;     // afd worker --step-retry-s (whole seconds here)
  int drain_timeout_s = -1;  // afd worker --drain-timeout-s
};

struct TopologyFile {
  std::string precision = "fast";
  std::string kv_dtype = "bf16";
  int ffn_timeout_ms = 10000;
  int ffn_connect_timeout_ms = 60000;
  int ffn_probe_ms = 1000;
  int ffn_takeover_s = -1;  // -1: not given (the flag's default)
  int ffn_parts = 0;        // 0: len(ffn)
  int peer_timeout_ms = 10000;
  int ffn_tp = 1;  // FFN tensor-parallel degree; divides ffn.size()
  int ucx_spin_us = -1;  // -1: the transport's default
  TopologyScheduler scheduler;
  TopologyFrontend frontend;
  std::vector<TopologyWorker> attention;  // index = attention worker index
  std::vector<TopologyWorker> ffn;        // index = expert shard
  // "{x}A{y}F".
  std::string topology() const;
  // "host:port,host:port" of the FFN workers in shard order (what attention workers dial).
  std::string ffn_addresses() const;
};

// Parses the JSON text; `origin` names the file in errors, each of which also names the field
// (e.g. "topology.json: attention[1].address: 'x' is not host:port").
Result<TopologyFile> parse_topology_file(const std::string& json_text, const std::string& origin = "topology file");
// Reads and parses `path`; relative model directories become relative to the file's directory.
Result<TopologyFile> load_topology_file(const std::string& path);
// Splits "host:port" (port 1..65535; host non-empty, IPv6 in [brackets] allowed).
Status split_host_port(const std::string& s, std::string* host, int* port);

}  // namespace afd
