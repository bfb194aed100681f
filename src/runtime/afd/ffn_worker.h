// FfnWorker: the FFN side of AFD. Serves x attention workers over a comm::Transport: for
// every (layer, micro-batch) it gathers the a2f frames of all attention workers in the
// middle of that step into one aggregated batch, runs ffn_part over its expert shard, and
// sends each attention worker its BF16 rows back (docs/PROTOCOL.md).
//
// Buffers: at each attention worker's handshake, one receive and one send buffer per
// (micro-batch, attention worker), sized by its max_tokens, are allocated and registered
// once; every step only posts. Frames are dequantised straight from their receive buffers
// into the aggregated f32 batch (the only copy).
//
// Aggregation: the worker tracks, per attention worker and micro-batch, the layer it
// expects next. A batch for (layer, mb) waits for every attention worker that is in the
// middle of a step on that micro-batch (up to peer_timeout_ms; a straggler past that is
// logged and served on its own later), and at layer 0 for up to gather_window_us for
// attention workers that were active in their previous step. These decisions are
// AggregationPolicy's (runtime/afd/aggregation_policy.h); serve_one runs them as steps.
//
// Liveness: from the moment an attention worker connects (before its handshake), a ping on
// the probe tag is answered with a pong from this loop — between batches and while it
// waits for stragglers — so an attention worker can tell a silent FFN worker from an idle one
// (runtime/afd/liveness.h). The hello checks shared with the attention side: runtime/afd/handshake.h.
//
// Expert assignment (docs/PROTOCOL.md, "Expert re-homing"): an attention worker's hello says
// what this worker holds *for it*: epoch 0, the experts it was started with (its shard);
// epoch >= 1, an explicit range of whole experts (+ shared/dense), which may lie outside the
// start-up shard — every expert's weights are views into the checkpoint's mmap, so taking
// over another worker's experts only maps more pages (prefetched when adopted). A worker with
// TP degree > 1 holds sliced copies and refuses any assignment but epoch 0. An attention
// worker may say hello again on the same connection (a new epoch): frames of its abandoned
// pass are dropped, and an a2f frame stamped with another epoch than the peer's current one
// is answered with an error frame. Attention workers with different assignments (one of them
// mid-change) are computed in one ffn_part call per distinct assignment.
//
// Faults: a malformed frame is answered with an error frame (the attention side gets a
// clear Status) and logged; a lost attention worker is dropped from aggregation and taken
// back, after a new handshake, when it reconnects. None of these stop the worker.
//
// Threading: run() blocks the calling thread until *stop becomes true (checked at least
// every 50 ms); ffn_part uses `pool` (or the GPU: FfnWorkerOptions::device). Stats may be read from other threads.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/frame_buffer.h"
#include "comm/protocol.h"
#include "comm/transport.h"
#include "core/thread_pool.h"
#include "model/ffn_part.h"
#include "runtime/afd/aggregation_policy.h"
#include "runtime/afd/liveness.h"
#include "runtime/stage_emulation.h"

namespace afd {

struct FfnWorkerOptions {
  int index = 0;        // this FFN worker's shard index in [0, n_ffn)
  int n_ffn = 1;        // y of xAyF
  int n_attention = 1;  // x of xAyF: attention workers expected at start (more may join: any index not served)
  // Routed experts held: [expert_begin, expert_end); expert_end < 0 means the contiguous
  // shard index*E/n_ffn .. (index+1)*E/n_ffn (runtime/topology.h).
  int64_t expert_begin = 0, expert_end = -1;
  int holds_shared = -1;          // shared expert + dense layers; -1: EP group 0
  // Tensor-parallel degree t (divides n_ffn; runtime/topology.h): this worker is TP rank
  // index % t of EP group index / t, holding the intermediate slice rank of its experts.
  // The default expert range is then its group's (of n_ffn / t groups). With t > 1 the
  // worker keeps a TP-sliced copy of the FFN weights (slice_ffn_tp: down columns copied once).
  int tp = 1;
  // Activation precision (--precision), announced in the handshake: an attention worker that
  // computes with another one is refused (comm::check_handshake_match).
  kernels::ActPrecision prec = kernels::ActPrecision::f32;
  // Batch-invariant products (--deterministic, and always with f32 activations:
  // EngineOptions::batch_invariant()), announced in the handshake like prec.
  bool batch_invariant = false;
  // "cuda": compute the held experts on the GPU (runtime/cuda_ffn.h; create() fails with the
  // reason when that is unavailable). A CUDA error while serving is logged and the worker
  // continues on the CPU. "cpu": ffn_part with `prec`.
  std::string device = "cpu";
  int peer_timeout_ms = 10000;    // waiting for a mid-step attention worker's frame
  int gather_window_us = 2000;    // layer 0: waiting for attention workers active last step
  // Optional: emulated FFN cost after each batch, inside its compute time (runtime/stage_emulation.h).
  std::shared_ptr<StageCostEmulation> emulation;
  // Optional: called on the worker thread after every ffn_part batch (tracing).
  std::function<void(int64_t layer, int microbatch, int64_t t0_ns, int64_t t1_ns, int64_t tokens)> on_batch;
};

class TraceRecorder;
// Tracing an FFN worker: names lane TraceRecorder::kFfnPid + o->index "ffn <index>" and sets
// o->on_batch to record each batch there as an "ffn" span, one thread per micro-batch (the
// same lanes in-process bundles and FFN worker processes use, so their traces merge).
void trace_ffn_batches(std::shared_ptr<TraceRecorder> trace, FfnWorkerOptions* o);

// Written by the worker thread only; any thread may read (GET /metrics of an FFN worker
// process: serve/metrics/ffn_metrics.h).
struct FfnWorkerStats {
  std::atomic<int64_t> batches{0};        // ffn_part calls
  std::atomic<int64_t> frames{0};         // a2f frames served
  std::atomic<int64_t> tokens{0};         // tokens computed
  std::atomic<int64_t> expert_rows{0};    // (token, routed expert) pairs computed: its share of the EP load
  std::atomic<int64_t> multi_peer_batches{0};  // batches aggregating > 1 attention worker
  std::atomic<int64_t> bad_frames{0};     // malformed frames answered with an error frame
  std::atomic<int64_t> refused{0};        // handshakes refused
  std::atomic<int64_t> ffn_ns{0};         // time in ffn_part
  std::atomic<int64_t> started_ns{0};     // now_ns() when run() began; 0 before
  std::atomic<int64_t> attention_serving{0};  // attention workers whose handshake was accepted, now
  std::atomic<int64_t> peer_losses{0};    // accepted attention workers lost (disconnect, replaced)
  std::atomic<int64_t> late_peers{0};     // an expected frame later than peer_timeout_ms: served without it
  std::atomic<int64_t> probes{0};         // liveness pings answered
  std::atomic<int64_t> reassignments{0};  // hellos that changed an attention worker's expert assignment
  std::atomic<int64_t> stale_frames{0};   // a2f frames of another assignment epoch (answered with an error)
  std::atomic<int64_t> held_experts{0};   // routed experts held for the last attention worker that said hello
  // Tokens routed to each (layer, routed expert) that this worker computed: the load counts of
  // expert placement (plan/eplb.h). [n_layers * n_experts], row-major by layer; dense layers
  // stay 0. With FFN TP only rank 0 of a group counts, so the sum over workers counts each
  // token once per routed expert. Empty (n_experts == 0) for a dense model.
  int64_t n_layers = 0, n_experts = 0;
  std::unique_ptr<std::atomic<int64_t>[]> expert_tokens;
  int64_t expert_tokens_at(int64_t layer, int64_t expert) const {
    return expert_tokens[static_cast<size_t>(layer * n_experts + expert)].load(std::memory_order_relaxed);
  }
  // Tokens per aggregated batch: batch_tokens[i] counts batches of at most 2^i tokens
  // (and more than 2^(i-1)); the last bucket holds everything larger (non-cumulative).
  static constexpr int kTokenBuckets = 15;  // 1, 2, 4, ..., 8192, more
  std::atomic<int64_t> batch_tokens[kTokenBuckets] = {};
  static int token_bucket(int64_t n) {
    int b = 0;
    while (b + 1 < kTokenBuckets && (int64_t{1} << b) < n) ++b;
    return b;
  }
};

class FfnWorker {
 public:
  // `transport` is not owned and must outlive the worker; it should already listen.
  static Result<std::unique_ptr<FfnWorker>> create(std::shared_ptr<const ModelWeights> w, comm::Transport* transport,
                                                   FfnWorkerOptions opt, ThreadPool* pool);
  ~FfnWorker();

  // Serves until *stop is true. Returns ok on stop; errors only for local failures
  // (e.g. out of memory registering buffers), never for a peer's misbehaviour.
  Status run(const std::atomic<bool>* stop);

  const FfnWorkerStats& stats() const { return stats_; }
  const comm::Handshake& handshake() const { return mine_; }
  const FfnWorkerOptions& options() const { return opt_; }

 private:
  // The experts held for one attention worker (its last accepted hello): one part (the
  // start-up shard at epoch 0, or one part of n_parts) or several consecutive parts, each
  // computed, rounded and replied separately.
  struct Part {
    int64_t begin = 0, end = 0;  // routed experts [begin, end)
    bool shared = false;         // + the shared expert / dense layers
    std::vector<uint8_t> mask;   // [n_experts]
  };
  struct Assignment {
    uint32_t epoch = 0;          // 0: the start-up shard
    int64_t begin = 0, end = 0;  // routed experts [begin, end) (all parts)
    bool shared = false;         // shared expert / dense layers
    std::vector<uint8_t> mask;   // [n_experts]
    int n_parts = 0, part_begin = 0, part_end = 0;  // epoch >= 1: parts [part_begin, part_end) of n_parts
    std::vector<Part> parts;     // [part_end - part_begin]; one entry at epoch 0
    // Expert placement (comm::Handshake::placement): every pair a frame names is computed and
    // replied on its own (compute_placed); parts is empty.
    bool placement = false;
    // The same routed experts and shared part (however cut into parts).
    bool same_range(const Assignment& o) const {
      return begin == o.begin && end == o.end && shared == o.shared && placement == o.placement;
    }
    // The same experts cut into the same parts: computed and replied the same way.
    bool same_experts(const Assignment& o) const {
      return begin == o.begin && end == o.end && shared == o.shared && n_parts == o.n_parts &&
             part_begin == o.part_begin && part_end == o.part_end && placement == o.placement;
    }
  };
  struct MbSlot {
    comm::FrameBuffer recv, send;
    comm::RequestId recv_id = 0, send_id = 0;
    bool send_live = false;
    // Aggregation state: agg.receiving (the receive recv_id is posted), agg.ready (a frame
    // arrived, decoded into `view`, and waits to be served), the expected layer
    // (runtime/afd/aggregation_policy.h).
    AggSlot agg;
    size_t bytes = 0;
    comm::A2fView view;       // valid when agg.ready
  };
  struct Peer {
    comm::PeerId id = comm::kNoPeer;
    std::string name;
    bool connected = false;
    bool serving = false;     // handshake accepted
    comm::Handshake hs;
    Assignment assign;
    comm::FrameBuffer hello_in, hello_out;
    comm::RequestId hello_id = 0;
    bool hello_live = false;
    ProbeBuffers probe;       // liveness: the ping received, the pong answered
    comm::RequestId ping_id = 0, pong_id = 0;
    bool ping_live = false, pong_live = false;
    std::vector<MbSlot> mbs;
  };

  FfnWorker(std::shared_ptr<const ModelWeights> w, comm::Transport* t, FfnWorkerOptions opt, ThreadPool* pool);
  Peer& peer_state(comm::PeerId id, const std::string& name);
  void handle_events();
  Status post_hello(Peer& p);
  Status on_hello(Peer& p, const comm::Completion& c);
  // What the hello asks this worker to hold; invalid_argument (a refusal) when it cannot.
  Result<Assignment> assignment_for(const comm::Handshake& theirs) const;
  // Ends every posted receive and send of p's micro-batch slots (before reallocating them).
  void end_mb_ops(Peer& p);
  // Reply rows per token at most for an assignment: 1 for one part, else the parts a token
  // can touch (at most top_k routed parts + the shared part).
  int64_t rows_per_token(const Assignment& a) const;
  Status post_frame_recv(Peer& p, int mb);
  Status post_ping_recv(Peer& p);
  void answer_ping(Peer& p, const comm::Completion& c);  // a completed ping receive: pong, re-post
  void poll_frames();
  bool accept_frame(Peer& p, int mb);  // decodes a completed receive; false if it was bad (answered)
  void send_error(Peer& p, int mb, uint32_t layer, uint64_t step, const std::string& why);
  void drop_peer(Peer& p, const std::string& why);
  // Waits (up to peer_timeout_ms, then cancels) for a send posted from a buffer about to be
  // reused; *live becomes false.
  void wait_send(comm::RequestId id, bool* live);
  // Gathers and serves one batch if any frame is ready; returns whether it did. The steps
  // below, in order; the decisions are policy_'s.
  bool serve_one(const std::atomic<bool>* stop);
  // One aggregated frame of a batch: its rows [off, off + n) of the batch.
  struct Member {
    Peer* p;
    int64_t off, n;
    uint64_t step;
  };
  // A computed batch: when ffn_part ran, the reply rows per member, (token, expert) rows.
  struct Computed {
    int64_t t0 = 0, t1 = 0;
    std::vector<int64_t> reply_rows;  // [members]
    int64_t expert_rows = 0;
  };
  AggGrid agg_grid();  // policy_'s view of peers_ (index = position in peers_)
  // Polls frames and events until pending(view) is empty, `deadline` (now_ns()) passes or
  // *stop; waits on the receives of micro-batch mb of the pending peers. Whether it waited.
  bool wait_for_peers(const std::function<std::vector<size_t>(const AggGrid&)>& pending, int mb, int64_t deadline,
                      const std::atomic<bool>* stop);
  // The next batch, after the catch-up wait for attention workers behind it.
  std::optional<BatchKey> choose_batch(const std::atomic<bool>* stop);
  // Waits for the other attention workers the batch expects; logs and counts the late ones.
  void gather(const BatchKey& key, const std::atomic<bool>* stop);
  // The batch's members (sorted so equal assignments are contiguous), their frames
  // dequantised into h_/ids_/wts_, their next receives posted and previous sends done.
  std::vector<Member> load_batch(const BatchKey& key);
  // ffn_part (or the GPU) over rows [off, off + n) for an assignment of one part: out_.
  // Returns the (token, held expert) rows computed.
  int64_t compute_one_part(const Assignment& a, uint32_t layer, int64_t off, int64_t n);
  // Expert placement: the frames of members [first, end) (tokens [off, off + n) of h_) pair by
  // pair, written into their reply payloads (reply_rows: rows written per member). Returns
  // the (token, routed expert) pairs computed.
  int64_t compute_placed(const Assignment& a, uint32_t layer, int mb, const std::vector<Member>& members, size_t first,
                         size_t end, int64_t off, int64_t n, std::vector<int64_t>* reply_rows);
  // Several parts: each computed and written as its own reply rows of members [first, end).
  int64_t compute_parts(const Assignment& a, uint32_t layer, int mb, const std::vector<Member>& members, size_t first,
                        size_t end, int64_t off, int64_t n, std::vector<int64_t>* reply_rows);
  // Computes every group of members with one assignment and writes the BF16 reply payloads.
  Computed compute(const BatchKey& key, const std::vector<Member>& members);
  void count_batch(const BatchKey& key, const std::vector<Member>& members, const Computed& c);  // stats_, on_batch
  void count_expert_tokens(uint32_t layer, const std::vector<Member>& members);  // stats_.expert_tokens
  // Posts each member's reply and moves its expectation on (policy_.served).
  void send_replies(const BatchKey& key, const std::vector<Member>& members, const Computed& c);
  uint16_t* reply_payload(const Member& m, int mb) {
    return reinterpret_cast<uint16_t*>(m.p->mbs[static_cast<size_t>(mb)].send.data() + comm::kFrameHeaderBytes);
  }

  std::shared_ptr<const ModelWeights> w_;
  comm::Transport* t_;
  FfnWorkerOptions opt_;
  ThreadPool* pool_;
  comm::Handshake mine_;
  Assignment static_;  // the start-up shard (epoch 0)
  AggregationPolicy policy_;
  FfnPartOptions part_;
  comm::A2fLimits limits_;
  std::vector<std::unique_ptr<Peer>> peers_;
  size_t rotate_ = 0;  // serve_one: the peer its scan starts at (ties rotate over peers_)
  FfnScratch scratch_;
  std::unique_ptr<class CudaFfn> gpu_;  // device == "cuda"
  std::vector<float> h_, out_;        // [total, hidden]
  // compute_placed: pairs bucketed by expert, the gathered rows, weights and results.
  std::vector<int32_t> placed_start_, placed_pairs_, placed_ids_;
  std::vector<float> placed_h_, placed_w_, placed_out_;
  std::vector<int32_t> ids_;          // [total, top_k]
  std::vector<float> wts_;            // [total, top_k]
  FfnWorkerStats stats_;
  bool count_experts_ = false;  // this worker adds to stats_.expert_tokens (TP rank 0 of a MoE model)
};

}  // namespace afd
