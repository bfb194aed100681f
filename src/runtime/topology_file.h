// TopologyFile: one JSON file that names every process of a multi-process / multi-host AFD
// deployment (docs/DEPLOYMENT.md), so each process is started with the same file and its
// role + index (`afd worker --topology-file F --role ffn|attention --index i`,
// `afd serve --topology-file F`):
//
//   {
//     "model": "/models/qwen3-moe",            // model directory on every host (required
//                                             //   unless every worker names its own)
//     "precision": "fast", "kv_dtype": "bf16", "microbatches": 2, "threads": 0,
//     "deterministic": false,                  // optional; --deterministic
//     "speculative": "mtp", "draft_tokens": 2, // optional; --speculative, --draft-tokens,
//     "ngram_min": 2, "ngram_max": 4,          //   --ngram-min, --ngram-max (attention workers)
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
//
// Every value is named by the flag it stands for ("kv_dtype" is --kv-dtype, "scheduler" holds
// --max-running ...; a worker's "device" is --ffn-device, "metrics" --metrics-listen). The file
// has no defaults of its own: what it leaves out keeps the flag's default, and the settings
// are one layer of the process's configuration (apps/deployment_config.h: topology file, then
// environment mirrors, then flags).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace afd {

// One value the file gives, named by the flag it stands for.
struct TopologySetting {
  std::string key;       // the flag's name without "--", '-' as '_': "max_running" is --max-running
  nlohmann::json value;  // as written (type- and range-checked by the parser)
  std::string where;     // its place in the file: "scheduler.max_running", "attention[1].microbatches"
};

struct TopologyWorker {
  std::string address;  // host:port peers connect to
  std::string listen;   // host:port to bind (default: address)
  std::string model_dir;       // its "model", else the file's
  std::string metrics_listen;  // FFN workers only: "metrics", host:port of GET /metrics and /health; empty: none
  std::vector<TopologySetting> settings;  // its own values: threads, microbatches, ffn_device, metrics_listen
};

struct TopologyFrontend {
  std::string listen;  // "frontend.listen"; empty: not in the file (afd serve's --host / --port)
  std::string api_key;
  std::string model_name;
  std::string model_dir;  // "frontend.model", else the file's "model"
};

struct TopologyFile {
  std::vector<TopologySetting> settings;  // the top level's and "scheduler"'s values, in file order
  TopologyFrontend frontend;
  std::vector<TopologyWorker> attention;  // index = attention worker index
  std::vector<TopologyWorker> ffn;        // index = expert shard
  // "{x}A{y}F".
  std::string topology() const;
  // "host:port,host:port" of the FFN workers in shard order (what attention workers dial).
  std::string ffn_addresses() const;
  // The top-level / "scheduler" setting with this key, or null when the file does not give it.
  const TopologySetting* find(const std::string& key) const;
  // What the file says to the worker (attention or FFN) at `index`, as flag settings in the
  // order to apply them (a later one wins): the file's settings, the worker's own, then what
  // its entry implies: model, topology, listen, attention (x), model_name, and for FFN workers
  // shard "index/y", for attention workers ffn (the FFN addresses) and attention_index.
  // index must be < the role's worker count.
  std::vector<TopologySetting> worker_settings(bool attention, size_t index) const;
  // What the file says to the front end (afd serve --topology-file): host and port (from
  // "frontend.listen"), api_key, model_name, model.
  std::vector<TopologySetting> frontend_settings() const;
};

// Parses the JSON text; `origin` names the file in errors, each of which also names the field
// (e.g. "topology.json: attention[1].address: 'x' is not host:port").
Result<TopologyFile> parse_topology_file(const std::string& json_text, const std::string& origin = "topology file");
// Reads and parses `path`; relative model directories become relative to the file's directory.
Result<TopologyFile> load_topology_file(const std::string& path);
// Splits "host:port" (port 1..65535; host non-empty, IPv6 in [brackets] allowed).
Status split_host_port(const std::string& s, std::string* host, int* port);

}  // namespace afd
