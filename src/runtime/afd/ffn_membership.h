// FfnMembershipPolicy: the attention side's FFN membership decisions (runtime/afd/ffn_client.h,
// "Membership and expert re-homing") as a pure unit: the members and their slots, the
// assignment epochs, which member holds which parts of the experts, takeovers, standbys and
// joins, what a liveness verdict changes, and how a new member list (set_members) maps onto
// the slots. It holds FfnMemberState records only: no transport, no threads, no clock (what
// the transport and the probes say is passed in as Reach values, times as nanoseconds of any
// monotonic clock). FfnClient holds one under its membership mutex and acts on its answers
// (dials, handshakes, logs).
//
// Rules:
//   - parts: the routed experts are cut into P parts; part q is experts [q*E/P, (q+1)*E/P),
//     part 0 also the shared expert and the dense layers.
//   - epoch 0: every member holds what it was started with (its announced range). Each change
//     starts a new epoch in which the k-th of the n assigned members (in slot order) holds
//     parts [k*P/n, (k+1)*P/n); at most P members are assigned, the others are standbys.
//   - an assigned member leaves the assignment when it is removed, when it refused its
//     assignment on its current connection while another assigned member is reachable, or
//     when it has been unreachable for takeover_ms while another assigned member is reachable
//     (a takeover); a reachable, active member that is not assigned, not being checked and
//     that did not refuse on its current connection joins while fewer than P are assigned.
//   - with TP slices (whole_experts false) nothing moves: the members stay as started.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/transport.h"
#include "core/status.h"
#include "runtime/topology.h"

namespace afd {

// One FFN worker of the membership (FfnClient::set_members).
struct FfnMember {
  std::string address;  // what the transport connects to (UCX "host:port"; in-process: the listener's address)
  // The worker's transport name (`afd worker --role ffn --shard i/y` is "ffn<i>"); empty: learned
  // when it connects. Two members must not share a name.
  std::string name;
};

// What FfnClient::membership() reports (metrics, the admin endpoint, logs).
struct FfnMembership {
  struct Member {
    std::string name, address;
    bool connected = false;
    bool assigned = false;       // holds experts in the current epoch
    bool removed = false;        // no longer a member (set_members)
    int64_t expert_begin = 0, expert_end = 0;  // when assigned
    bool holds_shared = false;
    int part_begin = 0, part_end = 0;  // when assigned at epoch >= 1: parts [begin, end) of FfnMembership::parts
    int64_t unreachable_ms = 0;  // > 0: unreachable this long
  };
  uint32_t epoch = 0;       // 0: the FFN workers hold the shards they were started with
  uint32_t applied_epoch = 0;  // the epoch the last forward pass ran under
  int64_t takeovers = 0;    // members that left the assignment after takeover_ms unreachable
  int64_t rejoins = 0;      // members that joined it (back after a loss, or added)
  int64_t leaves = 0;       // members that left it otherwise (removed, refused their assignment)
  int assigned = 0;         // members in the assignment
  int parts = 0;            // P (class comment of FfnClient)
  bool whole_experts = true;  // every FFN worker holds whole experts (TP degree 1): re-homing possible
  // Expert placement (--eplb; FfnClient fills these): placements planned so far, and the
  // predicted max/mean FFN worker load of the last one and of the contiguous placement
  // (1 before the first plan).
  bool expert_placement = false;
  int64_t placements = 0;
  double placement_planned = 1, placement_contiguous = 1;
  std::vector<Member> members;
};

// What one FFN worker holds in an epoch: at epoch 0 its start-up range (parts 0..0); else
// parts [part_begin, part_end), whose experts and shared flag `range` says.
struct FfnShare {
  ExpertRange range;
  int part_begin = 0, part_end = 0;
};

// The share of the k-th of n assigned members when n_experts experts are cut into `parts`.
FfnShare part_share(int64_t k, int64_t n, int parts, int64_t n_experts);

// A member of the membership: its slot is its index (append-only; its bit in the routing
// masks, its order in the sum).
struct FfnMemberState {
  std::string name, address;
  bool active = true;       // a member (false: removed by set_members; keeps its slot)
  bool assigned = false;    // holds experts in the current epoch
  FfnShare share;           // what it holds in the current epoch (epoch 0: what it announced)
  comm::PeerId peer = comm::kNoPeer;  // the client's (the policy never reads it)
  uint64_t conn_gen = 0;    // connection changes seen (each new connection must be handshaken)
  uint64_t refused_gen = 0; // conn_gen + 1 of a connection that refused its assignment; 0: none
  int64_t down_since = 0;   // when first seen unreachable; 0: reachable
  std::string down_why;
  int64_t added_ns = 0;
  // Being said hello to by set_members (join_check_ms): it does not join the assignment
  // meanwhile (the engine thread would say hello on the same tag).
  bool checking = false;

  // It refused its assignment on its current connection.
  bool refused() const { return refused_gen == conn_gen + 1; }
};

// What the transport and the probes say of one member at a moment.
struct Reach {
  bool connected = false;  // a live connection
  bool overdue = false;    // a liveness probe unanswered past the timeout
  bool up() const { return connected && !overdue; }
};

class FfnMembershipPolicy {
 public:
  static constexpr size_t kMaxSlots = 64;  // bits of the routing masks

  // parts P >= 1, n_experts E >= P; takeover_ms 0: never take over.
  FfnMembershipPolicy(int64_t n_experts, int parts, int takeover_ms);

  // [slot], append-only.
  std::vector<FfnMemberState>& members() { return members_; }
  const std::vector<FfnMemberState>& members() const { return members_; }
  uint32_t epoch() const { return epoch_; }
  int parts() const { return parts_; }
  int64_t takeovers() const { return takeovers_; }
  bool whole_experts() const { return whole_experts_; }
  // Some FFN worker holds TP slices: re-homing is off for good.
  void set_tp_slices() { whole_experts_ = false; }

  // A member it starts with (assigned, holding at epoch 0 what it announces).
  void add_started(std::string name, std::string address, int64_t now);

  // What evaluate() decided.
  struct Verdict {
    std::string why;  // non-empty: a new epoch started (reassign()), for these reasons
    // Set once, the first time an assigned member of TP slices is unreachable past takeover_ms.
    std::string tp_stuck_name;
    int64_t tp_stuck_ms = 0;
  };
  // The monitor's pass at `now` over reach[slot] (members with no name yet are skipped): marks
  // who is unreachable since when, and applies the rules (header comment).
  Verdict evaluate(std::span<const Reach> reach, int64_t now);

  // Assigned members beyond the first P (in slot order) become standbys; their names.
  std::vector<std::string> fit_to_parts();
  // Starts a new epoch over the assigned members (header comment).
  void reassign();
  // "'name' [b, e) + shared/dense, ..." of the assigned members, or "nobody".
  std::string describe_assignment() const;

  // health(): when the others will take over assigned member j (reachable[k]: member k is
  // up), in ms from now; -1: they will not (no takeover time, TP slices, no reachable other).
  int64_t takeover_in_ms(size_t j, const std::vector<bool>& reachable, int64_t now) const;

  // Start-up without the members not in `started` (they did not connect within the takeover
  // time, since `since`): they leave the assignment, counted as takeovers. Returns their
  // names ("'a', 'b'"). The caller then calls fit_to_parts() and reassign().
  std::string start_without(const std::vector<bool>& started, int64_t since);

  // What set_members(list) changes.
  struct ListChange {
    std::vector<std::string> dial, undial;  // addresses to dial / to stop dialling
    std::vector<size_t> check;              // members to say hello to before answering (checking)
    std::vector<size_t> created;            // new slots
    std::vector<std::string> notes;         // what changed, one line each (for the log)
  };
  // Applies a new member list: listed members keep their slot (same address, or same name for
  // one without address), one removed before is a member again, new ones get new slots
  // (checked when join_check), members not listed are removed. invalid_argument (nothing
  // changed) for an empty list, a member without address, an address or name listed twice, a
  // name another member has, more than kMaxSlots slots; not_supported with TP slices.
  Result<ListChange> apply_list(std::span<const FfnMember> list, bool join_check, int64_t now);
  // A member that could not be dialled or did not fit: removed again.
  void withdraw(const std::string& address);

  // connected[slot]: a live connection.
  FfnMembership snapshot(const std::vector<bool>& connected, uint32_t applied_epoch, int64_t now) const;

 private:
  int64_t n_experts_;
  int parts_;
  int takeover_ms_;
  std::vector<FfnMemberState> members_;
  uint32_t epoch_ = 0;
  int64_t takeovers_ = 0, rejoins_ = 0, leaves_ = 0;
  bool whole_experts_ = true;  // every FFN worker announced TP degree 1
  bool warned_tp_ = false;     // reported once that TP rules out re-homing
};

}  // namespace afd
