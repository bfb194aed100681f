// FfnClient: the attention side of AFD. An FfnBackend (runtime/ffn_backend.h) that sends
// each (layer, micro-batch) to the FFN workers over a comm::Transport and sums their
// replies (docs/PROTOCOL.md).
//
//   dispatch(layer, mb, b): quantises b.h to FP8 e4m3 (per-token or per-128 scales) and
//     sends every FFN worker one a2f frame holding the tokens routed to its experts (the
//     shared/dense holders get every token; a worker with no tokens gets an empty frame).
//     With tensor parallelism (FFN workers announcing TP degree t) every TP rank holding
//     a slice of an expert gets the token: all t ranks of each EP group holding one of its
//     experts, and all ranks of the shared/dense group when the layer has a shared expert
//     or is dense.
//     Returns once the sends are posted: the transfers progress on the transport's thread.
//   combine(layer, mb, b): waits (deadline: timeout_ms) for every worker's f2a reply and
//     writes b.ffn_out = sum of the BF16 partials (in f32).
//
// Threading contract: one engine thread drives a client (FfnBackend's contract): for each
// micro-batch, dispatch and combine strictly alternate, and dispatch(l, mb) follows
// combine(l - 1, mb). Different micro-batches interleave freely (dispatch mb0, dispatch
// mb1, combine mb0, ...), each using its own registered buffers — one send and one receive
// buffer per (micro-batch, FFN worker), allocated and registered once in create().
//
// Liveness: when no combine has succeeded for probe_interval_ms (an idle engine, or one
// whose passes fail), a probe thread pings every connected FFN worker on its own tag and
// buffers (never touching the data path's) and waits for the pong. An FFN worker whose pong
// is overdue by more than timeout_ms makes health() unavailable, naming it, until it answers:
// a stall is seen without a request having to time out on it first. One PeerProbe per FFN
// worker (runtime/afd/liveness.h); the hello and its checks: runtime/afd/handshake.h.
//
// Errors: a lost FFN worker, a stall past timeout_ms, a malformed reply or an FFN-side
// error frame make dispatch/combine return a Status naming the worker, layer and
// micro-batch; outstanding operations of that micro-batch are cancelled, and those of the
// pass's other micro-batches when the next forward pass starts, so it starts clean. A forward pass (dispatch of layer 0, micro-batch 0) first takes back
// any FFN worker that reconnected (handshake again); until then it fails with unavailable.
//
// Membership and expert re-homing (docs/PROTOCOL.md, "Expert re-homing"): the FFN workers
// are members (address + transport name), each with a stable slot (its bit in the routing
// masks, its order in the sum). The experts are cut into P parts (options.parts, default the
// y workers it starts with): part q is experts [q*E/P, (q+1)*E/P), part 0 also the shared
// expert and dense layers — the shards runtime/topology.h gives y = P workers. A part is the
// unit of BF16 rounding: each FFN worker replies one BF16 partial per part it holds, and the
// partials are added in f32 in part order, so results equal the monolithic engine's with
// --afd-rounding P whoever holds which part: a takeover or a rebalance does not change a
// single bit. Epoch 0 is what the workers were started with (their shards, one part each);
// every change starts a new epoch in which the k-th of n assigned members (in slot order)
// holds parts [k*P/n, (k+1)*P/n). At most P members are assigned; a reachable member beyond
// them is a standby, which joins when an assigned one leaves. A member leaves the assignment
// when it is unreachable (not connected, or a liveness probe unanswered) for takeover_ms
// while another assigned member is reachable (the survivors take over its parts), when it
// refuses its assignment, or when set_members() removes it; a reachable member that is not
// assigned (back after a loss, or added) joins while fewer than P are. Changes need whole
// experts: with FFN TP degree > 1 the membership stays as started (logged).
// The monitor thread (the probe thread) owns these decisions; the engine thread applies a
// new epoch at the next pass start: a hello carrying each assigned worker's range and the
// epoch, the coverage check, new routing masks. A pass that fails meanwhile is retried by
// the scheduler once health() is ok, which it is again once the unreachable worker has left.
//
// The parts: the decisions are FfnMembershipPolicy (runtime/afd/ffn_membership.h, pure), the
// routing and the a2f frame are pure functions (runtime/afd/ffn_routing.h); this class acts
// on them over the transport. ffn_client.cpp: creation and the data path (dispatch: check,
// start a pass, route, send to each worker; combine: receive from each worker);
// ffn_client_monitor.cpp: the monitor thread (transport events, probes, evaluation) and
// health(); ffn_client_connect.cpp: connecting, handshakes and applying an epoch at a pass
// start; ffn_client_members.cpp: set_members() and membership().
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/frame_buffer.h"
#include "comm/protocol.h"
#include "comm/transport.h"
#include "runtime/afd/expert_placement.h"
#include "runtime/afd/ffn_membership.h"
#include "runtime/afd/ffn_routing.h"
#include "runtime/afd/liveness.h"
#include "runtime/ffn_backend.h"
#include "runtime/topology.h"

namespace afd {

struct FfnClientOptions {
  int index = 0;        // this attention worker's index in [0, n_attention)
  int n_attention = 1;  // x of xAyF
  // FFN workers by peer name (their transport's local name), in shard order; the client
  // connect()s to `ffn_addresses[j]` when given (else the caller arranges connections).
  std::vector<std::string> ffn_names = {"ffn0"};
  std::vector<std::string> ffn_addresses;
  // The activation precision of this attention worker's engine (--precision): every FFN
  // worker must compute with the same one (the handshake refuses a mismatch both ways).
  comm::WirePrecision precision = comm::WirePrecision::f32;
  // Batch-invariant mode (EngineOptions::batch_invariant()): every FFN worker must run it too
  // (handshake).
  bool batch_invariant = false;
  int microbatches = 3;            // 1..16
  int64_t max_tokens = 256;        // most tokens in one micro-batch
  bool per_block_scales = false;   // per-128-channel scales instead of per-token
  bool payload_checksum = false;   // hash every payload (header is always checked)
  int timeout_ms = 10000;          // per combine wait
  // After a combine timed out (a stalled FFN worker: connected, not answering), health()
  // reports it until the FFN side answers again — a later combine succeeds, or (with probes)
  // an FFN worker answers a liveness ping after the stall — or for at most this long, so a
  // front end fails requests fast instead of letting each wait timeout_ms, and takes them
  // again as soon as the worker answers; past the hold, traffic probes the worker again.
  int stall_hold_ms = 5000;        // 0: health() reports connections only
  int connect_timeout_ms = 60000;  // create(): waiting for the FFN workers
  // Liveness probes: idle time (no successful combine) before a ping, and between pings;
  // a pong later than timeout_ms marks the worker stalled in health(). 0: no probes.
  int probe_interval_ms = 1000;
  // TP degree every FFN worker must announce (--ffn-tp); 0: accept what they announce (the
  // shard check below still requires every expert slice to be covered exactly once).
  int expect_tp = 0;
  // An assigned FFN worker unreachable for this long leaves the assignment; the others take
  // over its experts (class comment). 0: never (the bundle waits for it to come back).
  int takeover_ms = 0;
  // Parts (class comment): the unit of BF16 rounding, and the most FFN workers that share
  // the experts. 0: as many as the FFN workers it starts with (ffn_names).
  int parts = 0;
  // set_members(): how long it waits for a newly added FFN worker to connect so that it can
  // say hello to it before answering (a worker that refuses, e.g. another --precision, is not
  // added: the call fails naming why). One not connected by then is added unchecked (its
  // handshake when it joins the assignment checks it). 0: no check at the call.
  int join_check_ms = 2000;
  // Expert placement (--eplb; runtime/afd/expert_placement.h): from the first pass every FFN
  // worker computes the (token, expert) pairs it is sent, each replied as its own row and added
  // in expert order, so outputs do not depend on where experts run; the client places the
  // experts: contiguously at first and after every membership change, then every
  // eplb_interval_s (0: never) by EPLB over its own decayed routing counts, with
  // eplb_redundant extra replicas per layer (rounded up to divide over the FFN workers).
  bool expert_placement = false;
  double eplb_interval_s = 0;
  int64_t eplb_redundant = 0;
};

class FfnClient : public FfnBackend {
 public:
  // Connects to every FFN worker and runs the handshake (refused on any mismatch, with a
  // message naming it). `transport` is not owned and must outlive the client.
  static Result<std::unique_ptr<FfnClient>> create(std::shared_ptr<const ModelWeights> w,
                                                   comm::Transport* transport, FfnClientOptions opt);
  ~FfnClient() override;

  Status dispatch(int64_t layer, int microbatch, TokenBatch& b) override;
  Status combine(int64_t layer, int microbatch, TokenBatch& b) override;
  // unavailable while an FFN worker of the assignment is not connected (it may still be
  // handshaking after a reconnect: the next forward pass does that; with a takeover time the
  // message says when the others take over), while a liveness probe to one has been
  // unanswered for longer than timeout_ms, and for up to stall_hold_ms after a combine timed
  // out unless a combine succeeded or a pong arrived since. Thread-safe: reads the membership
  // (mu_), the transport's connection state, the probes' atomics and the stall record (stall_mu_).
  Status health() const override;

  // Replaces the FFN membership (thread-safe; the monitor thread and the next forward pass
  // apply it): members not listed leave (their addresses are no longer dialled), new ones are
  // connected to and join once reachable, one listed again that was removed before keeps its
  // slot. A new member that connects within join_check_ms is said hello to (epoch 0) before
  // the call returns; if it refuses or does not fit (another precision, model, x, ...) it is
  // withdrawn and the call fails with invalid_argument naming the mismatch (the rest of the
  // change stands). not_supported when the FFN workers hold TP slices (no re-homing);
  // invalid_argument for an empty list, an address or name given twice, a name another member
  // has, or more than 64 slots in all.
  Status set_members(std::vector<FfnMember> members);
  Status add_member(FfnMember m);
  // By address or name; not_found when no current member matches.
  Status remove_member(const std::string& address_or_name);
  // A snapshot (thread-safe).
  FfnMembership membership() const;

  // The expert range FFN worker (slot) j reported in its last handshake.
  const comm::Handshake& ffn_handshake(int j) const { return workers_[j].hs; }
  // Bit j set: FFN worker (slot) j holds a slice of expert e / of the shared-dense part.
  uint64_t expert_workers(int64_t e) const { return routing_.expert_workers[static_cast<size_t>(e)]; }
  uint64_t shared_workers() const { return routing_.shared_workers; }
  // Pongs received from FFN worker j so far (tests, stats).
  int64_t probes_answered(int j) const {
    return probes_ && static_cast<size_t>(j) < kMaxSlots ? probes_[static_cast<size_t>(j)].answered.load() : 0;
  }
  // Tokens sent to worker j in the last dispatch of micro-batch mb (tests, stats).
  int64_t last_sent_tokens(int mb, int j) const {
    return static_cast<size_t>(j) < slots_[mb].size() ? static_cast<int64_t>(slots_[mb][j].rows.size()) : 0;
  }

 private:
  using Share = FfnShare;
  using Member = FfnMemberState;
  static constexpr size_t kMaxSlots = FfnMembershipPolicy::kMaxSlots;
  // Engine thread: per slot, the connection it last handshook.
  struct Worker {
    std::string name;
    comm::PeerId peer = comm::kNoPeer;
    comm::Handshake hs;
    bool ready = false;    // handshake done on connection `gen` for epoch `epoch`
    uint64_t gen = 0;      // Member::conn_gen it was done on
    uint32_t epoch = 0;
    Share share;           // what it holds in that epoch
  };
  // One per (micro-batch, FFN worker).
  struct Slot {
    comm::FrameBuffer send, recv;
    std::vector<int32_t> rows;  // [n_j] token rows of the micro-batch sent to this worker
    // The token row of each reply row: `rows` when it holds one part; with several, per part
    // (in order) the tokens of `rows` that touch it.
    std::vector<int32_t> reply_rows;
    const uint16_t* reply = nullptr;  // expert placement: the received reply rows (until the next dispatch)
    comm::RequestId send_id = 0, recv_id = 0;
    bool send_live = false, recv_live = false;
    uint32_t layer = 0;
    uint64_t step = 0;
  };

  FfnClient(std::shared_ptr<const ModelWeights> w, comm::Transport* t, FfnClientOptions opt, int parts);

  // Data path (engine thread), in the order dispatch and combine run them.
  Status check_dispatch(int64_t layer, int mb, const TokenBatch& b) const;
  // Layer 0 of micro-batch 0: ends the last pass's leftovers, applies the membership.
  Status start_pass();
  Status check_ready(int mb) const;  // every worker of the applied assignment handshaken
  // Fills the micro-batch's slots' rows and reply rows (ffn_routing.h).
  Status route(int64_t layer, int mb, const TokenBatch& b);
  // Encodes slot j's a2f frame, posts its reply's receive and the send.
  Status send_to(int j, int64_t layer, int mb, const TokenBatch& b);
  // Waits for slot j's reply (dropping stale ones), adds it to b.ffn_out, waits for the send.
  Status receive_from(int j, int64_t layer, int mb, int64_t deadline, TokenBatch& b, uint32_t* slowest_ffn_us);
  // Ends the micro-batch, records a timeout as a stall, names where: s with that context.
  Status fail_combine(size_t j, int64_t layer, int mb, Status s);
  void abandon(int mb);  // cancels a micro-batch's outstanding operations and waits for them

  // Monitor thread (ffn_client_monitor.cpp).
  void probe_loop();
  // One pass over the workers at `now`: reaps pongs, sends due pings. Returns whether a
  // pong is awaited (the loop then polls again soon).
  bool probe_pass(int64_t now);
  void stop_probes();
  // Pops the transport's connect/disconnect events into the members (any thread).
  void pump_events();
  // Monitor: what the transport and the probes say of each member, then the policy's
  // verdict (a change starts a new epoch). mu_ held.
  void evaluate(int64_t now);
  // mu_ held: a new epoch over the assigned members, logged with why.
  void reassign(const std::string& why);
  // mu_ held: the policy's fit_to_parts(), each new standby logged.
  void fit_to_parts();
  bool probe_overdue(size_t slot, int64_t now) const;
  // mu_ held: [slot] connected, and not overdue on a probe (no peer lookup).
  std::vector<bool> reachable_now(int64_t now) const;
  void wake_monitor();

  // Connections and handshakes (ffn_client_connect.cpp).
  Status connect_all();
  // Handshake with slot j for `epoch` (0: its start-up shard; else `assign`). *refused: the
  // worker answered and said no (or acknowledged something else), as opposed to a lost
  // connection or a timeout.
  Status handshake(int j, uint32_t epoch, const Share& assign, bool* refused);
  Status refresh_connections();
  // Every routed expert and the shared/dense part must be covered by the assigned workers'
  // (range, TP slice) claims exactly once (build_routing_masks).
  Status check_shards();
  // Engine thread: workers_/slots_ hold slot j, its reply buffers room for `rows_per_token`
  // rows per token (one per part a token can touch).
  Status ensure_slot(size_t j, int64_t rows_per_token = 1);
  // n_ffn < 0: the applied assignment's size (engine thread only).
  comm::Handshake my_handshake(uint32_t epoch = 0, const Share* assign = nullptr, int n_ffn = -1) const;

  // Membership changes (ffn_client_members.cpp).
  // set_members(): says hello (epoch 0) to the new members of `slots` (Member::checking) that
  // connect before `deadline_ns`. Returns the slots that refused or do not fit, with why.
  std::vector<std::pair<size_t, std::string>> check_new_members(const std::vector<size_t>& slots, int64_t deadline_ns);
  // One hello (epoch 0) to `peer` on fresh buffers and the check of its answer: invalid_argument
  // (or the refusal) when it does not fit; ok when it fits or did not answer in timeout_ms.
  Status hello_check(comm::PeerId peer, const std::string& who, int n_ffn);

  std::shared_ptr<const ModelWeights> w_;
  comm::Transport* t_;
  FfnClientOptions opt_;
  uint64_t fingerprint_ = 0;
  // Last combine that succeeded / timed out (now_ns()), and why it timed out.
  std::atomic<int64_t> last_ok_ns_{0}, last_stall_ns_{0};
  std::atomic<int64_t> last_pong_ns_{0};  // now_ns() when a liveness pong last arrived
  mutable std::mutex stall_mu_;
  std::string last_stall_;  // stall_mu_

  // Membership (mu_): read by health() and membership() from any thread, changed by the
  // monitor thread, set_members() and the engine thread (a refused handshake, epoch-0 ranges).
  // Its parts() is fixed at construction (read without mu_).
  mutable std::mutex mu_;
  FfnMembershipPolicy membership_;
  std::atomic<uint32_t> applied_epoch_atomic_{0};
  std::mutex events_mu_;         // one thread pops transport events at a time

  // Engine thread.
  std::vector<Worker> workers_;           // [slot]
  std::vector<int> active_;               // slots of the applied assignment, in slot order
  uint32_t applied_epoch_ = 0;
  std::vector<std::vector<Slot>> slots_;  // [microbatches][slot]
  FfnRouting routing_;                     // of the applied assignment
  std::vector<uint64_t> token_workers_;    // dispatch scratch: [n] bit j: slot j gets the token
  std::vector<uint64_t> token_parts_;      // dispatch scratch: [n] bit q: the token touches part q
  // Expert placement (engine thread): the placement in effect, the routing counts it is
  // planned from, the last plan's time, and per micro-batch the slots' routes.
  ExpertPlacement placement_;
  std::unique_ptr<ExpertLoadCounter> load_;
  int64_t last_plan_ns_ = 0;
  std::vector<std::vector<PlacedSlot>> placed_;  // [microbatches][index in active_]
  std::vector<std::vector<int64_t>> placed_turn_;  // [layer][expert]: pairs routed so far (replicas in turn)
  std::vector<const uint16_t*> placed_replies_;  // combine scratch
  std::vector<int> placement_slots_;  // the active_ placement_ was made for
  // Placement (pass start): contiguous over active_ when it changed; a plan when one is due.
  Status update_placement();
  // mu_: what membership() reports of the placements.
  int64_t placements_ = 0;
  double placement_contiguous_ = 1, placement_planned_ = 1;
  uint64_t step_ = 0;
  int64_t f2a_bytes_ = 0, a2f_bytes_ = 0;  // frame buffer sizes (f2a: one row per token)
  std::vector<int64_t> recv_rows_;         // [slot]: reply rows per token its receive buffers hold

  // Monitor (probe) thread.
  std::unique_ptr<PeerProbe[]> probes_;  // [kMaxSlots]; their buffers made by the monitor thread at first use
  std::thread prober_;
  std::mutex probe_mu_;
  std::condition_variable probe_cv_;
  bool probe_stop_ = false;  // probe_mu_
  bool probe_poke_ = false;  // probe_mu_: evaluate now (set_members)
};

}  // namespace afd
