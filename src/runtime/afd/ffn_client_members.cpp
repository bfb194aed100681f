// FfnClient's membership changes (set_members, add_member, remove_member: the policy decides,
// this file dials and says hello) and membership(). Class comment: ffn_client.h.
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "runtime/afd/ffn_client.h"
#include "runtime/afd/handshake.h"
#include "runtime/afd/transport_ops.h"

namespace afd {

using namespace comm;

Status FfnClient::set_members(std::vector<FfnMember> list) {
  FfnMembershipPolicy::ListChange ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    AFD_ASSIGN_OR_RETURN(ch, membership_.apply_list(list, opt_.join_check_ms > 0, now_ns()));
    for (const std::string& note : ch.notes) spdlog::info("attention {}: {}", opt_.index, note);
    // A name the transport already knows (e.g. a worker that was a member before under
    // another address) gives its peer now; otherwise the connect event does.
    for (size_t j : ch.created) {
      Member& m = membership_.members()[j];
      if (m.name.empty()) continue;
      auto id = t_->peer_id(m.name);
      if (id.ok()) m.peer = *id;
    }
  }
  // A removed worker is no longer dialled (nor its absence logged); a connection to it stays
  // until it is lost. The transports of this process all support it; another answers
  // not_supported and keeps dialling.
  for (const std::string& a : ch.undial) {
    Status u = t_->stop_connecting(a);
    if (!u.is_ok()) spdlog::debug("attention {}: {}", opt_.index, u.to_string());
  }
  for (const std::string& a : ch.dial) {
    Status c = t_->connect(a);
    if (c.is_ok()) continue;
    // Not an address the transport can dial: the new member goes again.
    std::lock_guard<std::mutex> l(mu_);
    membership_.withdraw(a);
    for (size_t j : ch.check) membership_.members()[j].checking = false;
    return c.with_context("FFN membership: " + a);
  }
  if (ch.check.empty()) {
    wake_monitor();
    return Status();
  }
  const auto bad = check_new_members(ch.check, deadline_in_ms(opt_.join_check_ms));
  std::string why;
  std::vector<std::string> withdrawn;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t j : ch.check) membership_.members()[j].checking = false;
    for (const auto& [j, msg] : bad) {
      Member& m = membership_.members()[j];
      m.active = false;
      withdrawn.push_back(m.address);
      why += (why.empty() ? "" : "; ") + m.address + ": " + msg;
      spdlog::error("attention {}: FFN worker at {} is not added to the membership: {}", opt_.index, m.address, msg);
    }
  }
  for (const std::string& a : withdrawn) (void)t_->stop_connecting(a);
  wake_monitor();
  if (!why.empty()) return invalid_argument("FFN membership: cannot add " + why);
  return Status();
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
        Member& m = membership_.members()[slots[i]];
        if (m.peer == kNoPeer && !m.name.empty()) {
          auto id = t_->peer_id(m.name);
          if (id.ok()) m.peer = *id;
        }
        name = m.name.empty() ? m.address : "'" + m.name + "' (" + m.address + ")";
        peer = m.peer;
        for (const Member& x : membership_.members()) n_ffn += x.active ? 1 : 0;
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
                 opt_.index, membership_.members()[slots[i]].address, opt_.join_check_ms);
  }
  return bad;
}

Status FfnClient::hello_check(PeerId peer, const std::string& who, int n_ffn) {
  const Handshake mine = my_handshake(0, nullptr, n_ffn);
  AFD_ASSIGN_OR_RETURN(HelloExchange x, exchange_hello(t_, peer, mine, opt_.timeout_ms));
  if (!x.sent.is_ok()) {
    spdlog::info("attention {}: {}: could not say hello ({}); it is checked when it joins", opt_.index, who,
                 x.sent.to_string());
    return Status();
  }
  if (!x.reply.status.is_ok()) {
    spdlog::info("attention {}: {}: no answer to its hello ({}); it is checked when it joins", opt_.index, who,
                 x.reply.status.to_string());
    return Status();
  }
  auto theirs = decode_handshake(x.in.data(), x.reply.bytes, FrameKind::hello_ack);
  Status m = theirs.ok() ? check_ack(mine, *theirs) : theirs.status();
  if (!m.is_ok()) return invalid_argument(who + ": " + m.message());
  spdlog::info("attention {}: {} fits this attention worker ({})", opt_.index, who, describe(*theirs));
  return Status();
}

Status FfnClient::add_member(FfnMember m) {
  std::vector<FfnMember> list;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const Member& x : membership_.members()) {
      if (!x.active) continue;
      if (x.address == m.address) return Status();  // already a member
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
    for (const Member& x : membership_.members()) {
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
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> l(mu_);
  const std::vector<Member>& members = membership_.members();
  std::vector<bool> connected(members.size());
  for (size_t j = 0; j < members.size(); ++j) connected[j] = members[j].peer != kNoPeer && t_->is_connected(members[j].peer);
  FfnMembership m = membership_.snapshot(connected, applied_epoch_atomic_.load(), now);
  m.expert_placement = opt_.expert_placement;
  m.placements = placements_;
  m.placement_planned = placement_planned_;
  m.placement_contiguous = placement_contiguous_;
  return m;
}

}  // namespace afd
