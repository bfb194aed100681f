#include "runtime/ffn_client.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/cpu/ops.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace afd {

using namespace comm;

namespace {

int64_t deadline_in_ms(int64_t ms) { return now_ns() + ms * 1000000; }

struct Hasher {
  uint64_t h = 0x736f6d6570736575ull;
  template <class T>
  void add(const T& v) { h = hash64(&v, sizeof v, h); }
  void add_str(const std::string& s) { h = hash64(s.data(), s.size(), h ^ s.size()); }
  void add_matrix(int64_t path, const Matrix& m) {
    add(path);
    add(static_cast<uint8_t>(m.dtype));
    add(m.rows);
    add(m.cols);
  }
};

void add_config(Hasher& h, const ModelConfig& c) {
  h.add(static_cast<int>(c.arch));
  for (int64_t v : {c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.n_experts,
                    c.n_experts_per_tok, c.moe_intermediate_size, c.intermediate_size,
                    c.shared_expert_intermediate_size, c.decoder_sparse_step}) {
    h.add(v);
  }
  for (int64_t v : c.mlp_only_layers) h.add(v);
  h.add(c.norm_topk_prob);
  h.add(c.tie_word_embeddings);
  h.add(c.rope_theta);
  h.add(c.rms_norm_eps);
}

}  // namespace

uint64_t model_config_fingerprint(const ModelConfig& c) {
  Hasher h;
  add_config(h, c);
  return h.h;
}

uint64_t model_fingerprint(const ModelWeights& w) {
  Hasher h;
  add_config(h, w.config);
  // Matrix "paths": layer * 2^20 + part code (+ expert index); stable across processes.
  int64_t path = 0;
  h.add_matrix(path++, w.embed);
  h.add_matrix(path++, w.lm_head);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    int64_t base = static_cast<int64_t>(l + 1) << 20;
    h.add_matrix(base + 1, L.attn.q);
    h.add_matrix(base + 2, L.attn.k);
    h.add_matrix(base + 3, L.attn.v);
    h.add_matrix(base + 4, L.attn.o);
    h.add(L.is_moe);
    if (L.is_moe) {
      h.add_matrix(base + 5, L.moe.router);
      for (size_t e = 0; e < L.moe.experts.size(); ++e) {
        int64_t eb = base + 16 + static_cast<int64_t>(e) * 4;
        h.add_matrix(eb, L.moe.experts[e].gate);
        h.add_matrix(eb + 1, L.moe.experts[e].up);
        h.add_matrix(eb + 2, L.moe.experts[e].down);
      }
      h.add_matrix(base + 6, L.moe.shared.gate);
      h.add_matrix(base + 7, L.moe.shared.up);
      h.add_matrix(base + 8, L.moe.shared.down);
      h.add_matrix(base + 9, L.moe.shared_gate);
    } else {
      h.add_matrix(base + 10, L.dense.gate);
      h.add_matrix(base + 11, L.dense.up);
      h.add_matrix(base + 12, L.dense.down);
    }
  }
  // A sample of the values: 16 bytes from the middle of every tensor of the checkpoint (by
  // name, in name order), as stored on disk — so two sides that convert weights differently
  // still agree, while two checkpoints of one architecture (another seed, another fine-tune)
  // do not. One page per tensor is read (the processes map them anyway).
  if (w.checkpoint) {
    for (const std::string& name : w.checkpoint->tensor_names()) {
      const TensorRef* t = w.checkpoint->find(name);
      if (t == nullptr || t->info == nullptr || t->data == nullptr) continue;
      const size_t n = t->info->nbytes(), take = std::min<size_t>(n, 16);
      h.add_str(name);
      h.h = hash64(t->data + (n - take) / 2, take, h.h);
    }
  }
  return h.h;
}

FfnClient::FfnClient(std::shared_ptr<const ModelWeights> w, Transport* t, FfnClientOptions opt)
    : w_(std::move(w)), t_(t), opt_(std::move(opt)) {}

FfnClient::~FfnClient() {
  stop_probes();
  for (size_t mb = 0; mb < slots_.size(); ++mb) abandon(static_cast<int>(mb));
}

Handshake FfnClient::my_handshake() const {
  const ModelConfig& c = w_->config;
  Handshake h;
  h.fingerprint = fingerprint_;
  h.role = Role::attention;
  h.index = static_cast<uint16_t>(opt_.index);
  h.n_attention = static_cast<uint16_t>(opt_.n_attention);
  h.n_ffn = static_cast<uint16_t>(workers_.size());
  h.n_layers = static_cast<uint32_t>(c.n_layers);
  h.n_experts = static_cast<uint32_t>(c.n_experts);
  h.hidden = static_cast<uint32_t>(c.hidden_size);
  h.top_k = static_cast<uint32_t>(c.n_experts_per_tok);
  h.max_tokens = static_cast<uint32_t>(opt_.max_tokens);
  h.n_microbatches = static_cast<uint16_t>(opt_.microbatches);
  h.granularity = opt_.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  h.tp_rank = 0;
  h.tp_degree = static_cast<uint16_t>(opt_.expect_tp);
  return h;
}

Result<std::unique_ptr<FfnClient>> FfnClient::create(std::shared_ptr<const ModelWeights> w, Transport* transport,
                                                     FfnClientOptions opt) {
  if (!w || transport == nullptr) return invalid_argument("ffn client: no model or no transport");
  const ModelConfig& c = w->config;
  if (opt.ffn_names.empty() || opt.ffn_names.size() > 64) return invalid_argument("ffn client: need 1..64 FFN workers");
  if (!opt.ffn_addresses.empty() && opt.ffn_addresses.size() != opt.ffn_names.size()) {
    return invalid_argument("ffn client: " + std::to_string(opt.ffn_addresses.size()) + " addresses for " +
                            std::to_string(opt.ffn_names.size()) + " FFN workers");
  }
  if (opt.microbatches < 1 || opt.microbatches > 16) return invalid_argument("ffn client: micro-batches must be 1..16");
  if (opt.n_attention < 1 || opt.index < 0 || opt.index >= opt.n_attention) {
    return invalid_argument("ffn client: attention index " + std::to_string(opt.index) + " outside [0, " +
                            std::to_string(opt.n_attention) + ")");
  }
  if (opt.max_tokens < 1 || opt.max_tokens > (1 << 20)) return invalid_argument("ffn client: max_tokens must be 1..2^20");
  if (opt.expect_tp < 0 || opt.expect_tp > 64) return invalid_argument("ffn client: expected FFN TP degree must be 0..64");
  if (opt.probe_interval_ms < 0) return invalid_argument("ffn client: probe interval must be >= 0 (0: no probes)");
  ScaleGranularity g = opt.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  AFD_ASSIGN_OR_RETURN(A2fLayout lay, a2f_layout(opt.max_tokens, c.hidden_size, c.n_experts_per_tok, g));

  std::unique_ptr<FfnClient> cl(new FfnClient(w, transport, opt));
  cl->fingerprint_ = model_fingerprint(*w);
  for (const auto& n : opt.ffn_names) {
    Worker wk;
    wk.name = n;
    cl->workers_.push_back(std::move(wk));
  }
  cl->slots_.resize(static_cast<size_t>(opt.microbatches));
  for (auto& per_mb : cl->slots_) {
    per_mb.resize(opt.ffn_names.size());
    for (auto& s : per_mb) {
      AFD_ASSIGN_OR_RETURN(s.send, FrameBuffer::create(transport, kFrameHeaderBytes + lay.total));
      AFD_ASSIGN_OR_RETURN(s.recv, FrameBuffer::create(transport, kFrameHeaderBytes +
                                                                      f2a_payload_bytes(opt.max_tokens, c.hidden_size)));
    }
  }
  cl->probes_ = std::make_unique<Probe[]>(opt.ffn_names.size());
  for (size_t j = 0; j < opt.ffn_names.size(); ++j) {
    AFD_ASSIGN_OR_RETURN(cl->probes_[j].ping, FrameBuffer::create(transport, kFrameHeaderBytes));
    AFD_ASSIGN_OR_RETURN(cl->probes_[j].pong, FrameBuffer::create(transport, kFrameHeaderBytes));
    cl->probes_[j].next_ns = deadline_in_ms(opt.probe_interval_ms);
  }
  AFD_RETURN_IF_ERROR(cl->connect_all());
  if (opt.probe_interval_ms > 0) cl->prober_ = std::thread([c = cl.get()] { c->probe_loop(); });
  return cl;
}

void FfnClient::probe_loop() {
  std::unique_lock<std::mutex> lk(probe_mu_);
  while (!probe_stop_) {
    lk.unlock();
    const bool awaiting = probe_pass(now_ns());
    lk.lock();
    // A pong is polled for every 5 ms (its arrival time does not matter, only its absence);
    // otherwise the next due ping is at most a quarter interval late.
    const int wait_ms = awaiting ? 5 : std::clamp(opt_.probe_interval_ms / 4, 1, 100);
    probe_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return probe_stop_; });
  }
}

bool FfnClient::probe_pass(int64_t now) {
  const int64_t interval = int64_t{opt_.probe_interval_ms} * 1000000;
  const uint64_t tag = frame_tag(TagFamily::probe, 0);
  bool awaiting = false;
  for (size_t j = 0; j < workers_.size(); ++j) {
    Probe& p = probes_[j];
    const std::string& name = workers_[j].name;  // fixed at create: safe to read here
    Completion c;
    if (p.ping_live && t_->test(p.ping_id, &c)) p.ping_live = false;
    if (p.pong_live && t_->test(p.pong_id, &c)) {
      p.pong_live = false;
      auto seq = c.status.is_ok() ? decode_probe(p.pong.data(), c.bytes, FrameKind::pong) : Result<uint64_t>(c.status);
      if (seq.ok() && *seq == p.seq) {
        if (p.overdue) {
          spdlog::info("attention {}: FFN worker '{}' answered its liveness probe again after {} ms", opt_.index, name,
                       (now - p.sent_ns.load()) / 1000000);
        }
        p.overdue = false;
        p.sent_ns.store(0);
        p.answered.fetch_add(1);
        last_pong_ns_.store(now_ns());  // ends a stall hold recorded before this moment
        p.next_ns = now + interval;
      } else if (!c.status.is_ok()) {
        // Lost (health() reports the disconnect) or cancelled: probe again after reconnecting.
        p.overdue = false;
        p.sent_ns.store(0);
        p.next_ns = now + interval;
      } else {
        // A malformed pong, or one for an older ping: the worker still owes this one.
        if (!seq.ok()) spdlog::warn("attention {}: FFN worker '{}': {}", opt_.index, name, seq.status().message());
        auto r = t_->post_recv(p.peer, tag, p.pong.data(), p.pong.capacity());
        if (r.ok()) {
          p.pong_id = *r;
          p.pong_live = true;
        } else {
          p.overdue = false;
          p.sent_ns.store(0);
          p.next_ns = now + interval;
        }
      }
    }
    if (p.pong_live) {
      // The moment health() starts reporting it, said once in the log too.
      if (!p.overdue && now - p.sent_ns.load() > int64_t{opt_.timeout_ms} * 1000000) {
        p.overdue = true;
        spdlog::warn("attention {}: FFN worker '{}' has not answered a liveness probe within {} ms (connected but "
                     "silent): reporting it unavailable until it does",
                     opt_.index, name, opt_.timeout_ms);
      }
      awaiting = true;
      continue;
    }
    if (now < p.next_ns || p.ping_live) continue;
    // A combine that succeeded within the interval already showed every worker alive.
    const int64_t ok = last_ok_ns_.load();
    if (now - ok < interval) {
      p.next_ns = ok + interval;
      continue;
    }
    p.next_ns = now + interval;
    auto peer = t_->peer_id(name);
    if (!peer.ok() || !t_->is_connected(*peer)) continue;  // health() reports that itself
    auto r = t_->post_recv(*peer, tag, p.pong.data(), p.pong.capacity());
    if (!r.ok()) continue;
    encode_probe(FrameKind::ping, ++p.seq, p.ping.data());
    auto sd = t_->post_send(*peer, tag, p.ping.data(), kFrameHeaderBytes);
    if (!sd.ok()) {
      t_->cancel(*r);
      t_->wait(*r, deadline_in_ms(1000));
      continue;
    }
    p.peer = *peer;
    p.pong_id = *r;
    p.ping_id = *sd;
    p.pong_live = p.ping_live = true;
    p.sent_ns.store(now);
    awaiting = true;
  }
  return awaiting;
}

void FfnClient::stop_probes() {
  {
    std::lock_guard<std::mutex> l(probe_mu_);
    probe_stop_ = true;
  }
  probe_cv_.notify_all();
  if (prober_.joinable()) prober_.join();
  if (!probes_) return;
  for (size_t j = 0; j < workers_.size(); ++j) {
    end_op(probes_[j].pong_id, &probes_[j].pong_live);
    end_op(probes_[j].ping_id, &probes_[j].ping_live);
  }
}

Status FfnClient::connect_all() {
  for (size_t j = 0; j < opt_.ffn_addresses.size(); ++j) AFD_RETURN_IF_ERROR(t_->connect(opt_.ffn_addresses[j]));
  // Waits for all of them at once; every 2 s (and in the error at the deadline) it names
  // the ones still missing, with their addresses.
  const int64_t deadline = deadline_in_ms(opt_.connect_timeout_ms);
  int64_t next_log = 0;
  for (;;) {
    std::string missing;
    for (size_t j = 0; j < workers_.size(); ++j) {
      if (workers_[j].peer != kNoPeer && t_->is_connected(workers_[j].peer)) continue;
      auto id = t_->peer_id(workers_[j].name);
      if (id.ok() && t_->is_connected(*id)) {
        workers_[j].peer = *id;
        continue;
      }
      missing += (missing.empty() ? "'" : ", '") + workers_[j].name + "'" +
                 (opt_.ffn_addresses.empty() ? "" : " at " + opt_.ffn_addresses[j]);
    }
    if (missing.empty()) break;
    const int64_t now = now_ns();
    if (now >= deadline) {
      return timeout_error("attention worker " + std::to_string(opt_.index) + ": FFN worker(s) " + missing +
                           " did not connect within " + std::to_string(opt_.connect_timeout_ms) + " ms");
    }
    if (now >= next_log) {
      spdlog::info("attention {}: waiting for FFN worker(s) {}", opt_.index, missing);
      next_log = now + int64_t{2000000000};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (size_t j = 0; j < workers_.size(); ++j) AFD_RETURN_IF_ERROR(handshake(static_cast<int>(j)));
  // The connect events are consumed: refresh_connections() only sees later changes.
  PeerEvent ev;
  while (t_->next_event(&ev, 0)) {}
  return check_shards();
}

Status FfnClient::handshake(int j) {
  Worker& wk = workers_[j];
  std::string who = "FFN worker '" + wk.name + "'";
  AFD_ASSIGN_OR_RETURN(FrameBuffer out, FrameBuffer::create(t_, kFrameHeaderBytes + kHandshakeBytes));
  AFD_ASSIGN_OR_RETURN(FrameBuffer in, FrameBuffer::create(t_, kFrameHeaderBytes + kMaxReasonBytes));
  size_t len = encode_handshake(FrameKind::hello, my_handshake(), out.data());
  uint64_t tag = frame_tag(TagFamily::handshake, 0);
  AFD_ASSIGN_OR_RETURN(RequestId r, t_->post_recv(wk.peer, tag, in.data(), in.capacity()));
  auto s = t_->post_send(wk.peer, tag, out.data(), len);
  if (!s.ok()) {
    t_->cancel(r);
    t_->wait(r, deadline_in_ms(5000));
    return s.status().with_context(who);
  }
  Completion c = t_->wait(r, deadline_in_ms(opt_.timeout_ms));
  if (c.status.code() == StatusCode::timeout) {
    t_->cancel(r);
    t_->wait(r, deadline_in_ms(5000));
  }
  Completion cs = t_->wait(*s, deadline_in_ms(5000));
  if (cs.status.code() == StatusCode::timeout) {
    t_->cancel(*s);
    t_->wait(*s, deadline_in_ms(5000));
  }
  if (!c.status.is_ok()) return c.status.with_context(who + ": handshake");
  auto theirs = decode_handshake(in.data(), c.bytes, FrameKind::hello_ack);
  if (!theirs.ok()) {
    spdlog::error("attention {}: {} refused or broke the handshake: {}", opt_.index, who, theirs.status().to_string());
    return theirs.status().with_context(who);
  }
  Handshake mine = my_handshake();
  Status m = check_handshake_match(mine, *theirs);
  if (m.is_ok() && theirs->role != Role::ffn) m = invalid_argument("peer is not an FFN worker: " + describe(*theirs));
  if (m.is_ok() && theirs->index != j) {
    m = invalid_argument("expected FFN worker " + std::to_string(j) + ", peer says it is " + describe(*theirs));
  }
  if (!m.is_ok()) {
    spdlog::error("attention {}: {}: {}", opt_.index, who, m.message());
    return m.with_context(who);
  }
  wk.hs = *theirs;
  wk.ready = true;
  spdlog::info("attention {}: handshake with {} ok ({})", opt_.index, who, describe(*theirs));
  return Status::ok();
}

namespace {

// One (worker, TP rank, TP degree) claim on a part (an expert, or the shared/dense part).
struct Claim {
  int worker, rank, degree;
};

// The claims on one part must be one TP degree t and ranks 0..t-1 each exactly once.
Status check_claims(const std::vector<Claim>& cs, const std::string& part) {
  if (cs.empty()) return invalid_argument("no FFN worker holds " + part);
  const int t = cs[0].degree;
  std::vector<int> by_rank(static_cast<size_t>(t), -1);
  for (const Claim& c : cs) {
    if (c.degree != t) {
      return invalid_argument(part + " is held with TP degree " + std::to_string(t) + " by FFN worker " +
                              std::to_string(cs[0].worker) + " but with TP degree " + std::to_string(c.degree) +
                              " by FFN worker " + std::to_string(c.worker) + " (overlapping intermediate slices)");
    }
    int& holder = by_rank[static_cast<size_t>(c.rank)];
    if (holder >= 0) {
      return invalid_argument(part + (t > 1 ? ", intermediate slice " + std::to_string(c.rank) + "/" + std::to_string(t) + "," : "") +
                              " is held by FFN workers " + std::to_string(holder) + " and " + std::to_string(c.worker));
    }
    holder = c.worker;
  }
  for (int r = 0; r < t; ++r) {
    if (by_rank[static_cast<size_t>(r)] < 0) {
      return invalid_argument("no FFN worker holds intermediate slice " + std::to_string(r) + "/" + std::to_string(t) +
                              " of " + part);
    }
  }
  return Status::ok();
}

}  // namespace

Status FfnClient::check_shards() {
  const int64_t E = w_->config.n_experts;
  std::vector<std::vector<Claim>> experts(static_cast<size_t>(E));
  std::vector<Claim> shared;
  for (size_t j = 0; j < workers_.size(); ++j) {
    const Handshake& h = workers_[j].hs;  // decode_handshake checked range and rank < degree
    const Claim c{static_cast<int>(j), h.tp_rank, h.tp_degree};
    for (uint32_t e = h.expert_begin; e < h.expert_end; ++e) experts[e].push_back(c);
    if (h.holds_shared) shared.push_back(c);
  }
  std::vector<uint64_t> masks(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    AFD_RETURN_IF_ERROR(check_claims(experts[static_cast<size_t>(e)], "expert " + std::to_string(e)));
    for (const Claim& c : experts[static_cast<size_t>(e)]) masks[static_cast<size_t>(e)] |= uint64_t{1} << c.worker;
  }
  AFD_RETURN_IF_ERROR(check_claims(shared, "the shared expert / dense layers"));
  uint64_t smask = 0;
  for (const Claim& c : shared) smask |= uint64_t{1} << c.worker;
  expert_workers_ = std::move(masks);
  shared_workers_ = smask;
  has_shared_ = w_->config.shared_expert_intermediate_size > 0;
  return Status::ok();
}

Status FfnClient::health() const {
  for (const Worker& wk : workers_) {
    auto peer = t_->peer_id(wk.name);
    if (!peer.ok()) return unavailable("FFN worker '" + wk.name + "' has not connected yet");
    if (!t_->is_connected(*peer)) return unavailable("FFN worker '" + wk.name + "' is not connected");
  }
  const int64_t now = now_ns();
  if (opt_.probe_interval_ms > 0) {
    for (size_t j = 0; j < workers_.size(); ++j) {
      const int64_t sent = probes_[j].sent_ns.load();
      if (sent != 0 && now - sent > int64_t{opt_.timeout_ms} * 1000000) {
        return unavailable("FFN worker '" + workers_[j].name + "' has not answered a liveness probe for " +
                           std::to_string((now - sent) / 1000000) + " ms (timeout " + std::to_string(opt_.timeout_ms) +
                           " ms)");
      }
    }
  }
  // The hold ends early once the FFN side answered anything after the stall: a pass
  // succeeded, or (probes on) a worker answered a liveness ping.
  const int64_t stall = last_stall_ns_.load();
  const int64_t ago = now - stall;
  const int64_t answered = std::max(last_ok_ns_.load(), last_pong_ns_.load());
  if (opt_.stall_hold_ms > 0 && stall > answered && ago < int64_t{opt_.stall_hold_ms} * 1000000) {
    std::lock_guard<std::mutex> l(stall_mu_);
    return unavailable(last_stall_ + " (" + std::to_string(ago / 1000000) + " ms ago; traffic resumes " +
                       (opt_.probe_interval_ms > 0 ? "when it answers a liveness probe, at the latest " : "") +
                       std::to_string(opt_.stall_hold_ms) + " ms after it)");
  }
  return Status::ok();
}

Status FfnClient::refresh_connections() {
  PeerEvent ev;
  bool changed = false;
  while (t_->next_event(&ev, 0)) {
    for (auto& wk : workers_) {
      if (wk.name != ev.name) continue;
      wk.ready = false;
      wk.peer = ev.peer;
      changed = true;
      if (ev.kind == PeerEventKind::disconnected) {
        spdlog::warn("attention {}: FFN worker '{}' lost: {}", opt_.index, wk.name, ev.detail);
      }
    }
  }
  for (size_t j = 0; j < workers_.size(); ++j) {
    Worker& wk = workers_[j];
    if (wk.ready) continue;
    if (wk.peer == kNoPeer || !t_->is_connected(wk.peer)) {
      return unavailable("FFN worker '" + wk.name + "' is not connected (waiting for it to come back)");
    }
    AFD_RETURN_IF_ERROR(handshake(static_cast<int>(j)));
  }
  if (changed) AFD_RETURN_IF_ERROR(check_shards());
  return Status::ok();
}

bool FfnClient::end_op(RequestId id, bool* live) {
  if (!*live) return true;
  *live = false;
  t_->cancel(id);
  return t_->wait(id, deadline_in_ms(1000)).status.code() != StatusCode::timeout;
}

void FfnClient::abandon(int mb) {
  for (auto& s : slots_[mb]) {
    for (auto [live, id] : {std::pair<bool*, RequestId>{&s.recv_live, s.recv_id}, {&s.send_live, s.send_id}}) {
      if (!end_op(id, live))
        spdlog::warn("attention {}: an operation of micro-batch {} did not end after cancel", opt_.index, mb);
    }
  }
}

Status FfnClient::dispatch(int64_t layer, int mb, TokenBatch& b) {
  const ModelConfig& c = w_->config;
  if (mb < 0 || mb >= opt_.microbatches) {
    return invalid_argument("ffn client: micro-batch " + std::to_string(mb) + " outside [0, " +
                            std::to_string(opt_.microbatches) + ")");
  }
  if (layer < 0 || layer >= c.n_layers) return invalid_argument("ffn client: layer " + std::to_string(layer) + " out of range");
  if (b.n > opt_.max_tokens) {
    return invalid_argument("ffn client: micro-batch of " + std::to_string(b.n) + " tokens exceeds max_tokens " +
                            std::to_string(opt_.max_tokens));
  }
  if (layer == 0 && mb == 0) {
    // A new forward pass. Operations still outstanding belong to a pass that failed (one
    // micro-batch's combine failed; the others' were never combined): end them, so every
    // micro-batch starts clean. Their late replies, if any, are dropped by the step check.
    for (int m = 0; m < opt_.microbatches; ++m) abandon(m);
    ++step_;
    AFD_RETURN_IF_ERROR(refresh_connections());
  }
  for (auto& wk : workers_) {
    if (!wk.ready) return unavailable("FFN worker '" + wk.name + "' is not connected");
  }
  const int64_t t0 = now_ns();
  const bool moe = c.is_moe_layer(layer);
  const int64_t H = c.hidden_size, K = moe ? c.n_experts_per_tok : 0;
  const size_t n_ffn = workers_.size();
  const ScaleGranularity g = opt_.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  const int64_t group = opt_.per_block_scales ? kScaleBlock : H;

  // Which workers each token goes to.
  for (auto& s : slots_[mb]) {
    if (s.send_live || s.recv_live) {
      return invalid_argument("ffn client: dispatch of micro-batch " + std::to_string(mb) +
                              " before the previous one was combined");
    }
    s.rows.clear();
  }
  for (int64_t i = 0; i < b.n; ++i) {
    uint64_t mask = 0;
    if (!moe || has_shared_) mask |= shared_workers_;
    if (moe) {
      for (int64_t k = 0; k < K; ++k) {
        int32_t e = b.topk_ids[static_cast<size_t>(i * K + k)];
        if (e < 0 || e >= c.n_experts) return invalid_argument("ffn client: expert id " + std::to_string(e) + " out of range");
        mask |= expert_workers_[static_cast<size_t>(e)];
      }
    }
    for (size_t j = 0; j < n_ffn; ++j) {
      if (mask >> j & 1) slots_[mb][j].rows.push_back(static_cast<int32_t>(i));
    }
  }
  for (size_t j = 0; j < n_ffn; ++j) {
    Slot& s = slots_[mb][j];
    const int64_t n = static_cast<int64_t>(s.rows.size());
    AFD_ASSIGN_OR_RETURN(A2fLayout l, a2f_layout(n, H, K, g));
    uint8_t* p = s.send.data() + kFrameHeaderBytes;
    auto* scales = reinterpret_cast<float*>(p + l.scales);
    auto* ids = reinterpret_cast<int32_t*>(p + l.ids);
    auto* wts = reinterpret_cast<float*>(p + l.weights);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = s.rows[static_cast<size_t>(r)];
      kernels::quantize_fp8_e4m3(b.h.data() + i * H, H, group, p + l.q + r * H, scales + r * l.n_scales_per_token);
      if (K > 0) {
        std::memcpy(ids + r * K, b.topk_ids.data() + i * K, static_cast<size_t>(K) * 4);
        std::memcpy(wts + r * K, b.topk_w.data() + i * K, static_cast<size_t>(K) * 4);
      }
    }
    FrameHeader h;
    h.kind = FrameKind::a2f;
    h.granularity = g;
    h.layer = static_cast<uint32_t>(layer);
    h.microbatch = static_cast<uint16_t>(mb);
    h.step = step_;
    h.n_tokens = static_cast<uint32_t>(n);
    h.hidden = static_cast<uint32_t>(H);
    h.top_k = static_cast<uint32_t>(K);
    h.payload_bytes = l.total;
    h.flags = opt_.payload_checksum ? kFlagPayloadChecksum : 0;
    encode_header(h, p, s.send.data());
    s.layer = h.layer;
    s.step = step_;
    const PeerId peer = workers_[j].peer;
    auto r = t_->post_recv(peer, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.recv.data(), s.recv.capacity());
    if (!r.ok()) {
      abandon(mb);
      return r.status().with_context("FFN worker '" + workers_[j].name + "'");
    }
    s.recv_id = *r;
    s.recv_live = true;
    auto sd = t_->post_send(peer, frame_tag(TagFamily::a2f, static_cast<uint32_t>(mb)), s.send.data(),
                            kFrameHeaderBytes + l.total);
    if (!sd.ok()) {
      abandon(mb);
      return sd.status().with_context("FFN worker '" + workers_[j].name + "'");
    }
    s.send_id = *sd;
    s.send_live = true;
  }
  times_at(layer).a2f_s += static_cast<double>(now_ns() - t0) * 1e-9;
  return Status::ok();
}

Status FfnClient::combine(int64_t layer, int mb, TokenBatch& b) {
  if (mb < 0 || mb >= opt_.microbatches) return invalid_argument("ffn client: micro-batch out of range");
  const int64_t t0 = now_ns();
  const int64_t H = w_->config.hidden_size;
  std::memset(b.ffn_out.data(), 0, static_cast<size_t>(b.n * H) * sizeof(float));
  const int64_t deadline = deadline_in_ms(opt_.timeout_ms);
  auto fail = [&](size_t j, Status s) {
    abandon(mb);
    std::string where = "FFN worker '" + workers_[j].name + "', layer " + std::to_string(layer) + ", micro-batch " +
                        std::to_string(mb);
    spdlog::error("attention {}: {}: {}", opt_.index, where, s.to_string());
    if (s.code() == StatusCode::timeout) {
      std::lock_guard<std::mutex> l(stall_mu_);
      last_stall_ = where + ": " + s.message();
      last_stall_ns_.store(now_ns());
    }
    return s.with_context(where);
  };
  uint32_t slowest_ffn_us = 0;  // the FFN workers compute in parallel: the slowest one counts
  for (size_t j = 0; j < workers_.size(); ++j) {
    Slot& s = slots_[mb][j];
    if (!s.recv_live) return invalid_argument("ffn client: combine without dispatch");
    if (static_cast<int64_t>(s.layer) != layer) {
      return invalid_argument("ffn client: combine of layer " + std::to_string(layer) + " but layer " +
                              std::to_string(s.layer) + " was dispatched");
    }
    for (;;) {
      Completion c = t_->wait(s.recv_id, deadline);
      if (c.status.code() == StatusCode::timeout) {
        return fail(j, timeout_error("no reply within " + std::to_string(opt_.timeout_ms) + " ms"));
      }
      s.recv_live = false;
      if (!c.status.is_ok()) return fail(j, c.status);
      auto hdr = decode_header(s.recv.data(), c.bytes);
      if (!hdr.ok()) return fail(j, hdr.status());
      if (hdr->kind == FrameKind::error) {
        auto why = decode_reason(s.recv.data(), c.bytes);
        return fail(j, unavailable("the FFN worker failed: " + (why.ok() ? *why : why.status().message())));
      }
      if (hdr->kind == FrameKind::f2a && (hdr->step != s.step || hdr->layer != s.layer)) {
        // A late reply from a pass that already failed: drop it and keep waiting.
        spdlog::debug("attention {}: dropping a stale reply (step {}, layer {})", opt_.index, hdr->step, hdr->layer);
        auto r = t_->post_recv(workers_[j].peer, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.recv.data(),
                               s.recv.capacity());
        if (!r.ok()) return fail(j, r.status());
        s.recv_id = *r;
        s.recv_live = true;
        continue;
      }
      auto v = decode_f2a(s.recv.data(), c.bytes, static_cast<uint32_t>(H), static_cast<uint32_t>(s.rows.size()));
      if (!v.ok()) return fail(j, v.status());
      slowest_ffn_us = std::max(slowest_ffn_us, hdr->ffn_us);
      for (size_t r = 0; r < s.rows.size(); ++r) {
        float* out = b.ffn_out.data() + static_cast<int64_t>(s.rows[r]) * H;
        const uint16_t* in = v->out + static_cast<int64_t>(r) * H;
        for (int64_t k = 0; k < H; ++k) out[k] += bf16_to_f32(in[k]);
      }
      break;
    }
    Completion cs = t_->wait(s.send_id, deadline);
    if (cs.status.code() == StatusCode::timeout) return fail(j, timeout_error("send did not complete"));
    s.send_live = false;
    if (!cs.status.is_ok()) return fail(j, cs.status);
  }
  FfnLayerTimes& lt = times_at(layer);
  lt.f2a_s += static_cast<double>(now_ns() - t0) * 1e-9;
  lt.ffn_s += static_cast<double>(slowest_ffn_us) * 1e-6;
  last_ok_ns_.store(now_ns());
  return Status::ok();
}

}  // namespace afd
