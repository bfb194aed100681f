#include "runtime/bundle.h"

#include <algorithm>
#include <cstdio>

#include "comm/fault_transport.h"
#include "comm/inproc_transport.h"
#include "comm/protocol.h"
#include "comm/ucx_transport.h"
#include "core/log.h"
#include "core/memory_info.h"
#include "core/timer.h"
#include "model/weights.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/pipeline_engine.h"

namespace afd {

namespace {
std::string ffn_name(int j) { return "ffn" + std::to_string(j); }
std::string attn_name(int i) { return "attn" + std::to_string(i); }

// An in-process bundle holds every (attention, FFN) pair's wire buffers at both ends: per
// micro-batch, a dispatch and a combine frame of up to max_batch_tokens tokens each in the
// FfnClient and in the FfnWorker. A topology whose buffers the machine cannot hold is
// refused here rather than killed by the kernel part-way through allocating them.
Status check_wire_memory(const EngineOptions& opt, const Topology& topo, const ModelConfig& c) {
  const comm::ScaleGranularity g = opt.afd.fp8_group == 128 ? comm::ScaleGranularity::per_block : comm::ScaleGranularity::per_token;
  AFD_ASSIGN_OR_RETURN(comm::A2fLayout lay, comm::a2f_layout(opt.afd.max_batch_tokens, c.hidden_size, c.n_experts_per_tok, g));
  const double per_frame_pair = static_cast<double>(2 * comm::kFrameHeaderBytes + lay.total +
                                                    comm::f2a_payload_bytes(opt.afd.max_batch_tokens, c.hidden_size));
  const double need = per_frame_pair * 2 * topo.n_attention * topo.n_ffn * opt.pipeline_microbatches();
  const int64_t avail = available_memory_bytes();
  if (avail > 0 && need > 0.8 * static_cast<double>(avail)) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "topology %s in one process needs %.1f GiB of wire buffers (%d x %d worker pairs x %d micro-batch(es) "
                  "x a dispatch and a combine frame of up to %lld tokens, at both ends), more than this machine can "
                  "spare (%.1f GiB available): use fewer workers, fewer micro-batches, a smaller --max-batch-tokens, "
                  "or worker processes",
                  topo.to_string().c_str(), need / (1 << 30), topo.n_attention, topo.n_ffn, opt.pipeline_microbatches(),
                  static_cast<long long>(opt.afd.max_batch_tokens), static_cast<double>(avail) / (1 << 30));
    return resource_exhausted(msg);
  }
  return Status();
}

std::unique_ptr<comm::Transport> with_delay(std::unique_ptr<comm::Transport> t, int64_t delay_us) {
  if (delay_us <= 0) return t;
  auto f = std::make_unique<comm::FaultTransport>(std::move(t));
  f->set_delay_ns(delay_us * 1000);
  return f;
}
}  // namespace

std::vector<FfnClient*> Bundle::ffn_clients() const { return clients_; }

Status Bundle::fail_ffn_worker(int j, const std::string& why) {
  if (ffn_.empty()) return invalid_argument("this bundle's FFN workers are remote processes");
  if (j < 0 || j >= static_cast<int>(ffn_.size())) return invalid_argument("no local FFN worker " + std::to_string(j));
  spdlog::error("bundle: FFN worker {} fails: {}", j, why);
  ffn_stop_[static_cast<size_t>(j)].store(true);
  if (ffn_threads_[static_cast<size_t>(j)].joinable()) ffn_threads_[static_cast<size_t>(j)].join();
  transports_[static_cast<size_t>(j)]->close();  // the attention engines see the loss
  return Status();
}

std::vector<const FfnWorkerStats*> Bundle::ffn_stats() const {
  std::vector<const FfnWorkerStats*> out;
  for (const auto& f : ffn_) out.push_back(&f->stats());
  return out;
}

Result<std::unique_ptr<Bundle>> Bundle::create(const EngineOptions& opt, std::shared_ptr<const ModelWeights> w) {
  std::unique_ptr<Bundle> b(new Bundle());
  b->topo_ = opt.topology;
  b->topo_.ffn_tp = opt.afd.ffn_tp;
  const Topology& topo = b->topo_;
  const bool remote = !opt.afd.ffn_addresses.empty();
  b->first_attention_index_ = remote ? opt.afd.attention_index : 0;
  const bool ref = opt.precision == Precision::reference;
  const int x = topo.n_attention, y = topo.n_ffn;
  // Threads: in EP each worker's FFN shares its attention engine's cores (one pool per
  // worker); in AFD the two sides have their own pools.
  std::vector<std::shared_ptr<ThreadPool>> attn_pools;
  const int local_attn = remote ? std::max(1, std::min(opt.afd.local_attention, x - opt.afd.attention_index)) : x;
  // Default threads: every pool gets all cores and the OS shares them: a side that waits
  // sleeps and leaves its cores to the other, which a fixed split of the cores between the
  // attention and FFN pools cannot do. (--threads overrides.)
  const int threads = opt.n_threads;
  for (int i = 0; i < local_attn; ++i) attn_pools.push_back(std::make_shared<ThreadPool>(threads));

  std::shared_ptr<comm::InprocHub> hub;
  if (!remote) {
    AFD_RETURN_IF_ERROR(check_wire_memory(opt, topo, w->config));
    hub = std::make_shared<comm::InprocHub>();
    std::shared_ptr<StageCostEmulation> emulation;
    if (!opt.emulation.stage_costs_file.empty()) {
      AFD_ASSIGN_OR_RETURN(emulation, StageCostEmulation::open(opt.emulation.stage_costs_file));
    }
    for (int j = 0; j < y; ++j) {
      AFD_ASSIGN_OR_RETURN(auto it, comm::InprocTransport::create(hub, ffn_name(j)));
      std::unique_ptr<comm::Transport> t = with_delay(std::move(it), opt.emulation.inject_delay_us);
      AFD_RETURN_IF_ERROR(t->listen(ffn_name(j)));
      FfnWorkerOptions fo;
      fo.index = j;
      fo.n_ffn = y;
      fo.n_attention = x;
      fo.prec = ref ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
      fo.batch_invariant = opt.batch_invariant();
      fo.peer_timeout_ms = opt.afd.ffn_timeout_ms;
      fo.tp = opt.afd.ffn_tp;
      fo.device = opt.ffn_device;
      fo.emulation = emulation;
      if (opt.observability.trace) trace_ffn_batches(opt.observability.trace, &fo);
      ThreadPool* pool;
      if (topo.wiring == Wiring::ep) {
        pool = attn_pools[j].get();
      } else {
        b->ffn_pools_.push_back(std::make_unique<ThreadPool>(threads));
        pool = b->ffn_pools_.back().get();
      }
      AFD_ASSIGN_OR_RETURN(auto worker, FfnWorker::create(w, t.get(), fo, pool));
      b->transports_.push_back(std::move(t));
      b->ffn_.push_back(std::move(worker));
    }
    b->ffn_stop_ = std::make_unique<std::atomic<bool>[]>(b->ffn_.size());
    for (int j = 0; j < y; ++j) {
      FfnWorker* wk = b->ffn_[j].get();
      comm::Transport* t = b->transports_[static_cast<size_t>(j)].get();
      std::atomic<bool>* stop = &b->ffn_stop_[static_cast<size_t>(j)];
      b->ffn_threads_.emplace_back([wk, stop, t, j] {
        // A worker that fails (an error, or an exception from an internal check) ends alone:
        // its transport closes, so the attention engines see a lost FFN worker (retry,
        // takeover), and the process goes on.
        Status s;
        try {
          s = wk->run(stop);
        } catch (const std::exception& e) {
          s = internal_error(e.what());
        }
        if (!s.is_ok()) {
          spdlog::error("ffn worker {} stopped: {}", j, s.to_string());
          t->close();
        }
      });
    }
  }

  for (int i = 0; i < local_attn; ++i) {
    const int index = remote ? opt.afd.attention_index + i : i;
    std::unique_ptr<comm::Transport> t;
    FfnClientOptions co;
    co.index = index;
    co.n_attention = x;
    co.ffn_names.clear();
    for (int j = 0; j < y; ++j) co.ffn_names.push_back(ffn_name(j));
    if (remote) {
      comm::UcxOptions uo;
      uo.name = attn_name(index);
      uo.set_waiter_spin_us(opt.afd.ucx_spin_us);
      AFD_ASSIGN_OR_RETURN(auto ut, comm::UcxTransport::create(uo));
      t = std::move(ut);
      co.ffn_addresses = opt.afd.ffn_addresses;
    } else {
      AFD_ASSIGN_OR_RETURN(auto it, comm::InprocTransport::create(hub, attn_name(index)));
      t = std::move(it);
      for (int j = 0; j < y; ++j) co.ffn_addresses.push_back(ffn_name(j));
    }
    co.precision = ref ? comm::WirePrecision::f32 : comm::WirePrecision::bf16;
    co.batch_invariant = opt.batch_invariant();
    co.microbatches = opt.pipeline_microbatches();
    co.max_tokens = opt.afd.max_batch_tokens;
    co.per_block_scales = opt.afd.fp8_group == 128;
    co.timeout_ms = opt.afd.ffn_timeout_ms;
    co.connect_timeout_ms = opt.afd.ffn_connect_timeout_ms;
    co.probe_interval_ms = opt.afd.ffn_probe_ms;
    co.expect_tp = opt.afd.ffn_tp > 1 || !remote ? opt.afd.ffn_tp : 0;  // remote, default 1: accept what the workers announce
    co.takeover_ms = opt.afd.ffn_takeover_ms;
    co.parts = opt.afd.ffn_parts;
    co.expert_placement = opt.afd.eplb;
    co.eplb_interval_s = opt.afd.eplb_interval_s;
    co.eplb_redundant = opt.afd.eplb_redundant;
    t = with_delay(std::move(t), opt.emulation.inject_delay_us);
    AFD_ASSIGN_OR_RETURN(auto client, FfnClient::create(w, t.get(), co));
    b->clients_.push_back(client.get());  // owned by the engine below
    b->transports_.push_back(std::move(t));
    EngineOptions eo = opt;
    eo.afd.attention_index = index;
    AFD_ASSIGN_OR_RETURN(auto e, make_pipeline_engine(eo, w, std::move(client), attn_pools[i]));
    b->attention_.push_back(std::move(e));
  }
  spdlog::info("bundle {} complete: {} attention engine(s) here, {} FFN worker(s) {}{}", topo.to_string(), local_attn, y,
               remote ? "remote" : "in-process",
               opt.afd.ffn_tp > 1 ? " (FFN TP degree " + std::to_string(opt.afd.ffn_tp) + ")" : std::string());
  return b;
}

Bundle::~Bundle() {
  attention_.clear();  // FfnClients close their sessions before the workers stop
  clients_.clear();
  for (size_t j = 0; j < ffn_threads_.size(); ++j) ffn_stop_[j].store(true);
  for (auto& t : ffn_threads_) {
    if (t.joinable()) t.join();
  }
  ffn_.clear();
  for (auto& t : transports_) t->close();
}

DataParallelEngine::DataParallelEngine(std::unique_ptr<Bundle> bundle) : bundle_(std::move(bundle)) {}
DataParallelEngine::~DataParallelEngine() = default;

const DataParallelEngine::Placement* DataParallelEngine::find(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

Result<int64_t> DataParallelEngine::create_sequence() {
  // Least token load first (KV blocks in use), then fewest sequences.
  const auto& es = engines();
  std::vector<int> order(es.size());
  for (size_t i = 0; i < es.size(); ++i) order[i] = static_cast<int>(i);
  live_.resize(es.size(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const int64_t ua = es[a]->kv_usage().blocks_used, ub = es[b]->kv_usage().blocks_used;
    return ua != ub ? ua < ub : live_[a] < live_[b];
  });
  Status last;
  for (int i : order) {
    auto id = es[i]->create_sequence();
    if (id.ok()) {
      const int64_t outer = next_id_++;
      seqs_[outer] = Placement{i, *id};
      ++live_[i];
      return outer;
    }
    last = id.status();
  }
  return last;
}

void DataParallelEngine::release_sequence(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  engines()[it->second.engine]->release_sequence(it->second.inner);
  --live_[it->second.engine];
  seqs_.erase(it);
}

int64_t DataParallelEngine::sequence_length(int64_t seq_id) const {
  const Placement* p = find(seq_id);
  return p ? engines()[p->engine]->sequence_length(p->inner) : -1;
}

bool DataParallelEngine::can_append(int64_t seq_id, int64_t n_tokens) const {
  const Placement* p = find(seq_id);
  return p && engines()[p->engine]->can_append(p->inner, n_tokens);
}

// A new sequence: what the engine it would be placed on asks (every engine has the same block
// size, so any engine's count is that one's).
int64_t DataParallelEngine::kv_blocks_needed(int64_t seq_id, int64_t n_tokens) const {
  if (seq_id == kNewSequence) return engines()[0]->kv_blocks_needed(kNewSequence, n_tokens);
  const Placement* p = find(seq_id);
  return p ? engines()[p->engine]->kv_blocks_needed(p->inner, n_tokens) : -1;
}

int DataParallelEngine::kv_pool(int64_t seq_id) const {
  const Placement* p = find(seq_id);
  return p ? p->engine : -1;
}

KvUsage DataParallelEngine::kv_pool_usage(int pool) const {
  const auto& es = engines();
  return pool >= 0 && pool < static_cast<int>(es.size()) ? es[static_cast<size_t>(pool)]->kv_usage() : KvUsage{};
}

int64_t DataParallelEngine::reuse_prefix(int64_t seq_id, std::span<const int32_t> prompt) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return 0;
  Placement& p = it->second;
  const auto& es = engines();
  if (es[p.engine]->sequence_length(p.inner) == 0) {
    int best = p.engine;
    int64_t best_len = es[p.engine]->cached_prefix(prompt);
    for (int i = 0; i < static_cast<int>(es.size()); ++i) {
      const int64_t n = i == p.engine ? 0 : es[i]->cached_prefix(prompt);
      if (n > best_len) best = i, best_len = n;
    }
    if (best != p.engine) {
      auto moved = es[best]->create_sequence();
      if (moved.ok()) {  // else: no slot there; stay where the load placed it
        es[p.engine]->release_sequence(p.inner);
        --live_[p.engine];
        ++live_[best];
        p = Placement{best, *moved};
      }
    }
  }
  return es[p.engine]->reuse_prefix(p.inner, prompt);
}

int64_t DataParallelEngine::cached_prefix(std::span<const int32_t> prompt) const {
  int64_t best = 0;
  for (const auto& e : engines()) best = std::max(best, e->cached_prefix(prompt));
  return best;
}

Status DataParallelEngine::fill_synthetic_context(int64_t seq_id, int64_t n_tokens) {
  const Placement* p = find(seq_id);
  if (!p) return invalid_argument("unknown sequence " + std::to_string(seq_id));
  BenchmarkHooks* h = engines()[p->engine]->benchmark_hooks();
  if (h == nullptr) return not_supported("the attention engine cannot fill a synthetic context");
  return h->fill_synthetic_context(p->inner, n_tokens);
}

Status DataParallelEngine::settle_drafts(int64_t seq_id, int64_t n_accepted) {
  const Placement* p = find(seq_id);
  if (!p) return invalid_argument("unknown sequence " + std::to_string(seq_id));
  return engines()[p->engine]->settle_drafts(p->inner, n_accepted);
}

Status DataParallelEngine::health() const {
  for (const auto& e : engines()) AFD_RETURN_IF_ERROR(e->health());
  return Status();
}

int64_t DataParallelEngine::last_expert_reads() const {
  int64_t n = 0;
  for (const auto& e : engines())
    if (const BenchmarkHooks* h = e->benchmark_hooks()) n += h->last_expert_reads();
  return n;
}

KvUsage DataParallelEngine::kv_usage() const {
  KvUsage u;
  for (const auto& e : engines()) {
    KvUsage k = e->kv_usage();
    u.blocks_total += k.blocks_total;
    u.blocks_used += k.blocks_used;
    u.block_size = k.block_size;
  }
  return u;
}

Status DataParallelEngine::forward_with_hidden(std::span<const BatchItem> items, std::vector<float>* logits,
                                               std::vector<float>* hidden) {
  const int64_t t0 = now_ns();
  const auto& es = engines();
  const int n_eng = static_cast<int>(es.size());
  std::vector<std::vector<BatchItem>> per(n_eng);
  std::vector<std::vector<size_t>> which(n_eng);
  for (size_t k = 0; k < items.size(); ++k) {
    const Placement* p = find(items[k].seq_id);
    if (!p) return invalid_argument("unknown sequence " + std::to_string(items[k].seq_id));
    BatchItem it = items[k];
    it.seq_id = p->inner;
    per[p->engine].push_back(it);
    which[p->engine].push_back(k);
  }
  last_tokens_.assign(static_cast<size_t>(n_eng), 0);
  for (int e = 0; e < n_eng; ++e)
    for (const BatchItem& it : per[e]) last_tokens_[static_cast<size_t>(e)] += static_cast<int64_t>(it.tokens.size());
  int64_t ffn_busy0 = 0;
  for (const FfnWorkerStats* s : bundle_->ffn_stats()) ffn_busy0 += s->ffn_ns.load();
  std::vector<std::vector<float>> out(n_eng), out_hidden(n_eng);
  std::vector<Status> st(n_eng);
  std::vector<std::thread> threads;
  for (int e = 0; e < n_eng; ++e) {
    if (per[e].empty()) continue;
    threads.emplace_back([&, e] {
      // An internal check failing in one engine fails the pass, not the process.
      try {
        st[e] = es[e]->forward_with_hidden(per[e], &out[e], hidden ? &out_hidden[e] : nullptr);
      } catch (const std::exception& ex) {
        st[e] = internal_error(std::string("attention engine failed: ") + ex.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int e = 0; e < n_eng; ++e)
    if (!st[e].is_ok()) return st[e].with_context("attention worker " + std::to_string(bundle_->first_attention_index() + e));
  // Reassemble rows in item order.
  const int64_t V = config().vocab_size;
  std::vector<int64_t> rows(items.size());
  for (size_t k = 0; k < items.size(); ++k)
    rows[k] = items[k].all_logits ? static_cast<int64_t>(items[k].tokens.size()) : 1;
  std::vector<int64_t> off(items.size() + 1, 0);
  for (size_t k = 0; k < items.size(); ++k) off[k + 1] = off[k] + rows[k];
  const int64_t H = config().hidden_size;
  logits->resize(static_cast<size_t>(off.back() * V));
  if (hidden) hidden->resize(static_cast<size_t>(off.back() * H));
  times_ = StageTimes{};
  for (int e = 0; e < n_eng; ++e) {
    int64_t src = 0;
    for (size_t m = 0; m < which[e].size(); ++m) {
      const size_t k = which[e][m];
      std::copy(out[e].begin() + src * V, out[e].begin() + (src + rows[k]) * V, logits->begin() + off[k] * V);
      if (hidden)
        std::copy(out_hidden[e].begin() + src * H, out_hidden[e].begin() + (src + rows[k]) * H,
                  hidden->begin() + off[k] * H);
      src += rows[k];
    }
    if (!per[e].empty()) {
      // Mean over attention instances (idle ones count 0), as in the A/F ratio paper, eq. (23).
      StageTimes s = es[e]->last_stage_times();
      times_.attention_s += s.attention_s / n_eng;
      times_.a2f_s += s.a2f_s / n_eng;
      times_.ffn_s += s.ffn_s / n_eng;
      times_.f2a_s += s.f2a_s / n_eng;
      if (times_.layers.size() < s.layers.size()) times_.layers.resize(s.layers.size());
      for (size_t l = 0; l < s.layers.size(); ++l) times_.layers[l].add(s.layers[l], 1.0 / n_eng);
    }
  }
  times_.total_s = (now_ns() - t0) * 1e-9;
  // FFN busy time of in-process FFN workers: the mean over them of their ffn_part time in
  // this pass (exact, rather than the per-reply figures the engines saw, which remote
  // workers are limited to).
  const auto stats = bundle_->ffn_stats();
  if (!stats.empty()) {
    int64_t busy = -ffn_busy0;
    for (const FfnWorkerStats* s : stats) busy += s->ffn_ns.load();
    times_.ffn_s = busy * 1e-9 / static_cast<double>(stats.size());
  }
  return Status();
}

}  // namespace afd
