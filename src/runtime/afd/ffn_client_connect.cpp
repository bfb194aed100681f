// FfnClient's connections: connecting at create(), the handshakes, and applying the
// membership's current epoch at a pass start (refresh_connections). Class comment: ffn_client.h.
#include <algorithm>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "model/weights.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/handshake.h"
#include "runtime/afd/transport_ops.h"

namespace afd {

using namespace comm;

Handshake FfnClient::my_handshake(uint32_t epoch, const Share* assign, int n_ffn) const {
  Handshake h = model_handshake(w_->config, fingerprint_, Role::attention, opt_.precision);
  h.batch_invariant = opt_.batch_invariant ? 1 : 0;
  h.index = static_cast<uint16_t>(opt_.index);
  h.n_attention = static_cast<uint16_t>(opt_.n_attention);
  h.n_ffn = static_cast<uint16_t>(std::max<size_t>(1, n_ffn >= 0 ? static_cast<size_t>(n_ffn) : active_.size()));
  h.max_tokens = static_cast<uint32_t>(opt_.max_tokens);
  h.n_microbatches = static_cast<uint16_t>(opt_.microbatches);
  h.granularity = opt_.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  h.tp_rank = 0;
  h.tp_degree = static_cast<uint16_t>(opt_.expect_tp);
  h.epoch = epoch;
  if (epoch > 0 && assign != nullptr && opt_.expert_placement) {
    h.placement = 1;
    h.expert_begin = 0;
    h.expert_end = static_cast<uint32_t>(w_->config.n_experts);
    h.holds_shared = assign->range.holds_shared ? 1 : 0;
  } else if (epoch > 0 && assign != nullptr) {
    h.expert_begin = static_cast<uint32_t>(assign->range.begin);
    h.expert_end = static_cast<uint32_t>(assign->range.end);
    h.holds_shared = assign->range.holds_shared ? 1 : 0;
    h.n_parts = static_cast<uint16_t>(membership_.parts());
    h.part_begin = static_cast<uint16_t>(assign->part_begin);
    h.part_end = static_cast<uint16_t>(assign->part_end);
  }
  return h;
}

Status FfnClient::connect_all() {
  for (size_t j = 0; j < opt_.ffn_addresses.size(); ++j) AFD_RETURN_IF_ERROR(t_->connect(opt_.ffn_addresses[j]));
  // No other thread runs yet: the members are read and written without mu_ until the end.
  std::vector<Member>& members = membership_.members();
  // Waits for all of them at once; every 2 s (and in the error at the deadline) it names
  // the ones still missing, with their addresses. With a takeover time, FFN workers still
  // missing after it are treated as lost: the client starts without them if the others hold
  // whole experts (they take over; the missing ones join when they come).
  const int64_t start = now_ns();
  const int64_t deadline = deadline_in_ms(opt_.connect_timeout_ms);
  int64_t next_log = 0;
  bool tried_partial = false, partial = false;
  std::vector<bool> shaken(members.size(), false);
  auto shake = [&](size_t j) -> Status {
    Worker& wk = workers_[j];
    wk.name = members[j].name;
    wk.peer = members[j].peer;
    bool refused = false;
    AFD_RETURN_IF_ERROR(handshake(static_cast<int>(j), 0, Share{}, &refused));
    wk.gen = 0;
    wk.epoch = 0;
    shaken[j] = true;
    return Status();
  };
  for (;;) {
    std::string missing;
    int connected = 0;
    for (size_t j = 0; j < members.size(); ++j) {
      Member& m = members[j];
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
      for (size_t j = 0; j < members.size(); ++j) {
        if (members[j].peer == kNoPeer || !t_->is_connected(members[j].peer)) continue;
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
  for (size_t j = 0; j < members.size(); ++j) {
    if (shaken[j] || members[j].peer == kNoPeer || !t_->is_connected(members[j].peer)) continue;
    AFD_RETURN_IF_ERROR(shake(j));
  }
  // The connect events are consumed: later ones are new connections.
  PeerEvent ev;
  while (t_->next_event(&ev, 0)) {}
  if (!partial) AFD_RETURN_IF_ERROR(check_shards());
  std::lock_guard<std::mutex> l(mu_);
  for (size_t j = 0; j < members.size(); ++j) {
    if (!shaken[j]) continue;
    const Handshake& h = workers_[j].hs;
    members[j].share.range = ExpertRange{h.expert_begin, h.expert_end, h.holds_shared != 0, h.tp_rank, h.tp_degree};
    workers_[j].share = members[j].share;
    if (h.tp_degree > 1) membership_.set_tp_slices();
  }
  if (partial) {
    // The first pass applies epoch 1: the connected workers split the experts.
    const std::string gone = membership_.start_without(shaken, start);
    active_.clear();
    for (size_t j = 0; j < members.size(); ++j) {
      if (shaken[j]) active_.push_back(static_cast<int>(j));
    }
    fit_to_parts();
    reassign("FFN worker(s) " + gone + " did not connect within the takeover time: the others take over their experts");
  }
  return Status();
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
  const int parts = membership_.parts();
  if (m.is_ok() && epoch > 0 && opt_.expert_placement &&
      (theirs->placement != 1 || (theirs->holds_shared != 0) != assign.range.holds_shared)) {
    m = invalid_argument(std::string("asked to compute the expert pairs it is sent") +
                         (assign.range.holds_shared ? " + shared/dense" : "") + " (expert placement), the FFN worker "
                         "acknowledged " + describe(*theirs));
  } else if (m.is_ok() && epoch > 0 && !opt_.expert_placement &&
      (theirs->part_begin != assign.part_begin || theirs->part_end != assign.part_end || theirs->n_parts != parts ||
       theirs->tp_degree != 1)) {
    m = invalid_argument("asked to hold parts [" + std::to_string(assign.part_begin) + ", " +
                         std::to_string(assign.part_end) + ") of " + std::to_string(parts) +
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
  return Status();
}

Status FfnClient::check_shards() {
  std::vector<ShardClaim> claims;
  for (int j : active_) {
    const Handshake& h = workers_[static_cast<size_t>(j)].hs;
    claims.push_back(ShardClaim{j, ExpertRange{h.expert_begin, h.expert_end, h.holds_shared != 0, h.tp_rank, h.tp_degree}});
  }
  AFD_RETURN_IF_ERROR(build_routing_masks(claims, w_->config.n_experts, &routing_));
  routing_.has_shared = w_->config.shared_expert_intermediate_size > 0;
  return Status();
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
  return Status();
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
    epoch = membership_.epoch();
    const std::vector<Member>& members = membership_.members();
    for (size_t j = 0; j < members.size(); ++j) {
      const Member& m = members[j];
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
      const int64_t held = epoch > 0 && opt_.expert_placement ? K + 1
                           : epoch > 0                        ? x.share.part_end - x.share.part_begin
                                                              : 1;
      AFD_RETURN_IF_ERROR(ensure_slot(static_cast<size_t>(x.slot), held <= 1 ? 1 : std::min<int64_t>(held, K + 1)));
    }
    // A pass must not run on half an assignment: routing waits until every handshake is done.
    active_ = slots;
    routing_.expert_workers.assign(routing_.expert_workers.size(), 0);
    routing_.shared_workers = 0;
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
        membership_.members()[static_cast<size_t>(x.slot)].refused_gen = x.gen + 1;
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
    if (opt_.expert_placement && epoch > 0) {
      // Every assigned worker computes whatever pairs it is sent (the placement says which);
      // one holds the shared expert / dense layers.
      routing_.has_shared = w_->config.shared_expert_intermediate_size > 0;
    } else {
      AFD_RETURN_IF_ERROR(check_shards());
    }
    if (epoch > 0 || changed) {
      spdlog::info("attention {}: FFN expert assignment epoch {} in effect ({} handshake(s), {:.1f} ms)", opt_.index,
                   epoch, handshakes, static_cast<double>(now_ns() - t0) * 1e-6);
    }
    applied_epoch_ = epoch;
    applied_epoch_atomic_.store(epoch);
    routing_.part_of_expert = parts_of_experts(w_->config.n_experts, membership_.parts());
    if (epoch == 0) {
      std::lock_guard<std::mutex> l(mu_);
      for (int j : active_) membership_.members()[static_cast<size_t>(j)].share = workers_[static_cast<size_t>(j)].share;
    }
  }
  return Status();
}

}  // namespace afd
