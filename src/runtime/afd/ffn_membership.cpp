#include "runtime/afd/ffn_membership.h"

#include <algorithm>

namespace afd {

FfnShare part_share(int64_t k, int64_t n, int parts, int64_t n_experts) {
  const int64_t P = parts, E = n_experts;
  FfnShare sh;
  sh.part_begin = static_cast<int>(k * P / n);
  sh.part_end = static_cast<int>((k + 1) * P / n);
  sh.range = ExpertRange{sh.part_begin * E / P, sh.part_end * E / P, sh.part_begin == 0, 0, 1};
  return sh;
}

FfnMembershipPolicy::FfnMembershipPolicy(int64_t n_experts, int parts, int takeover_ms)
    : n_experts_(n_experts), parts_(parts), takeover_ms_(takeover_ms) {}

void FfnMembershipPolicy::add_started(std::string name, std::string address, int64_t now) {
  FfnMemberState m;
  m.name = std::move(name);
  m.address = std::move(address);
  m.assigned = true;
  m.added_ns = now;
  members_.push_back(std::move(m));
}

std::string FfnMembershipPolicy::describe_assignment() const {
  std::string s;
  for (const FfnMemberState& m : members_) {
    if (!m.assigned) continue;
    s += (s.empty() ? "'" : ", '") + m.name + "' [" + std::to_string(m.share.range.begin) + ", " +
         std::to_string(m.share.range.end) + ")" + (m.share.range.holds_shared ? " + shared/dense" : "");
  }
  return s.empty() ? "nobody" : s;
}

std::vector<std::string> FfnMembershipPolicy::fit_to_parts() {
  std::vector<std::string> standbys;
  int n = 0;
  for (FfnMemberState& m : members_) {
    if (!m.assigned) continue;
    if (++n > parts_) {
      m.assigned = false;
      standbys.push_back(m.name);
    }
  }
  return standbys;
}

void FfnMembershipPolicy::reassign() {
  ++epoch_;
  std::vector<FfnMemberState*> in;
  for (FfnMemberState& m : members_) {
    if (m.assigned) in.push_back(&m);
  }
  const int64_t n = static_cast<int64_t>(in.size());
  for (int64_t k = 0; k < n; ++k) in[static_cast<size_t>(k)]->share = part_share(k, n, parts_, n_experts_);
}

FfnMembershipPolicy::Verdict FfnMembershipPolicy::evaluate(std::span<const Reach> reach, int64_t now) {
  Verdict v;
  std::vector<bool> reachable(members_.size(), false);
  for (size_t j = 0; j < members_.size(); ++j) {
    FfnMemberState& m = members_[j];
    if (m.name.empty()) continue;
    const bool up = reach[j].up();
    reachable[j] = up;
    if (up) {
      m.down_since = 0;
      m.down_why.clear();
    } else {
      if (m.down_since == 0) m.down_since = now;
      m.down_why = reach[j].connected ? "no answer to a liveness probe" : "not connected";
    }
  }
  const int64_t takeover_ns = int64_t{takeover_ms_} * 1000000;
  if (!whole_experts_) {
    // TP slices cannot move: the members stay as started (takeover_ms is not applied).
    for (const FfnMemberState& m : members_) {
      if (takeover_ms_ > 0 && !warned_tp_ && m.assigned && m.down_since != 0 && now - m.down_since >= takeover_ns) {
        warned_tp_ = true;
        v.tp_stuck_name = m.name;
        v.tp_stuck_ms = (now - m.down_since) / 1000000;
      }
    }
    return v;
  }
  auto note = [&](const std::string& w) { v.why += (v.why.empty() ? "" : "; ") + w; };
  for (size_t j = 0; j < members_.size(); ++j) {
    FfnMemberState& m = members_[j];
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
    } else if (m.refused() && others) {
      m.assigned = false;
      ++leaves_;
      note("FFN worker '" + m.name + "' refused its assignment; the others take over its experts until it reconnects");
    } else if (takeover_ms_ > 0 && m.down_since != 0 && others && now - m.down_since >= takeover_ns) {
      m.assigned = false;
      ++takeovers_;
      note("FFN worker '" + m.name + "' unreachable for " + std::to_string((now - m.down_since) / 1000000) + " ms (" +
           m.down_why + "): the others take over its experts [" + std::to_string(m.share.range.begin) + ", " +
           std::to_string(m.share.range.end) + ")");
    }
  }
  int assigned = 0;
  for (const FfnMemberState& m : members_) assigned += m.assigned ? 1 : 0;
  for (size_t j = 0; j < members_.size() && assigned < parts_; ++j) {
    FfnMemberState& m = members_[j];
    if (m.assigned || !m.active || m.checking || !reachable[j] || m.refused()) continue;
    m.assigned = true;
    ++assigned;
    ++rejoins_;
    note("FFN worker '" + m.name + "' (" + (m.address.empty() ? std::string("?") : m.address) +
         ") is reachable: it joins the assignment, the experts are rebalanced");
  }
  if (!v.why.empty()) reassign();
  return v;
}

int64_t FfnMembershipPolicy::takeover_in_ms(size_t j, const std::vector<bool>& reachable, int64_t now) const {
  if (takeover_ms_ <= 0 || !whole_experts_) return -1;
  bool others = false;
  for (size_t k = 0; k < members_.size(); ++k) {
    const FfnMemberState& o = members_[k];
    if (k != j && o.assigned && o.active && reachable[k]) others = true;
  }
  if (!others) return -1;
  const FfnMemberState& m = members_[j];
  const int64_t since = m.down_since != 0 ? m.down_since : now;
  return std::max<int64_t>(0, int64_t{takeover_ms_} - (now - since) / 1000000);
}

std::string FfnMembershipPolicy::start_without(const std::vector<bool>& started, int64_t since) {
  std::string gone;
  for (size_t j = 0; j < members_.size(); ++j) {
    if (started[j]) continue;
    FfnMemberState& m = members_[j];
    m.assigned = false;
    m.down_since = since;
    m.down_why = "not connected";
    ++takeovers_;
    gone += (gone.empty() ? "'" : ", '") + m.name + "'";
  }
  return gone;
}

Result<FfnMembershipPolicy::ListChange> FfnMembershipPolicy::apply_list(std::span<const FfnMember> list, bool join_check,
                                                                         int64_t now) {
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
  if (!whole_experts_) {
    return not_supported("FFN membership changes need whole experts; these FFN workers hold TP slices (--ffn-tp > 1)");
  }
  // Where each listed member goes: an existing slot (same address, or same name), else a new one.
  std::vector<int> slot(list.size(), -1);
  size_t fresh = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    for (size_t j = 0; j < members_.size(); ++j) {
      const FfnMemberState& m = members_[j];
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
  ListChange ch;
  std::vector<bool> listed(members_.size(), false);
  for (size_t i = 0; i < list.size(); ++i) {
    if (slot[i] >= 0) {
      FfnMemberState& m = members_[static_cast<size_t>(slot[i])];
      listed[static_cast<size_t>(slot[i])] = true;
      if (!m.active) {
        m.active = true;
        m.added_ns = now;
        ch.notes.push_back("FFN worker at " + m.address + " is a member again");
        if (!m.address.empty()) ch.dial.push_back(m.address);  // its removal stopped the dialling
        if (join_check && !m.assigned) {
          m.checking = true;
          ch.check.push_back(static_cast<size_t>(slot[i]));
        }
      }
      if (m.name.empty()) m.name = list[i].name;
      continue;
    }
    FfnMemberState m;
    m.address = list[i].address;
    m.name = list[i].name;
    m.added_ns = now;
    ch.notes.push_back("FFN worker at " + m.address + (m.name.empty() ? "" : " ('" + m.name + "')") +
                       " added to the membership (it joins the assignment once reachable)");
    if (join_check) {
      m.checking = true;
      ch.check.push_back(members_.size());
    }
    ch.created.push_back(members_.size());
    members_.push_back(std::move(m));
    listed.push_back(true);
    ch.dial.push_back(list[i].address);
  }
  for (size_t j = 0; j < members_.size(); ++j) {
    if (listed[j] || !members_[j].active) continue;
    members_[j].active = false;
    ch.notes.push_back("FFN worker '" + members_[j].name + "' (" + members_[j].address + ") removed from the membership");
    if (!members_[j].address.empty()) ch.undial.push_back(members_[j].address);
  }
  return ch;
}

void FfnMembershipPolicy::withdraw(const std::string& address) {
  for (FfnMemberState& m : members_) {
    if (m.address == address) m.active = false;
  }
}

FfnMembership FfnMembershipPolicy::snapshot(const std::vector<bool>& connected, uint32_t applied_epoch, int64_t now) const {
  FfnMembership r{.epoch = epoch_, .applied_epoch = applied_epoch, .takeovers = takeovers_, .rejoins = rejoins_,
                  .leaves = leaves_, .assigned = 0, .parts = parts_, .whole_experts = whole_experts_, .members = {}};
  for (size_t j = 0; j < members_.size(); ++j) {
    const FfnMemberState& m = members_[j];
    FfnMembership::Member x;
    x.name = m.name;
    x.address = m.address;
    x.connected = connected[j];
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

}  // namespace afd
