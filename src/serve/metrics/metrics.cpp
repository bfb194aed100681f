#include "serve/metrics/metrics.h"

#include <algorithm>
#include <cstdio>

#include "runtime/speculation_governor.h"

namespace afd::serve {
namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60};
}

}  // namespace

std::string prom_num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void prom_header(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

Histogram::Histogram(std::vector<double> b) : bounds_(std::move(b)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> l(mu_);
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i]++;
  sum_ += v;
  n_++;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> l(mu_);
  return n_;
}

double Histogram::quantile(double q) const {
  std::lock_guard<std::mutex> l(mu_);
  if (n_ == 0) return 0;
  uint64_t target = static_cast<uint64_t>(q * static_cast<double>(n_) + 0.999999);
  uint64_t acc = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    acc += counts_[i];
    if (acc >= target) return i < bounds_.size() ? bounds_[i] : bounds_.back();
  }
  return bounds_.back();
}

void Histogram::render(const std::string& name, std::string* out) const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t acc = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    acc += counts_[i];
    *out += name + "_bucket{le=\"" + prom_num(bounds_[i]) + "\"} " + std::to_string(acc) + "\n";
  }
  acc += counts_.back();
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(acc) + "\n";
  *out += name + "_sum " + prom_num(sum_) + "\n" + name + "_count " + std::to_string(n_) + "\n";
}

Metrics::Metrics(int n_workers) : ttft(latency_buckets()), tpot(latency_buckets()), e2e(latency_buckets()) {
  for (int i = 0; i < n_workers; ++i) workers_.push_back(std::make_unique<WorkerStats>());
}

void Metrics::request_finished(int http_status) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [s, c] : status_counts_)
    if (s == http_status) {
      ++c;
      return;
    }
  status_counts_.push_back({http_status, 1});
}

void Metrics::add_section(std::function<std::string()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  sections_.push_back(std::move(fn));
}

std::string render_numerics_info(const std::string& system_fingerprint, bool deterministic) {
  std::string o;
  prom_header(&o, "afd_numerics_info", "gauge",
              "Numerics identity: the responses' system_fingerprint and whether batch-invariant mode is on.");
  o += "afd_numerics_info{system_fingerprint=\"" + system_fingerprint + "\",deterministic=\"" +
       (deterministic ? "1" : "0") + "\"} 1\n";
  return o;
}

void SpeculativeCounters::record(int64_t drafts, int64_t accepted) {
  verifications.fetch_add(1);
  draft_tokens.fetch_add(drafts);
  accepted_tokens.fetch_add(accepted);
  for (int64_t j = 0; j < drafts && j < kMaxPositions; ++j) drafted_at[j].fetch_add(1);
  for (int64_t j = 0; j < accepted && j < kMaxPositions; ++j) accepted_at[j].fetch_add(1);
}

void SpeculativeCounters::render(std::string* o) const {
  prom_header(o, "afd_spec_decode_verifications_total", "counter",
              "speculative decoding: sequence-steps that verified drafts (each emits accepted + 1 tokens)");
  *o += "afd_spec_decode_verifications_total " + std::to_string(verifications.load()) + "\n";
  prom_header(o, "afd_spec_decode_draft_tokens_total", "counter", "speculative decoding: draft tokens proposed");
  *o += "afd_spec_decode_draft_tokens_total " + std::to_string(draft_tokens.load()) + "\n";
  prom_header(o, "afd_spec_decode_accepted_tokens_total", "counter", "speculative decoding: draft tokens accepted");
  *o += "afd_spec_decode_accepted_tokens_total " + std::to_string(accepted_tokens.load()) + "\n";
  prom_header(o, "afd_spec_decode_draft_tokens_per_pos_total", "counter",
              "speculative decoding: drafts proposed at each draft position (0: the first draft)");
  for (int j = 0; j < kMaxPositions; ++j)
    if (drafted_at[j].load() > 0)
      *o += "afd_spec_decode_draft_tokens_per_pos_total{position=\"" + std::to_string(j) + "\"} " +
            std::to_string(drafted_at[j].load()) + "\n";
  prom_header(o, "afd_spec_decode_accepted_tokens_per_pos_total", "counter",
              "speculative decoding: drafts accepted at each draft position (0: the first draft)");
  for (int j = 0; j < kMaxPositions; ++j)
    if (drafted_at[j].load() > 0)
      *o += "afd_spec_decode_accepted_tokens_per_pos_total{position=\"" + std::to_string(j) + "\"} " +
            std::to_string(accepted_at[j].load()) + "\n";
}

void StructuredCounters::render(std::string* o) const {
  prom_header(o, "afd_structured_requests_total", "counter",
              "structured outputs: requests whose answer a grammar constrains (response_format, guided_*, forced tool calls)");
  *o += "afd_structured_requests_total " + std::to_string(requests.load()) + "\n";
  prom_header(o, "afd_structured_masks_total", "counter", "structured outputs: token masks computed (one per sampled position)");
  *o += "afd_structured_masks_total " + std::to_string(masks.load()) + "\n";
  prom_header(o, "afd_structured_mask_seconds_total", "counter", "structured outputs: time spent computing token masks");
  *o += "afd_structured_mask_seconds_total " + std::to_string(static_cast<double>(mask_ns.load()) * 1e-9) + "\n";
}

void Metrics::render_speculation_auto(std::string* o) const {
  std::string side, rate;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerStats& w = *workers_[i];
    if (!w.spec_auto.load()) continue;
    for (int b = 0; b < WorkerStats::kSpecBuckets; ++b) {
      const std::string l = "worker=\"" + std::to_string(i) + "\",batch=\"" + SpeculationGovernor::bucket_name(b) + "\"";
      side += "afd_spec_decode_auto_drafts{" + l + "} " + std::to_string(w.spec_side[b].load()) + "\n";
      rate += "afd_spec_decode_auto_tokens_per_second{" + l + ",drafts=\"on\"} " + prom_num(w.spec_rate_on[b].load()) + "\n";
      rate += "afd_spec_decode_auto_tokens_per_second{" + l + ",drafts=\"off\"} " + prom_num(w.spec_rate_off[b].load()) + "\n";
    }
  }
  if (side.empty()) return;
  prom_header(o, "afd_spec_decode_auto_drafts", "gauge",
              "--speculative-max-batch auto: per batch-size bucket, the side decode steps run (1 drafts, -1 none, 0 warming up)");
  *o += side;
  prom_header(o, "afd_spec_decode_auto_tokens_per_second", "gauge",
              "--speculative-max-batch auto: per batch-size bucket, tokens per second of decode steps with and without drafts");
  *o += rate;
}

std::string Metrics::render() const {
  std::string o;
  prom_header(&o, "afd_requests_total", "counter", "HTTP API requests by status code");
  {
    std::lock_guard<std::mutex> l(mu_);
    auto sc = status_counts_;
    std::sort(sc.begin(), sc.end());
    for (auto& [s, c] : sc) o += "afd_requests_total{code=\"" + std::to_string(s) + "\"} " + std::to_string(c) + "\n";
  }
  prom_header(&o, "afd_requests_rejected_total", "counter", "requests refused for capacity (429/503)");
  o += "afd_requests_rejected_total " + std::to_string(requests_rejected.load()) + "\n";
  prom_header(&o, "afd_requests_cancelled_total", "counter", "requests cancelled by client disconnect");
  o += "afd_requests_cancelled_total " + std::to_string(requests_cancelled.load()) + "\n";
  prom_header(&o, "afd_prompt_tokens_total", "counter", "prompt tokens admitted");
  o += "afd_prompt_tokens_total " + std::to_string(prompt_tokens.load()) + "\n";
  prom_header(&o, "afd_prefix_cache_queries_total", "counter",
         "tokens looked up in the prefix cache at admission (prompt, + generated after preemption)");
  o += "afd_prefix_cache_queries_total " + std::to_string(prefix_cache_queries.load()) + "\n";
  prom_header(&o, "afd_prefix_cache_hits_total", "counter", "of the queried tokens, those whose KV was reused from the cache");
  o += "afd_prefix_cache_hits_total " + std::to_string(prefix_cache_hits.load()) + "\n";
  prom_header(&o, "afd_prefill_tokens_computed_total", "counter",
         "tokens forwarded in prefill (prompt chunks and recomputes; prefix-cache hits excluded)");
  o += "afd_prefill_tokens_computed_total " + std::to_string(prefill_tokens.load()) + "\n";
  prom_header(&o, "afd_generation_tokens_total", "counter", "tokens generated");
  o += "afd_generation_tokens_total " + std::to_string(generation_tokens.load()) + "\n";
  speculative.render(&o);
  structured.render(&o);
  prom_header(&o, "afd_time_to_first_token_seconds", "histogram", "arrival to first generated token");
  ttft.render("afd_time_to_first_token_seconds", &o);
  prom_header(&o, "afd_time_per_output_token_seconds", "histogram", "mean inter-token time of a request after its first token");
  tpot.render("afd_time_per_output_token_seconds", &o);
  prom_header(&o, "afd_request_latency_seconds", "histogram", "arrival to last token");
  e2e.render("afd_request_latency_seconds", &o);

  struct G {
    const char* name;
    const char* type;
    const char* help;
  };
  auto per_worker = [&](const G& g, auto get) {
    prom_header(&o, g.name, g.type, g.help);
    for (size_t i = 0; i < workers_.size(); ++i)
      o += std::string(g.name) + "{worker=\"" + std::to_string(i) + "\"} " + prom_num(get(*workers_[i])) + "\n";
  };
  per_worker({"afd_queue_depth", "gauge", "requests waiting for admission"},
             [](WorkerStats& w) { return static_cast<double>(w.queue_depth.load()); });
  per_worker({"afd_running_requests", "gauge", "sequences in the running batch"},
             [](WorkerStats& w) { return static_cast<double>(w.running.load()); });
  per_worker({"afd_token_load", "gauge", "KV tokens of running sequences plus queued prompt tokens"},
             [](WorkerStats& w) { return static_cast<double>(w.token_load.load()); });
  per_worker({"afd_kv_blocks_used", "gauge", "KV cache blocks in use"},
             [](WorkerStats& w) { return static_cast<double>(w.kv_blocks_used.load()); });
  per_worker({"afd_kv_blocks_total", "gauge", "KV cache blocks in total"},
             [](WorkerStats& w) { return static_cast<double>(w.kv_blocks_total.load()); });
  per_worker({"afd_kv_usage_ratio", "gauge", "fraction of KV cache blocks in use"}, [](WorkerStats& w) {
    int64_t t = w.kv_blocks_total.load();
    return t > 0 ? static_cast<double>(w.kv_blocks_used.load()) / static_cast<double>(t) : 0.0;
  });
  per_worker({"afd_engine_steps_total", "counter", "engine forward passes"},
             [](WorkerStats& w) { return static_cast<double>(w.steps.load()); });
  per_worker({"afd_preemptions_total", "counter", "sequences preempted (KV recomputed later) for lack of KV blocks"},
             [](WorkerStats& w) { return static_cast<double>(w.preemptions.load()); });
  per_worker({"afd_step_retries_total", "counter",
              "forward passes run again after failing on a lost or stalled FFN worker (requests kept)"},
             [](WorkerStats& w) { return static_cast<double>(w.step_retries.load()); });

  render_speculation_auto(&o);

  std::string stage, layer_stage, idle, stage_idle;
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerStats& w = *workers_[i];
    std::lock_guard<std::mutex> l(w.mu);
    const std::string wl = "worker=\"" + std::to_string(i) + "\"";
    const StageTimes& s = w.stage_sum;
    const std::pair<const char*, double> st[] = {
        {"attention", s.attention_s}, {"a2f", s.a2f_s}, {"ffn", s.ffn_s}, {"f2a", s.f2a_s}, {"total", s.total_s}};
    for (auto& [name, v] : st) stage += "afd_stage_seconds_total{" + wl + ",stage=\"" + name + "\"} " + prom_num(v) + "\n";
    for (size_t l = 0; l < s.layers.size(); ++l) {
      const LayerStageTimes& ls = s.layers[l];
      const std::pair<const char*, double> lst[] = {
          {"attention", ls.attention_s}, {"a2f", ls.a2f_s}, {"ffn", ls.ffn_s}, {"f2a", ls.f2a_s}};
      for (auto& [name, v] : lst)
        layer_stage += "afd_layer_stage_seconds_total{" + wl + ",layer=\"" + std::to_string(l) + "\",stage=\"" + name +
                       "\"} " + prom_num(v) + "\n";
    }
    double wall = w.busy_s + w.idle_s;
    idle += "afd_worker_idle_ratio{" + wl + "} " + prom_num(wall > 0 ? w.idle_s / wall : 0.0) + "\n";
    if (s.total_s > 0) {
      stage_idle += "afd_stage_idle_ratio{" + wl + ",side=\"attention\"} " +
                    prom_num(std::max(0.0, 1.0 - s.attention_s / s.total_s)) + "\n";
      stage_idle += "afd_stage_idle_ratio{" + wl + ",side=\"ffn\"} " + prom_num(std::max(0.0, 1.0 - s.ffn_s / s.total_s)) + "\n";
    }
  }
  prom_header(&o, "afd_stage_seconds_total", "counter", "accumulated per-stage pipeline time reported by the engine");
  o += stage;
  prom_header(&o, "afd_layer_stage_seconds_total", "counter",
         "accumulated per-layer stage time: attention, a2f (A->F post), ffn (FFN compute), f2a (waiting for F->A)");
  o += layer_stage;
  prom_header(&o, "afd_worker_idle_ratio", "gauge", "fraction of wall time the worker's step loop waited for work");
  o += idle;
  prom_header(&o, "afd_stage_idle_ratio", "gauge",
         "1 - stage time / step time, for the attention and FFN sides, over all steps so far");
  o += stage_idle;
  std::vector<std::function<std::string()>> sections;
  {
    std::lock_guard<std::mutex> l(mu_);
    sections = sections_;
  }
  for (const auto& fn : sections) o += fn();
  return o;
}

}  // namespace afd::serve
