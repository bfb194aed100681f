// FfnClient's monitor thread (transport events, liveness probes, the membership policy's
// evaluation) and health(), which reads what it maintains. Class comment: ffn_client.h.
#include <algorithm>

#include "core/log.h"
#include "core/timer.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/liveness.h"

namespace afd {

using namespace comm;

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
    const std::vector<Member>& members = membership_.members();
    for (size_t j = 0; j < members.size(); ++j) {
      const Member& m = members[j];
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
      assigned = membership_.members()[tg.slot].assigned;
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
    std::vector<Member>& members = membership_.members();
    Member* m = nullptr;  // by name; an active member before one that left
    for (Member& x : members) {
      if (!x.name.empty() && x.name == ev.name && (m == nullptr || !m->active)) m = &x;
    }
    if (m == nullptr && ev.kind == PeerEventKind::connected) {
      // A member added by address alone: the connection it was dialled on names it
      // (UCX: "dialed <address>"; in-process: the address).
      for (Member& x : members) {
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

void FfnClient::fit_to_parts() {
  for (const std::string& name : membership_.fit_to_parts()) {
    spdlog::info("attention {}: FFN worker '{}' is a standby: {} parts are held by as many FFN workers", opt_.index, name,
                 membership_.parts());
  }
}

void FfnClient::reassign(const std::string& why) {
  membership_.reassign();
  spdlog::warn("attention {}: {}: FFN expert assignment epoch {}: {}", opt_.index, why, membership_.epoch(),
               membership_.describe_assignment());
}

void FfnClient::evaluate(int64_t now) {
  std::vector<Member>& members = membership_.members();
  std::vector<Reach> reach(members.size());
  for (size_t j = 0; j < members.size(); ++j) {
    Member& m = members[j];
    if (m.name.empty()) continue;
    if (m.peer == kNoPeer) {  // its connect event may have been consumed before it was a member
      auto id = t_->peer_id(m.name);
      if (id.ok()) m.peer = *id;
    }
    reach[j].connected = m.peer != kNoPeer && t_->is_connected(m.peer);
    reach[j].overdue = reach[j].connected && probe_overdue(j, now);
  }
  const FfnMembershipPolicy::Verdict v = membership_.evaluate(reach, now);
  if (!v.tp_stuck_name.empty()) {
    spdlog::warn("attention {}: FFN worker '{}' has been unreachable for {} ms, but the FFN workers hold TP slices "
                 "(--ffn-tp > 1): its experts cannot move to the others; waiting for it to come back",
                 opt_.index, v.tp_stuck_name, v.tp_stuck_ms);
  }
  if (!v.why.empty()) {
    spdlog::warn("attention {}: {}: FFN expert assignment epoch {}: {}", opt_.index, v.why, membership_.epoch(),
                 membership_.describe_assignment());
  }
}

std::vector<bool> FfnClient::reachable_now(int64_t now) const {
  const std::vector<Member>& members = membership_.members();
  std::vector<bool> up(members.size(), false);
  for (size_t k = 0; k < members.size(); ++k) {
    const Member& o = members[k];
    up[k] = o.peer != kNoPeer && t_->is_connected(o.peer) && !probe_overdue(k, now);
  }
  return up;
}

Status FfnClient::health() const {
  const int64_t now = now_ns();
  {
    std::lock_guard<std::mutex> l(mu_);
    const std::vector<Member>& members = membership_.members();
    for (size_t j = 0; j < members.size(); ++j) {
      const Member& m = members[j];
      if (!m.assigned) continue;
      if (m.peer == kNoPeer) return unavailable("FFN worker '" + m.name + "' has not connected yet");
      // Whether the others will take over, and when (the policy's rule).
      auto pending = [&]() -> std::string {
        const int64_t left = membership_.takeover_in_ms(j, reachable_now(now), now);
        if (left < 0) return "";
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
  return Status();
}

}  // namespace afd
