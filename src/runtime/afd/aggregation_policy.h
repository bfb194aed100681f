// AggregationPolicy: the FFN worker's batching decisions (runtime/afd/ffn_worker.h,
// "Aggregation"), as a pure unit: which (layer, micro-batch) batch it serves next, which
// attention workers that batch waits for and until when, what happens to those that did not
// come, and how serving a batch moves each attention worker's expectation on. It reads and
// writes AggSlot records only: no transport, no threads, no clock (times are passed in, in
// nanoseconds of any monotonic clock).
//
// The view (AggGrid) is indexed [attention worker][micro-batch]; an attention worker that is
// not served (no accepted handshake, lost, dropped) has an empty row. Rows are not owned.
//
// Policy:
//   - next batch: the ready frame of the lowest layer (older work first); ties go to the
//     first attention worker at or after `rotate` (callers advance it per batch, so no
//     attention worker is favoured).
//   - catch-up: before serving it, the batch waits (up to peer_timeout) for the attention
//     workers mid-step *behind* it on that micro-batch (they will send a lower layer next),
//     which are then served first: this brings attention workers into lockstep. One that
//     does not come is late: no longer expected mid-step.
//   - gather: at layer > 0 the batch waits (up to peer_timeout) for every attention worker
//     that expects that layer on that micro-batch; past it, those are late (served on their
//     own when their frame comes). At layer 0 it waits up to gather_window for the idle
//     attention workers that finished a step on that micro-batch last time; one that does
//     not come in the window is not waited for again until it finishes a step there (an
//     empty or idle micro-batch delays the others once, not every step).
//   - served: a member expects the next layer, or (after the last layer) is idle and active
//     last step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace afd {

// What the policy knows of one (attention worker, micro-batch).
struct AggSlot {
  bool ready = false;            // a decoded frame waits to be served
  uint32_t layer = 0;            // the waiting frame's layer (when ready)
  bool receiving = false;        // a receive is posted: a frame can still arrive
  int expect_layer = -1;         // the layer expected next, mid-step; -1: idle
  bool active_last_step = false; // finished its last layer here in its last step
};

// [attention worker][micro-batch]; an empty row: not served.
using AggGrid = std::vector<std::vector<AggSlot*>>;

// One batch: the frame that chose it (attention worker `peer`), its micro-batch and layer.
struct BatchKey {
  size_t peer = 0;
  int mb = 0;
  uint32_t layer = 0;
};

class AggregationPolicy {
 public:
  // n_layers >= 1; timeouts >= 0.
  AggregationPolicy(uint32_t n_layers, int64_t peer_timeout_ns, int64_t gather_window_ns);

  // The batch to serve next; none when no frame is ready.
  std::optional<BatchKey> next_batch(const AggGrid& g, size_t rotate) const;

  // Catch-up: the attention workers (other than key.peer) mid-step behind key.layer on
  // key.mb whose frame can still arrive, and the deadline of that wait begun at start_ns.
  std::vector<size_t> behind(const AggGrid& g, const BatchKey& key) const;
  int64_t catch_up_deadline(int64_t start_ns) const { return start_ns + peer_timeout_ns_; }
  // After the catch-up wait: those still behind are late (no longer expected mid-step).
  // Returns them.
  std::vector<size_t> give_up_behind(const AggGrid& g, const BatchKey& key) const;

  // Gather: the attention workers (other than key.peer) the batch waits for, whose frame can
  // still arrive; the deadline of that wait begun at start_ns.
  std::vector<size_t> waiting_for(const AggGrid& g, const BatchKey& key) const;
  int64_t gather_deadline(uint32_t layer, int64_t start_ns) const {
    return start_ns + (layer > 0 ? peer_timeout_ns_ : gather_window_ns_);
  }
  // Whether a wait with this deadline goes on at `now_ns` for `waiting` attention workers.
  static bool keep_waiting(const std::vector<size_t>& waiting, int64_t deadline_ns, int64_t now_ns) {
    return !waiting.empty() && now_ns < deadline_ns;
  }
  struct GatherEnd {
    std::vector<size_t> late;     // layer > 0: no longer expected mid-step
    std::vector<size_t> skipped;  // layer 0: not waited for at layer 0 until they finish a step here
  };
  // After the gather wait: what becomes of the attention workers still expected.
  GatherEnd end_gather(const AggGrid& g, const BatchKey& key) const;

  // The attention workers whose ready frame on key.mb is for key.layer: the batch's members.
  std::vector<size_t> members(const AggGrid& g, const BatchKey& key) const;
  // A member was served at `layer`: its expectation moves on (class comment).
  void served(AggSlot& s, uint32_t layer) const;
  // A (new or repeated) handshake, or a lost attention worker: idle, not expected.
  static void reset(AggSlot& s) {
    s.expect_layer = -1;
    s.active_last_step = false;
  }

 private:
  static const AggSlot* slot(const AggGrid& g, size_t peer, int mb);
  bool is_behind(const AggSlot& s, uint32_t layer) const;
  bool is_expected(const AggSlot& s, uint32_t layer) const;

  uint32_t n_layers_;
  int64_t peer_timeout_ns_, gather_window_ns_;
};

}  // namespace afd
