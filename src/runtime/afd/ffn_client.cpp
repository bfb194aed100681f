#include "runtime/afd/ffn_client.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/cpu/ops.h"
#include "model/fingerprint.h"
#include "model/weights.h"
#include "runtime/afd/handshake.h"
#include "runtime/afd/liveness.h"
#include "runtime/afd/transport_ops.h"

namespace afd {

using namespace comm;

FfnClient::FfnClient(std::shared_ptr<const ModelWeights> w, Transport* t, FfnClientOptions opt)
    : w_(std::move(w)), t_(t), opt_(std::move(opt)) {}

FfnClient::~FfnClient() {
  stop_probes();
  for (size_t mb = 0; mb < slots_.size(); ++mb) abandon(static_cast<int>(mb));
}

Handshake FfnClient::my_handshake(uint32_t epoch, const Share* assign, int n_ffn) const {
  Handshake h = model_handshake(w_->config, fingerprint_, Role::attention, opt_.precision);
  h.index = static_cast<uint16_t>(opt_.index);
  h.n_attention = static_cast<uint16_t>(opt_.n_attention);
  h.n_ffn = static_cast<uint16_t>(std::max<size_t>(1, n_ffn >= 0 ? static_cast<size_t>(n_ffn) : active_.size()));
  h.max_tokens = static_cast<uint32_t>(opt_.max_tokens);
  h.n_microbatches = static_cast<uint16_t>(opt_.microbatches);
  h.granularity = opt_.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  h.tp_rank = 0;
  h.tp_degree = static_cast<uint16_t>(opt_.expect_tp);
  h.epoch = epoch;
  if (epoch > 0 && assign != nullptr) {
    h.expert_begin = static_cast<uint32_t>(assign->range.begin);
    h.expert_end = static_cast<uint32_t>(assign->range.end);
    h.holds_shared = assign->range.holds_shared ? 1 : 0;
    h.n_parts = static_cast<uint16_t>(parts_);
    h.part_begin = static_cast<uint16_t>(assign->part_begin);
    h.part_end = static_cast<uint16_t>(assign->part_end);
  }
  return h;
}

Result<std::unique_ptr<FfnClient>> FfnClient::create(std::shared_ptr<const ModelWeights> w, Transport* transport,
                                                     FfnClientOptions opt) {
  if (!w || transport == nullptr) return invalid_argument("ffn client: no model or no transport");
  const ModelConfig& c = w->config;
  if (opt.ffn_names.empty() || opt.ffn_names.size() > kMaxSlots) return invalid_argument("ffn client: need 1..64 FFN workers");
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
  if (opt.takeover_ms < 0) return invalid_argument("ffn client: takeover time must be >= 0 (0: never)");
  if (opt.parts < 0 || opt.parts > static_cast<int>(kMaxSlots))
    return invalid_argument("ffn client: parts must be 0..64 (0: one per FFN worker it starts with)");
  if (opt.parts > c.n_experts)
    return invalid_argument("ffn client: " + std::to_string(opt.parts) + " parts of " + std::to_string(c.n_experts) +
                            " routed experts (at most one part per expert)");
  ScaleGranularity g = opt.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  AFD_ASSIGN_OR_RETURN(A2fLayout lay, a2f_layout(opt.max_tokens, c.hidden_size, c.n_experts_per_tok, g));

  std::unique_ptr<FfnClient> cl(new FfnClient(w, transport, opt));
  cl->fingerprint_ = model_fingerprint(*w);
  cl->a2f_bytes_ = static_cast<int64_t>(kFrameHeaderBytes + lay.total);
  cl->f2a_bytes_ = static_cast<int64_t>(kFrameHeaderBytes + f2a_payload_bytes(opt.max_tokens, c.hidden_size));
  cl->slots_.resize(static_cast<size_t>(opt.microbatches));
  cl->parts_ = opt.parts > 0 ? opt.parts : static_cast<int>(opt.ffn_names.size());
  for (size_t j = 0; j < opt.ffn_names.size(); ++j) {
    Member m;
    m.name = opt.ffn_names[j];
    if (!opt.ffn_addresses.empty()) m.address = opt.ffn_addresses[j];
    m.assigned = true;
    m.added_ns = now_ns();
    cl->members_.push_back(std::move(m));
    AFD_RETURN_IF_ERROR(cl->ensure_slot(j));
    cl->active_.push_back(static_cast<int>(j));
  }
  cl->probes_ = std::make_unique<PeerProbe[]>(kMaxSlots);
  for (size_t j = 0; j < kMaxSlots; ++j) cl->probes_[j].next_ns = deadline_in_ms(opt.probe_interval_ms);
  AFD_RETURN_IF_ERROR(cl->connect_all());
  {
    // More or fewer parts than the workers it started with: the first pass applies epoch 1,
    // so every reply is rounded per part from the start.
    std::lock_guard<std::mutex> l(cl->mu_);
    if (cl->whole_experts_ && cl->epoch_ == 0 && cl->parts_ != static_cast<int>(cl->members_.size())) {
      cl->fit_to_parts();
      cl->reassign("the experts are cut into " + std::to_string(cl->parts_) + " parts (" +
                   std::to_string(cl->members_.size()) + " FFN workers)");
    }
  }
  // The monitor: liveness probes (when probe_interval_ms > 0), transport events, and the
  // membership decisions.
  cl->prober_ = std::thread([c = cl.get()] { c->probe_loop(); });
  return cl;
}
void FfnClient::wake_monitor() {
  {
    std::lock_guard<std::mutex> l(probe_mu_);
    probe_poke_ = true;
  }
  probe_cv_.notify_all();
}

void FfnClient::probe_loop() {
  std::unique_lock<std::mutex> lk(probe_mu_);
  while (!probe_stop_) {
    probe_poke_ = false;
    lk.unlock();
    const int64_t now = now_ns();
    pump_events();
    const bool awaiting = opt_.probe_interval_ms > 0 && probe_pass(now);
    {
      std::lock_guard<std::mutex> l(mu_);
      evaluate(now_ns());
    }
    lk.lock();
    // A pong is polled for every 5 ms (its arrival time does not matter, only its absence);
    // otherwise the next due ping is at most a quarter interval late, and the membership is
    // looked at every 20 ms (a takeover is due at most that late).
    int wait_ms = 20;
    if (opt_.probe_interval_ms > 0) wait_ms = std::min(wait_ms, std::clamp(opt_.probe_interval_ms / 4, 1, 100));
    if (awaiting) wait_ms = 5;
    probe_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return probe_stop_ || probe_poke_; });
  }
}

bool FfnClient::probe_pass(int64_t now) {
  const int64_t interval = int64_t{opt_.probe_interval_ms} * 1000000;
  struct Target {
    size_t slot;
    std::string name;
    PeerId peer;
  };
  std::vector<Target> targets;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t j = 0; j < members_.size(); ++j) {
      const Member& m = members_[j];
      if (m.active && !m.name.empty()) targets.push_back(Target{j, m.name, m.peer});
    }
  }
  bool awaiting = false;
  for (const Target& tg : targets) {
    PeerProbe& p = probes_[tg.slot];
    const std::string& name = tg.name;
    if (!p.buf.ensure(t_).is_ok()) continue;
    const PeerProbe::Reaped r = p.reap(t_, now, interval, opt_.timeout_ms);
    if (r.back) {
      spdlog::info("attention {}: FFN worker '{}' answered its liveness probe again after {} ms", opt_.index, name,
                   r.back_after_ms);
    }
    if (r.answered) last_pong_ns_.store(now_ns());  // ends a stall hold recorded before this moment
    if (!r.bad_pong.empty()) spdlog::warn("attention {}: FFN worker '{}': {}", opt_.index, name, r.bad_pong);
    if (r.became_overdue) {
      // The moment health() starts reporting it, said once in the log too.
      spdlog::warn("attention {}: FFN worker '{}' has not answered a liveness probe within {} ms (connected but "
                   "silent): reporting it unavailable until it does",
                   opt_.index, name, opt_.timeout_ms);
    }
    if (p.awaiting()) {
      awaiting = true;
      continue;
    }
    if (!p.due(now)) continue;
    // A combine that succeeded within the interval already showed every assigned worker
    // alive (the others are pinged regardless: that is how a stalled one is seen back).
    const int64_t ok = last_ok_ns_.load();
    bool assigned;
    {
      std::lock_guard<std::mutex> l(mu_);
      assigned = members_[tg.slot].assigned;
    }
    if (assigned && now - ok < interval) {
      p.next_ns = ok + interval;
      continue;
    }
    // Not connected: health() reports that itself.
    if (p.ping(t_, tg.peer, now, interval)) awaiting = true;
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
  for (size_t j = 0; j < kMaxSlots; ++j) {
    probes_[j].stop(t_);
  }
}

bool FfnClient::probe_overdue(size_t slot, int64_t now) const {
  if (opt_.probe_interval_ms <= 0 || !probes_ || slot >= kMaxSlots) return false;
  return afd::probe_overdue(probes_[slot].sent_ns.load(), now, opt_.timeout_ms);
}

void FfnClient::pump_events() {
  std::lock_guard<std::mutex> el(events_mu_);
  PeerEvent ev;
  while (t_->next_event(&ev, 0)) {
    std::lock_guard<std::mutex> l(mu_);
    Member* m = nullptr;  // by name; an active member before one that left
    for (Member& x : members_) {
      if (!x.name.empty() && x.name == ev.name && (m == nullptr || !m->active)) m = &x;
    }
    if (m == nullptr && ev.kind == PeerEventKind::connected) {
      // A member added by address alone: the connection it was dialled on names it
      // (UCX: "dialed <address>"; in-process: the address).
      for (Member& x : members_) {
        if (x.name.empty() && !x.address.empty() && (ev.detail == x.address || ev.detail == "dialed " + x.address)) {
          m = &x;
          m->name = ev.name;
          spdlog::info("attention {}: the FFN worker at {} is '{}'", opt_.index, m->address, m->name);
        }
      }
    }
    if (m == nullptr) continue;
    m->peer = ev.peer;
    ++m->conn_gen;  // a new connection, or none: either way the next pass must say hello
    if (ev.kind == PeerEventKind::disconnected && m->active) {
      spdlog::warn("attention {}: FFN worker '{}' lost: {}", opt_.index, m->name, ev.detail);
    }
  }
}

std::string FfnClient::describe_assignment() const {
  std::string s;
  for (const Member& m : members_) {
    if (!m.assigned) continue;
    s += (s.empty() ? "'" : ", '") + m.name + "' [" + std::to_string(m.share.range.begin) + ", " +
         std::to_string(m.share.range.end) + ")" + (m.share.range.holds_shared ? " + shared/dense" : "");
  }
  return s.empty() ? "nobody" : s;
}

bool FfnClient::fit_to_parts() {
  int n = 0;
  bool any = false;
  for (Member& m : members_) {
    if (!m.assigned) continue;
    if (++n > parts_) {
      m.assigned = false;
      any = true;
      spdlog::info("attention {}: FFN worker '{}' is a standby: {} parts are held by as many FFN workers", opt_.index,
                   m.name, parts_);
    }
  }
  return any;
}

void FfnClient::reassign(const std::string& why) {
  ++epoch_;
  std::vector<Member*> in;
  for (Member& m : members_) {
    if (m.assigned) in.push_back(&m);
  }
  const int64_t n = static_cast<int64_t>(in.size()), P = parts_, E = w_->config.n_experts;
  for (int64_t k = 0; k < n; ++k) {
    Share& sh = in[static_cast<size_t>(k)]->share;
    sh.part_begin = static_cast<int>(k * P / n);
    sh.part_end = static_cast<int>((k + 1) * P / n);
    sh.range = ExpertRange{sh.part_begin * E / P, sh.part_end * E / P, sh.part_begin == 0, 0, 1};
  }
  spdlog::warn("attention {}: {}: FFN expert assignment epoch {}: {}", opt_.index, why, epoch_, describe_assignment());
}

void FfnClient::evaluate(int64_t now) {
  std::vector<bool> reachable(members_.size(), false);
  for (size_t j = 0; j < members_.size(); ++j) {
    Member& m = members_[j];
    if (m.name.empty()) continue;
    if (m.peer == kNoPeer) {  // its connect event may have been consumed before it was a member
      auto id = t_->peer_id(m.name);
      if (id.ok()) m.peer = *id;
    }
    const bool connected = m.peer != kNoPeer && t_->is_connected(m.peer);
    const bool up = connected && !probe_overdue(j, now);
    reachable[j] = up;
    if (up) {
      m.down_since = 0;
      m.down_why.clear();
    } else {
      if (m.down_since == 0) m.down_since = now;
      m.down_why = connected ? "no answer to a liveness probe" : "not connected";
    }
  }
  if (!whole_experts_) {
    // TP slices cannot move: the members stay as started (takeover_ms is not applied).
    for (size_t j = 0; j < members_.size(); ++j) {
      const Member& m = members_[j];
      if (opt_.takeover_ms > 0 && !warned_tp_ && m.assigned && m.down_since != 0 &&
          now - m.down_since >= int64_t{opt_.takeover_ms} * 1000000) {
        warned_tp_ = true;
        spdlog::warn("attention {}: FFN worker '{}' has been unreachable for {} ms, but the FFN workers hold TP slices "
                     "(--ffn-tp > 1): its experts cannot move to the others; waiting for it to come back",
                     opt_.index, m.name, (now - m.down_since) / 1000000);
      }
    }
    return;
  }
  std::string why;
  auto note = [&](const std::string& w) { why += (why.empty() ? "" : "; ") + w; };
  for (size_t j = 0; j < members_.size(); ++j) {
    Member& m = members_[j];
    if (!m.assigned) continue;
    // Survivors: assigned, reachable members other than this one.
    bool others = false;
    for (size_t k = 0; k < members_.size(); ++k) {
      if (k != j && members_[k].assigned && members_[k].active && reachable[k]) others = true;
    }
    if (!m.active) {
      m.assigned = false;
      ++leaves_;
      note("FFN worker '" + m.name + "' (" + m.address + ") left the membership");
    } else if (m.refused_gen == m.conn_gen + 1 && others) {
      m.assigned = false;
      ++leaves_;
      note("FFN worker '" + m.name + "' refused its assignment; the others take over its experts until it reconnects");
    } else if (opt_.takeover_ms > 0 && m.down_since != 0 && others &&
               now - m.down_since >= int64_t{opt_.takeover_ms} * 1000000) {
      m.assigned = false;
      ++takeovers_;
      note("FFN worker '" + m.name + "' unreachable for " + std::to_string((now - m.down_since) / 1000000) + " ms (" +
           m.down_why + "): the others take over its experts [" + std::to_string(m.share.range.begin) + ", " +
           std::to_string(m.share.range.end) + ")");
    }
  }
  int assigned = 0;
  for (const Member& m : members_) assigned += m.assigned ? 1 : 0;
  for (size_t j = 0; j < members_.size() && assigned < parts_; ++j) {
    Member& m = members_[j];
    if (m.assigned || !m.active || m.checking || !reachable[j] || m.refused_gen == m.conn_gen + 1) continue;
    m.assigned = true;
    ++assigned;
    ++rejoins_;
    note("FFN worker '" + m.name + "' (" + (m.address.empty() ? std::string("?") : m.address) +
         ") is reachable: it joins the assignment, the experts are rebalanced");
  }
  if (!why.empty()) reassign(why);
}

Status FfnClient::connect_all() {
  for (size_t j = 0; j < opt_.ffn_addresses.size(); ++j) AFD_RETURN_IF_ERROR(t_->connect(opt_.ffn_addresses[j]));
  // Waits for all of them at once; every 2 s (and in the error at the deadline) it names
  // the ones still missing, with their addresses. With a takeover time, FFN workers still
  // missing after it are treated as lost: the client starts without them if the others hold
  // whole experts (they take over; the missing ones join when they come).
  const int64_t start = now_ns();
  const int64_t deadline = deadline_in_ms(opt_.connect_timeout_ms);
  int64_t next_log = 0;
  bool tried_partial = false, partial = false;
  std::vector<bool> shaken(members_.size(), false);
  auto shake = [&](size_t j) -> Status {
    Worker& wk = workers_[j];
    wk.name = members_[j].name;
    wk.peer = members_[j].peer;
    bool refused = false;
    AFD_RETURN_IF_ERROR(handshake(static_cast<int>(j), 0, Share{}, &refused));
    wk.gen = 0;
    wk.epoch = 0;
    shaken[j] = true;
    return Status::ok();
  };
  for (;;) {
    std::string missing;
    int connected = 0;
    for (size_t j = 0; j < members_.size(); ++j) {
      Member& m = members_[j];
      if (m.peer == kNoPeer || !t_->is_connected(m.peer)) {
        auto id = t_->peer_id(m.name);
        if (id.ok() && t_->is_connected(*id)) m.peer = *id;
      }
      if (m.peer != kNoPeer && t_->is_connected(m.peer)) {
        ++connected;
        continue;
      }
      missing += (missing.empty() ? "'" : ", '") + m.name + "'" +
                 (opt_.ffn_addresses.empty() ? "" : " at " + opt_.ffn_addresses[j]);
    }
    if (missing.empty()) break;
    const int64_t now = now_ns();
    if (opt_.takeover_ms > 0 && connected > 0 && !tried_partial && now - start >= int64_t{opt_.takeover_ms} * 1000000) {
      tried_partial = true;
      bool whole = true;
      for (size_t j = 0; j < members_.size(); ++j) {
        if (members_[j].peer == kNoPeer || !t_->is_connected(members_[j].peer)) continue;
        AFD_RETURN_IF_ERROR(shake(j));
        if (workers_[j].hs.tp_degree != 1) whole = false;
      }
      if (whole) {
        partial = true;
        spdlog::warn("attention {}: FFN worker(s) {} not connected after {} ms (the takeover time): starting without "
                     "them",
                     opt_.index, missing, opt_.takeover_ms);
        break;
      }
      spdlog::info("attention {}: FFN worker(s) {} not connected after {} ms; the others hold TP slices, so waiting "
                   "for all",
                   opt_.index, missing, opt_.takeover_ms);
    }
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
  for (size_t j = 0; j < members_.size(); ++j) {
    if (shaken[j] || members_[j].peer == kNoPeer || !t_->is_connected(members_[j].peer)) continue;
    AFD_RETURN_IF_ERROR(shake(j));
  }
  // The connect events are consumed: later ones are new connections.
  PeerEvent ev;
  while (t_->next_event(&ev, 0)) {}
  if (!partial) AFD_RETURN_IF_ERROR(check_shards());
  std::lock_guard<std::mutex> l(mu_);
  for (size_t j = 0; j < members_.size(); ++j) {
    if (!shaken[j]) continue;
    const Handshake& h = workers_[j].hs;
    members_[j].share.range = ExpertRange{h.expert_begin, h.expert_end, h.holds_shared != 0, h.tp_rank, h.tp_degree};
    workers_[j].share = members_[j].share;
    if (h.tp_degree > 1) whole_experts_ = false;
  }
  if (partial) {
    // The first pass applies epoch 1: the connected workers split the experts.
    std::string gone;
    for (size_t j = 0; j < members_.size(); ++j) {
      if (shaken[j]) continue;
      members_[j].assigned = false;
      members_[j].down_since = start;
      members_[j].down_why = "not connected";
      ++takeovers_;
      gone += (gone.empty() ? "'" : ", '") + members_[j].name + "'";
    }
    active_.clear();
    for (size_t j = 0; j < members_.size(); ++j) {
      if (shaken[j]) active_.push_back(static_cast<int>(j));
    }
    fit_to_parts();
    reassign("FFN worker(s) " + gone + " did not connect within the takeover time: the others take over their experts");
  }
  return Status::ok();
}

Status FfnClient::handshake(int j, uint32_t epoch, const Share& assign, bool* refused) {
  *refused = false;
  Worker& wk = workers_[static_cast<size_t>(j)];
  std::string who = "FFN worker '" + wk.name + "'";
  const Handshake mine = my_handshake(epoch, &assign);
  AFD_ASSIGN_OR_RETURN(HelloExchange x, exchange_hello(t_, wk.peer, mine, opt_.timeout_ms));
  if (!x.sent.is_ok()) return x.sent.with_context(who);
  if (!x.reply.status.is_ok()) return x.reply.status.with_context(who + ": handshake");
  auto theirs = decode_handshake(x.in.data(), x.reply.bytes, FrameKind::hello_ack);
  if (!theirs.ok()) {
    *refused = true;
    spdlog::error("attention {}: {} refused or broke the handshake: {}", opt_.index, who, theirs.status().to_string());
    return theirs.status().with_context(who);
  }
  Status m = check_ack(mine, *theirs);
  // At epoch 0 the start-up order says which shard each worker holds (--ffn in shard order).
  if (m.is_ok() && epoch == 0 && theirs->index != j) {
    m = invalid_argument("expected FFN worker " + std::to_string(j) + ", peer says it is " + describe(*theirs));
  }
  if (m.is_ok() && theirs->epoch != epoch) {
    m = invalid_argument("asked for assignment epoch " + std::to_string(epoch) + ", the FFN worker acknowledged epoch " +
                         std::to_string(theirs->epoch));
  }
  if (m.is_ok() && epoch > 0 &&
      (theirs->part_begin != assign.part_begin || theirs->part_end != assign.part_end || theirs->n_parts != parts_ ||
       theirs->tp_degree != 1)) {
    m = invalid_argument("asked to hold parts [" + std::to_string(assign.part_begin) + ", " +
                         std::to_string(assign.part_end) + ") of " + std::to_string(parts_) +
                         ", the FFN worker acknowledged " + describe(*theirs));
  }
  if (!m.is_ok()) {
    *refused = true;
    spdlog::error("attention {}: {}: {}", opt_.index, who, m.message());
    return m.with_context(who);
  }
  wk.hs = *theirs;
  wk.ready = true;
  wk.share = epoch > 0 ? assign : Share{ExpertRange{theirs->expert_begin, theirs->expert_end, theirs->holds_shared != 0,
                                                    theirs->tp_rank, theirs->tp_degree}};
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
  for (int j : active_) {
    const Handshake& h = workers_[static_cast<size_t>(j)].hs;  // decode_handshake checked range and rank < degree
    const Claim c{j, h.tp_rank, h.tp_degree};
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
  const int64_t now = now_ns();
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t j = 0; j < members_.size(); ++j) {
      const Member& m = members_[j];
      if (!m.assigned) continue;
      if (m.peer == kNoPeer) return unavailable("FFN worker '" + m.name + "' has not connected yet");
      // Whether the others will take over, and when (the monitor's rule in evaluate()).
      auto pending = [&]() -> std::string {
        if (opt_.takeover_ms <= 0 || !whole_experts_) return "";
        bool others = false;
        for (size_t k = 0; k < members_.size(); ++k) {
          const Member& o = members_[k];
          if (k != j && o.assigned && o.active && o.peer != kNoPeer && t_->is_connected(o.peer) &&
              !probe_overdue(k, now))
            others = true;
        }
        if (!others) return "";
        const int64_t since = m.down_since != 0 ? m.down_since : now;
        const int64_t left = std::max<int64_t>(0, int64_t{opt_.takeover_ms} - (now - since) / 1000000);
        return " (the other FFN workers take over its experts in " + std::to_string(left) + " ms)";
      };
      if (!t_->is_connected(m.peer)) return unavailable("FFN worker '" + m.name + "' is not connected" + pending());
      if (opt_.probe_interval_ms > 0) {
        const int64_t sent = probes_[j].sent_ns.load();
        if (afd::probe_overdue(sent, now, opt_.timeout_ms)) {
          return unavailable("FFN worker '" + m.name + "' has not answered a liveness probe for " +
                             std::to_string((now - sent) / 1000000) + " ms (timeout " + std::to_string(opt_.timeout_ms) +
                             " ms)" + pending());
        }
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

Status FfnClient::set_members(std::vector<FfnMember> list) {
  if (list.empty()) return invalid_argument("FFN membership: at least one FFN worker is needed");
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].address.empty()) return invalid_argument("FFN membership: member " + std::to_string(i) + " has no address");
    for (size_t k = 0; k < i; ++k) {
      if (list[k].address == list[i].address)
        return invalid_argument("FFN membership: address " + list[i].address + " is listed twice");
      if (!list[i].name.empty() && list[k].name == list[i].name)
        return invalid_argument("FFN membership: name '" + list[i].name + "' is listed twice");
    }
  }
  std::vector<std::string> dial, undial;
  std::vector<size_t> fresh_slots;  // new members said hello to before the call returns
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!whole_experts_) {
      return not_supported(
          "FFN membership changes need whole experts; these FFN workers hold TP slices (--ffn-tp > 1)");
    }
    // Where each listed member goes: an existing slot (same address, or same name), else a new one.
    std::vector<int> slot(list.size(), -1);
    size_t fresh = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      for (size_t j = 0; j < members_.size(); ++j) {
        const Member& m = members_[j];
        if ((!m.address.empty() && m.address == list[i].address) ||
            (m.address.empty() && !list[i].name.empty() && m.name == list[i].name))
          slot[i] = static_cast<int>(j);
      }
      if (slot[i] < 0) {
        ++fresh;
      } else if (!list[i].name.empty() && !members_[static_cast<size_t>(slot[i])].name.empty() &&
                 members_[static_cast<size_t>(slot[i])].name != list[i].name) {
        return invalid_argument("FFN membership: " + list[i].address + " is FFN worker '" +
                                members_[static_cast<size_t>(slot[i])].name + "', not '" + list[i].name + "'");
      }
      if (!list[i].name.empty()) {
        // A name is one transport peer: it may pass from a member that leaves now (or left
        // before) to another address, never be shared by two members.
        for (size_t j = 0; j < members_.size(); ++j) {
          if (static_cast<int>(j) == slot[i] || members_[j].name != list[i].name || !members_[j].active) continue;
          if (std::any_of(list.begin(), list.end(), [&](const FfnMember& x) { return x.address == members_[j].address; }))
            return invalid_argument("FFN membership: name '" + list[i].name + "' belongs to the member at " +
                                    members_[j].address);
        }
      }
    }
    if (members_.size() + fresh > kMaxSlots) {
      return invalid_argument("FFN membership: more than " + std::to_string(kMaxSlots) +
                              " FFN workers over this attention worker's lifetime");
    }
    std::vector<bool> listed(members_.size(), false);
    for (size_t i = 0; i < list.size(); ++i) {
      if (slot[i] >= 0) {
        Member& m = members_[static_cast<size_t>(slot[i])];
        listed[static_cast<size_t>(slot[i])] = true;
        if (!m.active) {
          m.active = true;
          m.added_ns = now_ns();
          spdlog::info("attention {}: FFN worker at {} is a member again", opt_.index, m.address);
          if (!m.address.empty()) dial.push_back(m.address);  // its removal stopped the dialling
          if (opt_.join_check_ms > 0 && !m.assigned) {
            m.checking = true;
            fresh_slots.push_back(static_cast<size_t>(slot[i]));
          }
        }
        if (m.name.empty()) m.name = list[i].name;
        continue;
      }
      Member m;
      m.address = list[i].address;
      m.name = list[i].name;
      m.added_ns = now_ns();
      // A name the transport already knows (e.g. a worker that was a member before under
      // another address) gives its peer now; otherwise the connect event does.
      if (!m.name.empty()) {
        auto id = t_->peer_id(m.name);
        if (id.ok()) m.peer = *id;
      }
      spdlog::info("attention {}: FFN worker at {}{} added to the membership (it joins the assignment once reachable)",
                   opt_.index, m.address, m.name.empty() ? "" : " ('" + m.name + "')");
      if (opt_.join_check_ms > 0) {
        m.checking = true;
        fresh_slots.push_back(members_.size());
      }
      members_.push_back(std::move(m));
      listed.push_back(true);
      dial.push_back(list[i].address);
    }
    for (size_t j = 0; j < members_.size(); ++j) {
      if (listed[j] || !members_[j].active) continue;
      members_[j].active = false;
      spdlog::info("attention {}: FFN worker '{}' ({}) removed from the membership", opt_.index, members_[j].name,
                   members_[j].address);
      if (!members_[j].address.empty()) undial.push_back(members_[j].address);
    }
  }
  // A removed worker is no longer dialled (nor its absence logged); a connection to it stays
  // until it is lost. The transports of this process all support it; another answers
  // not_supported and keeps dialling.
  for (const std::string& a : undial) {
    Status u = t_->stop_connecting(a);
    if (!u.is_ok()) spdlog::debug("attention {}: {}", opt_.index, u.to_string());
  }
  for (const std::string& a : dial) {
    Status c = t_->connect(a);
    if (c.is_ok()) continue;
    // Not an address the transport can dial: the new member goes again.
    std::lock_guard<std::mutex> l(mu_);
    for (Member& m : members_) {
      if (m.address == a) m.active = false;
    }
    for (size_t j : fresh_slots) members_[j].checking = false;
    return c.with_context("FFN membership: " + a);
  }
  if (fresh_slots.empty()) {
    wake_monitor();
    return Status::ok();
  }
  const auto bad = check_new_members(fresh_slots, deadline_in_ms(opt_.join_check_ms));
  std::string why;
  std::vector<std::string> withdrawn;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t j : fresh_slots) members_[j].checking = false;
    for (const auto& [j, msg] : bad) {
      Member& m = members_[j];
      m.active = false;
      withdrawn.push_back(m.address);
      why += (why.empty() ? "" : "; ") + m.address + ": " + msg;
      spdlog::error("attention {}: FFN worker at {} is not added to the membership: {}", opt_.index, m.address, msg);
    }
  }
  for (const std::string& a : withdrawn) (void)t_->stop_connecting(a);
  wake_monitor();
  if (!why.empty()) return invalid_argument("FFN membership: cannot add " + why);
  return Status::ok();
}

std::vector<std::pair<size_t, std::string>> FfnClient::check_new_members(const std::vector<size_t>& slots,
                                                                         int64_t deadline_ns) {
  std::vector<std::pair<size_t, std::string>> bad;
  std::vector<bool> done(slots.size(), false);
  for (;;) {
    pump_events();  // names members added by address alone, gives peers
    bool waiting = false;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (done[i]) continue;
      std::string name;
      PeerId peer;
      int n_ffn = 0;
      {
        std::lock_guard<std::mutex> l(mu_);
        Member& m = members_[slots[i]];
        if (m.peer == kNoPeer && !m.name.empty()) {
          auto id = t_->peer_id(m.name);
          if (id.ok()) m.peer = *id;
        }
        name = m.name.empty() ? m.address : "'" + m.name + "' (" + m.address + ")";
        peer = m.peer;
        for (const Member& x : members_) n_ffn += x.active ? 1 : 0;
      }
      if (peer == kNoPeer || !t_->is_connected(peer)) {
        waiting = true;
        continue;
      }
      done[i] = true;
      Status s = hello_check(peer, "FFN worker " + name, n_ffn);
      if (!s.is_ok()) bad.emplace_back(slots[i], s.message());
    }
    if (!waiting || now_ns() >= deadline_ns) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (done[i]) continue;
    std::lock_guard<std::mutex> l(mu_);
    spdlog::info("attention {}: FFN worker at {} did not connect within {} ms: added unchecked (its handshake checks it "
                 "when it joins the assignment)",
                 opt_.index, members_[slots[i]].address, opt_.join_check_ms);
  }
  return bad;
}

Status FfnClient::hello_check(PeerId peer, const std::string& who, int n_ffn) {
  const Handshake mine = my_handshake(0, nullptr, n_ffn);
  AFD_ASSIGN_OR_RETURN(HelloExchange x, exchange_hello(t_, peer, mine, opt_.timeout_ms));
  if (!x.sent.is_ok()) {
    spdlog::info("attention {}: {}: could not say hello ({}); it is checked when it joins", opt_.index, who,
                 x.sent.to_string());
    return Status::ok();
  }
  if (!x.reply.status.is_ok()) {
    spdlog::info("attention {}: {}: no answer to its hello ({}); it is checked when it joins", opt_.index, who,
                 x.reply.status.to_string());
    return Status::ok();
  }
  auto theirs = decode_handshake(x.in.data(), x.reply.bytes, FrameKind::hello_ack);
  Status m = theirs.ok() ? check_ack(mine, *theirs) : theirs.status();
  if (!m.is_ok()) return invalid_argument(who + ": " + m.message());
  spdlog::info("attention {}: {} fits this attention worker ({})", opt_.index, who, describe(*theirs));
  return Status::ok();
}

Status FfnClient::add_member(FfnMember m) {
  std::vector<FfnMember> list;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const Member& x : members_) {
      if (!x.active) continue;
      if (x.address == m.address) return Status::ok();  // already a member
      list.push_back(FfnMember{x.address, x.name});
    }
  }
  list.push_back(std::move(m));
  return set_members(std::move(list));
}

Status FfnClient::remove_member(const std::string& who) {
  std::vector<FfnMember> list;
  bool found = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const Member& x : members_) {
      if (!x.active) continue;
      if (x.address == who || (!x.name.empty() && x.name == who)) {
        found = true;
        continue;
      }
      list.push_back(FfnMember{x.address, x.name});
    }
  }
  if (!found) return not_found("FFN membership: no member at or named '" + who + "'");
  return set_members(std::move(list));
}

FfnMembership FfnClient::membership() const {
  FfnMembership r;
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> l(mu_);
  r.epoch = epoch_;
  r.applied_epoch = applied_epoch_atomic_.load();
  r.takeovers = takeovers_;
  r.rejoins = rejoins_;
  r.leaves = leaves_;
  r.whole_experts = whole_experts_;
  r.parts = parts_;
  for (const Member& m : members_) {
    FfnMembership::Member x;
    x.name = m.name;
    x.address = m.address;
    x.connected = m.peer != kNoPeer && t_->is_connected(m.peer);
    x.assigned = m.assigned;
    x.removed = !m.active;
    if (m.assigned) {
      x.expert_begin = m.share.range.begin;
      x.expert_end = m.share.range.end;
      x.holds_shared = m.share.range.holds_shared;
      x.part_begin = m.share.part_begin;
      x.part_end = m.share.part_end;
      ++r.assigned;
    }
    x.unreachable_ms = m.down_since != 0 ? (now - m.down_since) / 1000000 : 0;
    r.members.push_back(std::move(x));
  }
  return r;
}

Status FfnClient::ensure_slot(size_t j, int64_t rows_per_token) {
  if (workers_.size() <= j) workers_.resize(j + 1);
  if (recv_rows_.size() <= j) recv_rows_.resize(j + 1, 0);
  const bool grow = recv_rows_[j] < rows_per_token;
  for (auto& per_mb : slots_) {
    if (per_mb.size() <= j) per_mb.resize(j + 1);
    Slot& s = per_mb[j];
    if (s.send.data() == nullptr) {
      AFD_ASSIGN_OR_RETURN(s.send, FrameBuffer::create(t_, static_cast<size_t>(a2f_bytes_)));
    }
    if (grow) {
      // No operation of the slot is live here (a pass start, after abandon()).
      const size_t bytes = kFrameHeaderBytes + f2a_payload_bytes(opt_.max_tokens * rows_per_token, w_->config.hidden_size);
      AFD_ASSIGN_OR_RETURN(s.recv, FrameBuffer::create(t_, bytes));
    }
  }
  if (grow) recv_rows_[j] = rows_per_token;
  return Status::ok();
}

Status FfnClient::refresh_connections() {
  pump_events();
  struct Want {
    int slot;
    std::string name;
    PeerId peer;
    uint64_t gen;
    Share share;
  };
  std::vector<Want> want;
  uint32_t epoch;
  {
    std::lock_guard<std::mutex> l(mu_);
    epoch = epoch_;
    for (size_t j = 0; j < members_.size(); ++j) {
      const Member& m = members_[j];
      if (m.assigned) want.push_back(Want{static_cast<int>(j), m.name, m.peer, m.conn_gen, m.share});
    }
  }
  if (want.empty()) return unavailable("no FFN worker holds the experts (every member was removed)");
  std::vector<int> slots;
  for (const Want& x : want) slots.push_back(x.slot);
  const bool changed = epoch != applied_epoch_ || slots != active_;
  if (changed) {
    const int64_t K = w_->config.n_experts_per_tok;
    for (const Want& x : want) {
      const int64_t held = epoch > 0 ? x.share.part_end - x.share.part_begin : 1;
      AFD_RETURN_IF_ERROR(ensure_slot(static_cast<size_t>(x.slot), held <= 1 ? 1 : std::min<int64_t>(held, K + 1)));
    }
    // A pass must not run on half an assignment: routing waits until every handshake is done.
    active_ = slots;
    expert_workers_.assign(expert_workers_.size(), 0);
    shared_workers_ = 0;
    applied_epoch_ = ~0u;
  }
  const int64_t t0 = now_ns();
  int handshakes = 0;
  for (const Want& x : want) {
    Worker& wk = workers_[static_cast<size_t>(x.slot)];
    wk.name = x.name;
    if (wk.ready && wk.gen == x.gen && wk.epoch == epoch && wk.peer == x.peer && t_->is_connected(x.peer)) continue;
    wk.ready = false;
    if (x.peer == kNoPeer || !t_->is_connected(x.peer)) {
      return unavailable("FFN worker '" + x.name + "' is not connected (waiting for it to come back" +
                         (opt_.takeover_ms > 0 ? std::string("; the others take over its experts once it has been "
                                                             "unreachable for ") +
                                                     std::to_string(opt_.takeover_ms) + " ms"
                                               : std::string()) +
                         ")");
    }
    wk.peer = x.peer;
    bool refused = false;
    Status s = handshake(x.slot, epoch, x.share, &refused);
    if (!s.is_ok()) {
      if (refused && epoch > 0) {
        std::lock_guard<std::mutex> l(mu_);
        members_[static_cast<size_t>(x.slot)].refused_gen = x.gen + 1;
        wake_monitor();
        return unavailable("FFN worker '" + x.name + "' refused assignment epoch " + std::to_string(epoch) + ": " +
                           s.message());
      }
      return s;
    }
    wk.gen = x.gen;
    wk.epoch = epoch;
    ++handshakes;
  }
  if (applied_epoch_ != epoch || changed) {
    AFD_RETURN_IF_ERROR(check_shards());
    if (epoch > 0 || changed) {
      spdlog::info("attention {}: FFN expert assignment epoch {} in effect ({} handshake(s), {:.1f} ms)", opt_.index,
                   epoch, handshakes, static_cast<double>(now_ns() - t0) * 1e-6);
    }
    applied_epoch_ = epoch;
    applied_epoch_atomic_.store(epoch);
    const int64_t E = w_->config.n_experts;
    part_of_expert_.assign(static_cast<size_t>(E), 0);
    for (int64_t q = 0; q < parts_; ++q)
      for (int64_t e = q * E / parts_; e < (q + 1) * E / parts_; ++e) part_of_expert_[static_cast<size_t>(e)] = static_cast<int16_t>(q);
    if (epoch == 0) {
      std::lock_guard<std::mutex> l(mu_);
      for (int j : active_) members_[static_cast<size_t>(j)].share = workers_[static_cast<size_t>(j)].share;
    }
  }
  return Status::ok();
}

void FfnClient::abandon(int mb) {
  for (auto& s : slots_[mb]) {
    for (auto [live, id] : {std::pair<bool*, RequestId>{&s.recv_live, s.recv_id}, {&s.send_live, s.send_id}}) {
      if (!afd::end_op(t_, id, live))
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
  for (int j : active_) {
    const Worker& wk = workers_[static_cast<size_t>(j)];
    if (!wk.ready) return unavailable("FFN worker '" + wk.name + "' is not connected");
  }
  const int64_t t0 = now_ns();
  const bool moe = c.is_moe_layer(layer);
  const int64_t H = c.hidden_size, K = moe ? c.n_experts_per_tok : 0;
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
  // At epochs >= 1 the parts each token touches: a worker holding several parts replies one
  // row per (token, part).
  const bool by_parts = applied_epoch_ > 0;
  token_parts_.assign(static_cast<size_t>(b.n), 0);
  for (int64_t i = 0; i < b.n; ++i) {
    uint64_t mask = 0, parts = 0;
    if (!moe || has_shared_) {
      mask |= shared_workers_;
      parts |= 1;
    }
    if (moe) {
      for (int64_t k = 0; k < K; ++k) {
        int32_t e = b.topk_ids[static_cast<size_t>(i * K + k)];
        if (e < 0 || e >= c.n_experts) return invalid_argument("ffn client: expert id " + std::to_string(e) + " out of range");
        mask |= expert_workers_[static_cast<size_t>(e)];
        if (by_parts) parts |= uint64_t{1} << part_of_expert_[static_cast<size_t>(e)];
      }
    }
    token_parts_[static_cast<size_t>(i)] = parts;
    for (int j : active_) {
      if (mask >> j & 1) slots_[mb][static_cast<size_t>(j)].rows.push_back(static_cast<int32_t>(i));
    }
  }
  for (int j : active_) {
    Slot& s = slots_[mb][static_cast<size_t>(j)];
    const Share& sh = workers_[static_cast<size_t>(j)].share;
    if (!by_parts || sh.part_end - sh.part_begin <= 1) {
      s.reply_rows = s.rows;
      continue;
    }
    s.reply_rows.clear();
    for (int q = sh.part_begin; q < sh.part_end; ++q) {
      for (int32_t i : s.rows) {
        if (token_parts_[static_cast<size_t>(i)] >> q & 1) s.reply_rows.push_back(i);
      }
    }
  }
  for (int j : active_) {
    Slot& s = slots_[mb][static_cast<size_t>(j)];
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
    h.epoch = applied_epoch_;
    h.payload_bytes = l.total;
    h.flags = opt_.payload_checksum ? kFlagPayloadChecksum : 0;
    encode_header(h, p, s.send.data());
    s.layer = h.layer;
    s.step = step_;
    const Worker& wk = workers_[static_cast<size_t>(j)];
    auto r = t_->post_recv(wk.peer, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.recv.data(), s.recv.capacity());
    if (!r.ok()) {
      abandon(mb);
      return r.status().with_context("FFN worker '" + wk.name + "'");
    }
    s.recv_id = *r;
    s.recv_live = true;
    auto sd = t_->post_send(wk.peer, frame_tag(TagFamily::a2f, static_cast<uint32_t>(mb)), s.send.data(),
                            kFrameHeaderBytes + l.total);
    if (!sd.ok()) {
      abandon(mb);
      return sd.status().with_context("FFN worker '" + wk.name + "'");
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
  for (int jj : active_) {
    const size_t j = static_cast<size_t>(jj);
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
      // Steps start at 1; an error frame of step 0 answers a frame whose header could not be
      // read, so it cannot be told stale: it fails the pass it arrives in.
      const bool errs = hdr->kind == FrameKind::error && hdr->step != 0;
      if ((hdr->kind == FrameKind::f2a || errs) && (hdr->step != s.step || hdr->layer != s.layer)) {
        // A late reply (or error) from a pass that already failed: drop it and keep waiting.
        spdlog::debug("attention {}: dropping a stale {} (step {}, layer {})", opt_.index, frame_kind_name(hdr->kind),
                      hdr->step, hdr->layer);
        auto r = t_->post_recv(workers_[j].peer, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.recv.data(),
                               s.recv.capacity());
        if (!r.ok()) return fail(j, r.status());
        s.recv_id = *r;
        s.recv_live = true;
        continue;
      }
      if (hdr->kind == FrameKind::error) {
        // The next pass says hello again first (e.g. after an assignment epoch mismatch).
        workers_[j].ready = false;
        auto why = decode_reason(s.recv.data(), c.bytes);
        return fail(j, unavailable("the FFN worker failed: " + (why.ok() ? *why : why.status().message())));
      }
      auto v = decode_f2a(s.recv.data(), c.bytes, static_cast<uint32_t>(H), static_cast<uint32_t>(s.reply_rows.size()));
      if (!v.ok()) return fail(j, v.status());
      slowest_ffn_us = std::max(slowest_ffn_us, hdr->ffn_us);
      // Slots in slot order hold consecutive parts, each slot's rows part by part: the
      // partials are added in part order.
      for (size_t r = 0; r < s.reply_rows.size(); ++r) {
        float* out = b.ffn_out.data() + static_cast<int64_t>(s.reply_rows[r]) * H;
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
