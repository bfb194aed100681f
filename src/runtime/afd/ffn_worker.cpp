#include "runtime/afd/ffn_worker.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <tuple>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/cpu/ops.h"
#include "model/fingerprint.h"
#include "model/weights.h"
#include "runtime/afd/handshake.h"
#include "runtime/afd/liveness.h"
#include "runtime/afd/transport_ops.h"
#include "runtime/cuda_ffn.h"
#include "runtime/topology.h"
#include "runtime/trace.h"

namespace afd {

using namespace comm;

FfnWorker::FfnWorker(std::shared_ptr<const ModelWeights> w, Transport* t, FfnWorkerOptions opt, ThreadPool* pool)
    : w_(std::move(w)),
      t_(t),
      opt_(opt),
      pool_(pool),
      policy_(static_cast<uint32_t>(w_->config.n_layers), int64_t{opt_.peer_timeout_ms} * 1000000,
              int64_t{opt_.gather_window_us} * 1000) {}

FfnWorker::~FfnWorker() {
  for (auto& p : peers_) drop_peer(*p, "worker shutting down");
}

void trace_ffn_batches(std::shared_ptr<TraceRecorder> trace, FfnWorkerOptions* o) {
  const int pid = TraceRecorder::kFfnPid + o->index;
  trace->name_process(pid, "ffn " + std::to_string(o->index));
  o->on_batch = [tr = std::move(trace), pid](int64_t layer, int mb, int64_t t0, int64_t t1, int64_t tokens) {
    tr->span("ffn", pid, 1 + mb, t0, t1, layer, mb, tokens);
  };
}

Result<std::unique_ptr<FfnWorker>> FfnWorker::create(std::shared_ptr<const ModelWeights> w, Transport* transport,
                                                     FfnWorkerOptions opt, ThreadPool* pool) {
  if (!w || transport == nullptr) return invalid_argument("ffn worker: no model or no transport");
  const ModelConfig& c = w->config;
  if (opt.n_ffn < 1 || opt.n_ffn > 64 || opt.index < 0 || opt.index >= opt.n_ffn) {
    return invalid_argument("ffn worker: shard " + std::to_string(opt.index) + "/" + std::to_string(opt.n_ffn) +
                            " is not valid");
  }
  if (opt.n_attention < 1 || opt.n_attention > 1024) return invalid_argument("ffn worker: n_attention must be 1..1024");
  if (opt.tp < 1 || opt.tp > 64 || opt.n_ffn % opt.tp != 0) {
    return invalid_argument("ffn worker: FFN TP degree " + std::to_string(opt.tp) + " does not divide the " +
                            std::to_string(opt.n_ffn) + " FFN workers");
  }
  const ExpertRange range = ffn_shard_range(opt.index, opt.n_ffn, opt.tp, c.n_experts);
  if (opt.expert_end < 0) {
    opt.expert_begin = range.begin;
    opt.expert_end = range.end;
  }
  if (opt.expert_begin < 0 || opt.expert_begin > opt.expert_end || opt.expert_end > c.n_experts) {
    return invalid_argument("ffn worker: expert range [" + std::to_string(opt.expert_begin) + ", " +
                            std::to_string(opt.expert_end) + ") outside the model's " + std::to_string(c.n_experts) +
                            " experts");
  }
  if (opt.holds_shared < 0) opt.holds_shared = range.holds_shared ? 1 : 0;
  // The fingerprint is the whole model's (the attention side has the unsliced weights).
  const uint64_t fingerprint = model_fingerprint(*w);
  if (opt.tp > 1) {
    FfnTpSlice sl;
    sl.rank = range.tp_rank;
    sl.degree = opt.tp;
    sl.expert_begin = opt.expert_begin;
    sl.expert_end = opt.expert_end;
    sl.include_shared = opt.holds_shared != 0;
    auto sliced = slice_ffn_tp(w, sl);
    if (!sliced.ok()) return sliced.status().with_context("ffn worker " + std::to_string(opt.index));
    w = *sliced;
  }
  std::unique_ptr<FfnWorker> wk(new FfnWorker(w, transport, opt, pool));
  Handshake& h = wk->mine_;
  h = model_handshake(c, fingerprint, Role::ffn, wire_precision(opt.prec));
  h.batch_invariant = opt.batch_invariant ? 1 : 0;
  h.index = static_cast<uint16_t>(opt.index);
  h.n_attention = static_cast<uint16_t>(opt.n_attention);
  h.n_ffn = static_cast<uint16_t>(opt.n_ffn);
  h.expert_begin = static_cast<uint32_t>(opt.expert_begin);
  h.expert_end = static_cast<uint32_t>(opt.expert_end);
  h.holds_shared = static_cast<uint8_t>(opt.holds_shared ? 1 : 0);
  h.tp_rank = static_cast<uint16_t>(range.tp_rank);
  h.tp_degree = static_cast<uint16_t>(opt.tp);
  wk->part_.prec = opt.prec;
  wk->part_.order = kernels::linear_order(opt.batch_invariant);
  wk->part_.include_shared = opt.holds_shared != 0;
  wk->part_.experts_mask.assign(static_cast<size_t>(c.n_experts), 0);
  for (int64_t e = opt.expert_begin; e < opt.expert_end; ++e) wk->part_.experts_mask[static_cast<size_t>(e)] = 1;
  wk->static_.begin = opt.expert_begin;
  wk->static_.end = opt.expert_end;
  wk->static_.shared = opt.holds_shared != 0;
  wk->static_.mask = wk->part_.experts_mask;
  wk->static_.parts = {Part{wk->static_.begin, wk->static_.end, wk->static_.shared, wk->static_.mask}};
  wk->stats_.held_experts = opt.expert_end - opt.expert_begin;
  if (c.n_experts > 0) {
    wk->stats_.n_layers = c.n_layers;
    wk->stats_.n_experts = c.n_experts;
    wk->stats_.expert_tokens = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(c.n_layers * c.n_experts));
    wk->count_experts_ = range.tp_rank == 0;
  }
  wk->limits_ = A2fLimits{h.hidden, h.top_k, h.n_experts, 0};
  if (opt.device == "cuda") {
    CudaFfnOptions co;
    co.experts_mask = wk->part_.experts_mask;
    co.include_shared = wk->part_.include_shared;
    co.slots = 1;
    auto gpu = CudaFfn::create(wk->w_, co);
    if (!gpu.ok()) return gpu.status().with_context("ffn worker " + std::to_string(opt.index) + " --ffn-device cuda");
    wk->gpu_ = std::move(*gpu);
    spdlog::info("ffn worker {}: experts on {} ({} MiB of weights on the device)", opt.index, wk->gpu_->device_name(),
                 wk->gpu_->weight_bytes() >> 20);
  } else if (opt.device != "cpu") {
    return invalid_argument("ffn worker: device must be cpu or cuda, got '" + opt.device + "'");
  }
  spdlog::info("ffn worker {}: {} on transport '{}'", opt.index, describe(h), transport->local_name());
  return wk;
}

FfnWorker::Peer& FfnWorker::peer_state(PeerId id, const std::string& name) {
  for (auto& p : peers_) {
    if (p->id == id) return *p;
  }
  peers_.push_back(std::make_unique<Peer>());
  peers_.back()->id = id;
  peers_.back()->name = name;
  return *peers_.back();
}

void FfnWorker::handle_events() {
  PeerEvent ev;
  while (t_->next_event(&ev, 0)) {
    Peer& p = peer_state(ev.peer, ev.name);
    if (ev.kind == PeerEventKind::disconnected) {
      if (p.serving) spdlog::warn("ffn worker {}: attention peer '{}' lost: {}", opt_.index, p.name, ev.detail);
      drop_peer(p, ev.detail);
      continue;
    }
    drop_peer(p, "reconnected");
    p.connected = true;
    Status s = post_hello(p);
    if (s.is_ok()) s = post_ping_recv(p);
    if (!s.is_ok()) spdlog::error("ffn worker {}: peer '{}': {}", opt_.index, p.name, s.to_string());
  }
}

Status FfnWorker::post_hello(Peer& p) {
  if (p.hello_in.data() == nullptr) {
    AFD_ASSIGN_OR_RETURN(p.hello_in, FrameBuffer::create(t_, kFrameHeaderBytes + kMaxReasonBytes));
    AFD_ASSIGN_OR_RETURN(p.hello_out, FrameBuffer::create(t_, kFrameHeaderBytes + kMaxReasonBytes));
  }
  AFD_ASSIGN_OR_RETURN(p.hello_id, t_->post_recv(p.id, handshake_tag(), p.hello_in.data(), p.hello_in.capacity()));
  p.hello_live = true;
  return Status();
}

Result<FfnWorker::Assignment> FfnWorker::assignment_for(const Handshake& h) const {
  if (h.epoch == 0) return static_;
  if (opt_.tp > 1) {
    return invalid_argument("assignment epoch " + std::to_string(h.epoch) + " asks for experts [" +
                            std::to_string(h.expert_begin) + ", " + std::to_string(h.expert_end) +
                            "), but this FFN worker holds TP slice " + std::to_string(mine_.tp_rank) + "/" +
                            std::to_string(opt_.tp) +
                            " of its start-up shard only: expert re-homing needs whole experts (--ffn-tp 1)");
  }
  // decode_handshake checked the parts and that the expert range and shared flag match them.
  const int64_t E = w_->config.n_experts;
  Assignment a;
  a.placement = h.placement != 0;
  a.epoch = h.epoch;
  a.begin = h.expert_begin;
  a.end = h.expert_end;
  a.shared = h.holds_shared != 0;
  a.mask.assign(static_cast<size_t>(E), 0);
  for (int64_t e = a.begin; e < a.end; ++e) a.mask[static_cast<size_t>(e)] = 1;
  a.n_parts = h.n_parts;
  a.part_begin = h.part_begin;
  a.part_end = h.part_end;
  for (int q = a.part_begin; q < a.part_end && !a.placement; ++q) {
    Part pt;
    pt.begin = q * E / a.n_parts;
    pt.end = (q + 1) * E / a.n_parts;
    pt.shared = q == 0;
    pt.mask.assign(static_cast<size_t>(E), 0);
    for (int64_t e = pt.begin; e < pt.end; ++e) pt.mask[static_cast<size_t>(e)] = 1;
    a.parts.push_back(std::move(pt));
  }
  // Every view must exist (they do for a whole-model load; a sliced model has gaps).
  for (size_t l = 0; l < w_->layers.size(); ++l) {
    const LayerWeights& L = w_->layers[l];
    if (L.is_moe) {
      for (int64_t e = a.begin; e < a.end; ++e) {
        if (L.moe.experts[static_cast<size_t>(e)].empty()) {
          return invalid_argument("assignment epoch " + std::to_string(h.epoch) + " asks for expert " +
                                  std::to_string(e) + ", whose weights this FFN worker does not have (layer " +
                                  std::to_string(l) + ")");
        }
      }
    } else if (a.shared && L.dense.empty()) {
      return invalid_argument("assignment epoch " + std::to_string(h.epoch) +
                              " asks for the dense layers, whose weights this FFN worker does not have");
    }
  }
  return a;
}

int64_t FfnWorker::rows_per_token(const Assignment& a) const {
  if (a.placement) return int64_t{mine_.top_k} + (a.shared ? 1 : 0);
  const int64_t n = static_cast<int64_t>(a.parts.size());
  return n <= 1 ? 1 : std::min<int64_t>(n, int64_t{mine_.top_k} + 1);
}

void FfnWorker::end_mb_ops(Peer& p) {
  for (auto& s : p.mbs) {
    end_op(t_, s.recv_id, &s.agg.receiving);
    end_op(t_, s.send_id, &s.send_live);
    s.agg.ready = false;
  }
}

Status FfnWorker::on_hello(Peer& p, const Completion& c) {
  const uint64_t tag = handshake_tag();
  auto refuse = [&](const Status& why) {
    stats_.refused++;
    spdlog::error("ffn worker {}: refusing attention peer '{}': {}", opt_.index, p.name, why.message());
    size_t n = encode_reason(FrameKind::refuse, 0, 0, 0, why.message(), p.hello_out.data());
    auto s = t_->post_send(p.id, tag, p.hello_out.data(), n);
    if (s.ok()) t_->wait(*s, deadline_in_ms(1000));
    return post_hello(p);  // a corrected peer may say hello again
  };
  if (!c.status.is_ok()) return Status();  // lost; the disconnect event follows
  auto theirs = decode_handshake(p.hello_in.data(), c.bytes, FrameKind::hello);
  if (!theirs.ok()) return refuse(theirs.status());
  Status m = check_hello(mine_, *theirs);
  for (auto& q : peers_) {
    if (m.is_ok() && q.get() != &p && q->serving && q->hs.index == theirs->index) {
      m = invalid_argument("attention index " + std::to_string(theirs->index) + " is already served for peer '" +
                           q->name + "'");
    }
  }
  Assignment assign;
  if (m.is_ok()) {
    auto a = assignment_for(*theirs);
    if (a.ok()) assign = std::move(*a);
    else m = a.status();
  }
  if (!m.is_ok()) return refuse(m);
  const int64_t H = mine_.hidden;
  // A hello on a connection already served (a new assignment epoch) keeps the buffers when
  // their sizes still fit. Every frame received before it belongs to the pass the attention
  // worker abandoned before it said hello again: dropped.
  // Replies hold one row per (token, part it touches).
  const size_t reply_bytes = kFrameHeaderBytes + f2a_payload_bytes(theirs->max_tokens * rows_per_token(assign), H);
  const bool keep = p.serving && p.hs.n_microbatches == theirs->n_microbatches &&
                    p.hs.max_tokens == theirs->max_tokens && p.hs.granularity == theirs->granularity &&
                    !p.mbs.empty() && p.mbs[0].send.capacity() >= reply_bytes;
  if (keep) {
    for (size_t mb = 0; mb < p.mbs.size(); ++mb) {
      MbSlot& s = p.mbs[mb];
      AggregationPolicy::reset(s.agg);
      if (!s.agg.receiving) AFD_RETURN_IF_ERROR(post_frame_recv(p, static_cast<int>(mb)));
    }
  } else {
    // Prepare once: buffers for every micro-batch of this peer, registered now.
    end_mb_ops(p);
    AFD_ASSIGN_OR_RETURN(A2fLayout lay, a2f_layout(theirs->max_tokens, H, mine_.top_k, theirs->granularity));
    p.mbs.clear();
    p.mbs.resize(theirs->n_microbatches);
    for (size_t mb = 0; mb < p.mbs.size(); ++mb) {
      AFD_ASSIGN_OR_RETURN(p.mbs[mb].recv, FrameBuffer::create(t_, kFrameHeaderBytes + lay.total));
      AFD_ASSIGN_OR_RETURN(p.mbs[mb].send, FrameBuffer::create(t_, reply_bytes));
      AFD_RETURN_IF_ERROR(post_frame_recv(p, static_cast<int>(mb)));
    }
  }
  const bool changed = !p.serving || !assign.same_experts(p.assign);
  if (changed && !assign.same_range(static_)) {
    // Experts outside the start-up shard: their pages are asked of the checkpoint now, not at
    // the first batch.
    std::vector<uint8_t> fresh = assign.mask;
    for (size_t e = 0; e < fresh.size(); ++e) fresh[e] = fresh[e] && !static_.mask[e];
    const size_t bytes = prefetch_ffn_weights(*w_, fresh, assign.shared && !static_.shared);
    spdlog::info("ffn worker {}: attention peer '{}' assigns experts [{}, {}){} (epoch {}; started with [{}, {}){}){}{}",
                 opt_.index, p.name, assign.begin, assign.end, assign.shared ? " + shared/dense" : "", assign.epoch,
                 static_.begin, static_.end, static_.shared ? " + shared/dense" : "",
                 bytes > 0 ? fmt::format(": {:.1f} MiB of weights outside the start-up shard read ahead from the "
                                         "checkpoint",
                                         static_cast<double>(bytes) / (1 << 20))
                           : std::string(),
                 gpu_ ? "; computed on the CPU (the GPU holds the start-up shard)" : "");
  }
  if (changed && p.serving) stats_.reassignments++;
  p.hs = *theirs;
  p.assign = std::move(assign);
  stats_.held_experts = p.assign.end - p.assign.begin;
  if (!p.serving) stats_.attention_serving++;  // before the ack: a peer that has it finds itself counted
  Handshake ack = mine_;
  ack.epoch = p.assign.epoch;
  ack.expert_begin = static_cast<uint32_t>(p.assign.begin);
  ack.expert_end = static_cast<uint32_t>(p.assign.end);
  ack.holds_shared = p.assign.shared ? 1 : 0;
  ack.n_parts = static_cast<uint16_t>(p.assign.n_parts);
  ack.part_begin = static_cast<uint16_t>(p.assign.part_begin);
  ack.part_end = static_cast<uint16_t>(p.assign.part_end);
  ack.placement = p.assign.placement ? 1 : 0;
  size_t n = encode_handshake(FrameKind::hello_ack, ack, p.hello_out.data());
  AFD_ASSIGN_OR_RETURN(RequestId s, t_->post_send(p.id, tag, p.hello_out.data(), n));
  wait_or_cancel(t_, s, opt_.peer_timeout_ms);
  const bool again = p.serving;
  p.serving = true;
  spdlog::info("ffn worker {}: {} attention peer '{}' ({}, {} micro-batches, up to {} tokens)", opt_.index,
               again ? "handshake again with" : "serving", p.name, describe(*theirs), theirs->n_microbatches,
               theirs->max_tokens);
  // It may say hello again on this connection (a new assignment epoch).
  return post_hello(p);
}

Status FfnWorker::post_frame_recv(Peer& p, int mb) {
  MbSlot& s = p.mbs[static_cast<size_t>(mb)];
  AFD_ASSIGN_OR_RETURN(s.recv_id, t_->post_recv(p.id, frame_tag(TagFamily::a2f, static_cast<uint32_t>(mb)),
                                                s.recv.data(), s.recv.capacity()));
  s.agg.receiving = true;
  s.agg.ready = false;
  return Status();
}

Status FfnWorker::post_ping_recv(Peer& p) {
  AFD_RETURN_IF_ERROR(p.probe.ensure(t_));
  AFD_ASSIGN_OR_RETURN(p.ping_id, t_->post_recv(p.id, probe_tag(), p.probe.ping.data(), p.probe.ping.capacity()));
  p.ping_live = true;
  return Status();
}

void FfnWorker::answer_ping(Peer& p, const Completion& c) {
  p.ping_live = false;
  if (!c.status.is_ok()) return;  // lost or cancelled; the disconnect event re-posts
  auto seq = read_ping(p.probe, c.bytes);
  if (!seq.ok()) {
    stats_.bad_frames++;
    spdlog::error("ffn worker {}: malformed probe from '{}': {}", opt_.index, p.name, seq.status().message());
  } else {
    // The previous pong (a header-sized eager send) has long completed; never reuse its
    // buffer before it has.
    wait_send(p.pong_id, &p.pong_live);
    const size_t n = write_pong(p.probe, *seq);
    auto r = t_->post_send(p.id, probe_tag(), p.probe.pong.data(), n);
    if (r.ok()) {
      p.pong_id = *r;
      p.pong_live = true;
      stats_.probes++;
    }
  }
  if (Status s = post_ping_recv(p); !s.is_ok())
    spdlog::warn("ffn worker {}: re-posting the probe receive for '{}': {}", opt_.index, p.name, s.to_string());
}

void FfnWorker::drop_peer(Peer& p, const std::string& why) {
  end_op(t_, p.hello_id, &p.hello_live);
  end_op(t_, p.ping_id, &p.ping_live);
  end_op(t_, p.pong_id, &p.pong_live);
  end_mb_ops(p);
  for (auto& s : p.mbs) AggregationPolicy::reset(s.agg);
  if (p.serving) {
    stats_.attention_serving--;
    stats_.peer_losses++;
  }
  p.serving = false;
  p.connected = false;
}

void FfnWorker::send_error(Peer& p, int mb, uint32_t layer, uint64_t step, const std::string& why) {
  MbSlot& s = p.mbs[static_cast<size_t>(mb)];
  wait_send(s.send_id, &s.send_live);
  size_t n = encode_reason(FrameKind::error, layer, static_cast<uint16_t>(mb), step, why, s.send.data());
  auto r = t_->post_send(p.id, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.send.data(), n);
  if (r.ok()) {
    s.send_id = *r;
    s.send_live = true;
  }
}

void FfnWorker::wait_send(RequestId id, bool* live) {
  if (!*live) return;
  Completion c;
  if (!t_->test(id, &c)) wait_or_cancel(t_, id, opt_.peer_timeout_ms);
  *live = false;
}

bool FfnWorker::accept_frame(Peer& p, int mb) {
  MbSlot& s = p.mbs[static_cast<size_t>(mb)];
  A2fLimits lim = limits_;
  lim.max_tokens = p.hs.max_tokens;
  lim.unrouted_ids = p.assign.placement;
  auto v = decode_a2f(s.recv.data(), s.bytes, lim);
  Status bad;
  if (!v.ok()) {
    bad = v.status();
  } else if (v->header.microbatch != mb) {
    bad = corrupt_data("frame for micro-batch " + std::to_string(v->header.microbatch) + " arrived on micro-batch " +
                       std::to_string(mb));
  } else if (v->header.layer >= mine_.n_layers) {
    bad = corrupt_data("frame for layer " + std::to_string(v->header.layer) + " of a " +
                       std::to_string(mine_.n_layers) + "-layer model");
  } else {
    bool moe = w_->config.is_moe_layer(v->header.layer);
    if (moe && v->header.top_k != mine_.top_k) bad = corrupt_data("MoE layer frame without its top-k routes");
    if (!moe && v->header.top_k != 0) bad = corrupt_data("dense layer frame with routes");
  }
  if (bad.is_ok() && v->header.epoch != p.assign.epoch) {
    // Built for another assignment than the one this worker holds for the peer: computing
    // it would return a partial over the wrong experts.
    stats_.stale_frames++;
    spdlog::warn("ffn worker {}: attention peer '{}' sent a frame for assignment epoch {} (layer {}, micro-batch {}, "
                 "step {}), but holds epoch {} here: answering with an error",
                 opt_.index, p.name, v->header.epoch, v->header.layer, mb, v->header.step, p.assign.epoch);
    send_error(p, mb, v->header.layer, v->header.step,
               "assignment epoch mismatch: the frame was built for epoch " + std::to_string(v->header.epoch) +
                   ", this FFN worker holds epoch " + std::to_string(p.assign.epoch) +
                   " for this attention worker (experts [" + std::to_string(p.assign.begin) + ", " +
                   std::to_string(p.assign.end) + ")); handshake again");
    s.agg.expect_layer = -1;
    if (Status st = post_frame_recv(p, mb); !st.is_ok())
      spdlog::warn("ffn worker {}: re-posting a receive for '{}': {}", opt_.index, p.name, st.to_string());
    return false;
  }
  if (!bad.is_ok()) {
    stats_.bad_frames++;
    uint32_t layer = s.agg.expect_layer >= 0 ? static_cast<uint32_t>(s.agg.expect_layer) : 0;
    uint64_t step = 0;
    auto h = decode_header(s.recv.data(), s.bytes);
    if (h.ok()) layer = h->layer, step = h->step;
    spdlog::error("ffn worker {}: malformed frame from '{}' (micro-batch {}): {}", opt_.index, p.name, mb,
                  bad.message());
    send_error(p, mb, layer, step, "malformed a2f frame: " + bad.message());
    s.agg.expect_layer = -1;
    if (Status st = post_frame_recv(p, mb); !st.is_ok())
      spdlog::warn("ffn worker {}: re-posting a receive for '{}': {}", opt_.index, p.name, st.to_string());
    return false;
  }
  s.view = *v;
  s.agg.ready = true;
  s.agg.layer = v->header.layer;
  return true;
}

void FfnWorker::poll_frames() {
  for (auto& pp : peers_) {
    Peer& p = *pp;
    if (p.hello_live) {
      Completion c;
      if (t_->test(p.hello_id, &c)) {
        p.hello_live = false;
        Status s = on_hello(p, c);
        if (!s.is_ok()) spdlog::error("ffn worker {}: handshake with '{}': {}", opt_.index, p.name, s.to_string());
      }
    }
    if (p.ping_live) {
      Completion c;
      if (t_->test(p.ping_id, &c)) answer_ping(p, c);
    }
    if (!p.serving) continue;
    for (size_t mb = 0; mb < p.mbs.size(); ++mb) {
      MbSlot& s = p.mbs[mb];
      if (!s.agg.receiving) continue;
      Completion c;
      if (!t_->test(s.recv_id, &c)) continue;
      s.agg.receiving = false;
      if (!c.status.is_ok()) continue;  // lost peer: its disconnect event follows
      s.bytes = c.bytes;
      accept_frame(p, static_cast<int>(mb));
    }
  }
}

AggGrid FfnWorker::agg_grid() {
  AggGrid g(peers_.size());
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = *peers_[i];
    if (!p.serving) continue;
    g[i].reserve(p.mbs.size());
    for (auto& s : p.mbs) g[i].push_back(&s.agg);
  }
  return g;
}

bool FfnWorker::wait_for_peers(const std::function<std::vector<size_t>(const AggGrid&)>& pending, int mb,
                               int64_t deadline, const std::atomic<bool>* stop) {
  bool waited = false;
  for (;;) {
    const std::vector<size_t> who = pending(agg_grid());
    if (!AggregationPolicy::keep_waiting(who, deadline, now_ns()) || stop->load()) break;
    std::vector<RequestId> ids;
    for (size_t q : who) ids.push_back(peers_[q]->mbs[static_cast<size_t>(mb)].recv_id);
    waited = true;
    t_->wait_any(ids, std::min(deadline, now_ns() + 5000000));
    poll_frames();
    handle_events();
  }
  return waited;
}

std::optional<BatchKey> FfnWorker::choose_batch(const std::atomic<bool>* stop) {
  std::optional<BatchKey> key;
  for (int attempt = 0; attempt < 2; ++attempt) {
    key = policy_.next_batch(agg_grid(), rotate_);
    if (!key || attempt == 1) break;
    const BatchKey k = *key;
    const bool waited = wait_for_peers([&](const AggGrid& g) { return policy_.behind(g, k); }, k.mb,
                                       policy_.catch_up_deadline(now_ns()), stop);
    for (size_t q : policy_.give_up_behind(agg_grid(), k)) {
      spdlog::warn("ffn worker {}: attention peer '{}' sent no frame for micro-batch {} within {} ms", opt_.index,
                   peers_[q]->name, k.mb, opt_.peer_timeout_ms);
      stats_.late_peers++;
    }
    if (!waited) break;
  }
  return key;
}

void FfnWorker::gather(const BatchKey& key, const std::atomic<bool>* stop) {
  wait_for_peers([&](const AggGrid& g) { return policy_.waiting_for(g, key); }, key.mb,
                 policy_.gather_deadline(key.layer, now_ns()), stop);
  for (size_t q : policy_.end_gather(agg_grid(), key).late) {
    spdlog::warn("ffn worker {}: attention peer '{}' sent no frame for layer {} micro-batch {} within {} ms; serving "
                 "the others",
                 opt_.index, peers_[q]->name, key.layer, key.mb, opt_.peer_timeout_ms);
    stats_.late_peers++;
  }
}

std::vector<FfnWorker::Member> FfnWorker::load_batch(const BatchKey& key) {
  const int mb = key.mb;
  std::vector<Member> members;
  for (size_t q : policy_.members(agg_grid(), key)) {
    const MbSlot& s = peers_[q]->mbs[static_cast<size_t>(mb)];
    members.push_back(Member{peers_[q].get(), 0, s.view.header.n_tokens, s.view.header.step});
  }
  // Members holding the same assignment (all of them, except while attention workers change
  // epochs) are computed in one ffn_part call: ordered so that each assignment's rows are
  // contiguous.
  std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    const Assignment &x = a.p->assign, &y = b.p->assign;
    return std::tie(x.placement, x.begin, x.end, x.shared, x.n_parts, x.part_begin, x.part_end) <
           std::tie(y.placement, y.begin, y.end, y.shared, y.n_parts, y.part_begin, y.part_end);
  });
  int64_t total = 0;
  for (auto& m : members) {
    m.off = total;
    total += m.n;
  }
  const int64_t H = mine_.hidden;
  const int64_t K = w_->config.is_moe_layer(key.layer) ? mine_.top_k : 0;
  h_.resize(static_cast<size_t>(total * H));
  out_.resize(static_cast<size_t>(total * H));
  ids_.resize(static_cast<size_t>(total * K));
  wts_.resize(static_cast<size_t>(total * K));
  for (auto& m : members) {
    MbSlot& s = m.p->mbs[static_cast<size_t>(mb)];
    if (m.n > 0) {
      kernels::dequantize_fp8_e4m3(s.view.q, s.view.scales, m.n * H, s.view.group, h_.data() + m.off * H);
      if (K > 0) {
        std::memcpy(ids_.data() + m.off * K, s.view.ids, static_cast<size_t>(m.n * K) * 4);
        std::memcpy(wts_.data() + m.off * K, s.view.weights, static_cast<size_t>(m.n * K) * 4);
      }
    }
    // The receive buffer is consumed: post the next receive before computing.
    Status st = post_frame_recv(*m.p, mb);
    if (!st.is_ok())
      spdlog::warn("ffn worker {}: re-posting a receive for '{}': {}", opt_.index, m.p->name, st.to_string());
  }
  // Replies are written into the members' send buffers (several parts: as each part is
  // computed), so their previous sends must be out.
  for (auto& m : members) {
    MbSlot& s = m.p->mbs[static_cast<size_t>(mb)];
    wait_send(s.send_id, &s.send_live);
  }
  return members;
}

int64_t FfnWorker::compute_one_part(const Assignment& a, uint32_t layer, int64_t off, int64_t n) {
  const int64_t H = mine_.hidden;
  const int64_t K = w_->config.is_moe_layer(layer) ? mine_.top_k : 0;
  const int32_t* ids = K > 0 ? ids_.data() + off * K : nullptr;
  const float* wts = K > 0 ? wts_.data() + off * K : nullptr;
  bool done = false;
  if (gpu_ && a.same_range(static_)) {  // the GPU holds the start-up shard's weights only
    Status gs = gpu_->run(layer, h_.data() + off * H, n, ids, wts, out_.data() + off * H);
    if (gs.is_ok()) {
      done = true;
    } else {
      spdlog::error("ffn worker {}: GPU FFN failed ({}); computing on the CPU from now on", opt_.index, gs.to_string());
      gpu_.reset();
    }
  }
  if (!done) {
    part_.experts_mask = a.mask;  // reuses its capacity
    part_.include_shared = a.shared;
    ffn_part(*w_, layer, h_.data() + off * H, n, ids, wts, out_.data() + off * H, part_, &scratch_, pool_);
  }
  int64_t expert_rows = 0;
  for (int64_t t = 0; t < n * K; ++t) expert_rows += a.mask[static_cast<size_t>(ids[t])];  // ids range-checked
  return expert_rows;
}

int64_t FfnWorker::compute_placed(const Assignment& a, uint32_t layer, int mb, const std::vector<Member>& members,
                                  size_t first, size_t end, int64_t off, int64_t n, std::vector<int64_t>* reply_rows) {
  const int64_t H = mine_.hidden;
  const int64_t K = w_->config.is_moe_layer(layer) ? mine_.top_k : 0;
  const int64_t E = w_->config.n_experts;
  const int32_t* ids = K > 0 ? ids_.data() + off * K : nullptr;
  const float* wts = K > 0 ? wts_.data() + off * K : nullptr;
  // The member each token row [0, n) came in (members [first, end) hold consecutive rows).
  auto member_of = [&](int64_t t) {
    size_t i = first;
    while (i + 1 < end && members[i + 1].off - off <= t) ++i;
    return i;
  };
  auto write_row = [&](size_t i, const float* row) {
    kernels::f32_to_bf16_row(row, H, reply_payload(members[i], mb) + (*reply_rows)[i] * H);
    ++(*reply_rows)[i];
  };
  int64_t pairs = 0;
  if (K > 0) {
    // Pairs by expert (counting sort: token order within an expert); -1: another worker's.
    placed_start_.assign(static_cast<size_t>(E + 1), 0);
    for (int64_t p = 0; p < n * K; ++p)
      if (ids[p] >= 0) ++placed_start_[static_cast<size_t>(ids[p]) + 1];
    for (int64_t e = 0; e < E; ++e) placed_start_[e + 1] += placed_start_[e];
    pairs = placed_start_[E];
    placed_pairs_.resize(static_cast<size_t>(pairs));
    {
      std::vector<int32_t> fill(placed_start_.begin(), placed_start_.end() - 1);
      for (int64_t p = 0; p < n * K; ++p)
        if (ids[p] >= 0) placed_pairs_[static_cast<size_t>(fill[static_cast<size_t>(ids[p])]++)] = static_cast<int32_t>(p);
    }
    for (int64_t e = 0; e < E; ++e) {
      const int64_t b = placed_start_[e], m = placed_start_[e + 1] - b;
      if (m == 0) continue;
      placed_h_.resize(static_cast<size_t>(m * H));
      placed_w_.resize(static_cast<size_t>(m));
      placed_out_.resize(static_cast<size_t>(m * H));
      for (int64_t r = 0; r < m; ++r) {
        const int32_t p = placed_pairs_[static_cast<size_t>(b + r)];
        std::memcpy(placed_h_.data() + r * H, h_.data() + (off + p / K) * H, static_cast<size_t>(H) * sizeof(float));
        placed_w_[static_cast<size_t>(r)] = wts[p];
      }
      ffn_expert_rows(*w_, layer, e, placed_h_.data(), m, placed_w_.data(), placed_out_.data(), part_, &scratch_, pool_);
      // Per member, its pairs of expert e in token order: the bucket is in token order.
      for (int64_t r = 0; r < m; ++r)
        write_row(member_of(placed_pairs_[static_cast<size_t>(b + r)] / K), placed_out_.data() + r * H);
    }
  }
  const bool model_shared = w_->config.shared_expert_intermediate_size > 0;
  if (a.shared && (K == 0 || model_shared)) {
    // The shared expert / dense layer over every token: ffn_part with no routed expert (its
    // bucketing reads ids, so the -1 of other workers' pairs become expert 0, masked out).
    placed_ids_.resize(static_cast<size_t>(n * K));
    for (int64_t p = 0; p < n * K; ++p) placed_ids_[static_cast<size_t>(p)] = std::max(ids[p], 0);
    part_.experts_mask.assign(static_cast<size_t>(E), 0);
    part_.include_shared = true;
    ffn_part(*w_, layer, h_.data() + off * H, n, K > 0 ? placed_ids_.data() : nullptr, wts, out_.data() + off * H,
             part_, &scratch_, pool_);
    for (int64_t t = 0; t < n; ++t) write_row(member_of(t), out_.data() + (off + t) * H);
  }
  return pairs;
}

int64_t FfnWorker::compute_parts(const Assignment& a, uint32_t layer, int mb, const std::vector<Member>& members,
                                 size_t first, size_t end, int64_t off, int64_t n, std::vector<int64_t>* reply_rows) {
  const int64_t H = mine_.hidden;
  const int64_t K = w_->config.is_moe_layer(layer) ? mine_.top_k : 0;
  const int32_t* ids = K > 0 ? ids_.data() + off * K : nullptr;
  const float* wts = K > 0 ? wts_.data() + off * K : nullptr;
  const bool model_shared = w_->config.shared_expert_intermediate_size > 0;
  int64_t expert_rows = 0;
  for (const Part& pt : a.parts) {
    part_.experts_mask = pt.mask;
    part_.include_shared = pt.shared;
    ffn_part(*w_, layer, h_.data() + off * H, n, ids, wts, out_.data() + off * H, part_, &scratch_, pool_);
    for (size_t i = first; i < end; ++i) {
      const Member& m = members[i];
      uint16_t* reply = reply_payload(m, mb);
      for (int64_t t = 0; t < m.n; ++t) {
        const int64_t r = m.off + t;
        bool touches = pt.shared && (K == 0 || model_shared);
        for (int64_t k = 0; k < K && !touches; ++k) touches = pt.mask[static_cast<size_t>(ids_[static_cast<size_t>(r * K + k)])];
        if (!touches) continue;
        kernels::f32_to_bf16_row(out_.data() + r * H, H, reply + (*reply_rows)[i] * H);
        ++(*reply_rows)[i];
      }
    }
    for (int64_t t = 0; t < n * K; ++t) expert_rows += pt.mask[static_cast<size_t>(ids[t])];
  }
  return expert_rows;
}

FfnWorker::Computed FfnWorker::compute(const BatchKey& key, const std::vector<Member>& members) {
  Computed c;
  c.reply_rows.assign(members.size(), 0);
  std::vector<std::pair<size_t, size_t>> single;  // member ranges whose group holds one part
  c.t0 = now_ns();
  for (size_t g0 = 0; g0 < members.size();) {
    const Assignment& a = members[g0].p->assign;
    size_t g1 = g0 + 1;
    int64_t n = members[g0].n;
    while (g1 < members.size() && members[g1].p->assign.same_experts(a)) n += members[g1++].n;
    const int64_t off = members[g0].off;
    const size_t first = g0;
    g0 = g1;
    if (n == 0) continue;
    if (a.placement) {
      c.expert_rows += compute_placed(a, key.layer, key.mb, members, first, g1, off, n, &c.reply_rows);
    } else if (a.parts.size() <= 1) {
      c.expert_rows += compute_one_part(a, key.layer, off, n);
      single.emplace_back(first, g1);
    } else {
      // Several parts: each computed and rounded on its own, and replied as its own rows (the
      // tokens of the frame that touch the part, in frame order), part after part.
      c.expert_rows += compute_parts(a, key.layer, key.mb, members, first, g1, off, n, &c.reply_rows);
    }
  }
  if (opt_.emulation) opt_.emulation->ffn(c.expert_rows);
  c.t1 = now_ns();
  const int64_t H = mine_.hidden;
  for (auto [b0, b1] : single) {
    for (size_t i = b0; i < b1; ++i) {
      kernels::f32_to_bf16_row(out_.data() + members[i].off * H, members[i].n * H, reply_payload(members[i], key.mb));
      c.reply_rows[i] = members[i].n;
    }
  }
  return c;
}

void FfnWorker::count_batch(const BatchKey& key, const std::vector<Member>& members, const Computed& c) {
  int64_t total = 0;
  for (const Member& m : members) total += m.n;
  stats_.ffn_ns += c.t1 - c.t0;
  if (opt_.on_batch) opt_.on_batch(key.layer, key.mb, c.t0, c.t1, total);
  stats_.batches++;
  stats_.tokens += total;
  if (w_->config.is_moe_layer(key.layer) && mine_.top_k > 0) {
    stats_.expert_rows += c.expert_rows;
    if (count_experts_) count_expert_tokens(key.layer, members);
  }
  stats_.frames += static_cast<int64_t>(members.size());
  if (members.size() > 1) stats_.multi_peer_batches++;
  stats_.batch_tokens[FfnWorkerStats::token_bucket(total)]++;
}

void FfnWorker::count_expert_tokens(uint32_t layer, const std::vector<Member>& members) {
  const int64_t K = mine_.top_k;
  const int64_t E = stats_.n_experts;
  std::atomic<int64_t>* row = stats_.expert_tokens.get() + static_cast<int64_t>(layer) * E;
  for (const Member& m : members) {
    const std::vector<uint8_t>& mask = m.p->assign.mask;
    for (int64_t t = m.off * K; t < (m.off + m.n) * K; ++t) {
      const int32_t e = ids_[static_cast<size_t>(t)];
      if (e >= 0 && mask[static_cast<size_t>(e)]) row[e].fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void FfnWorker::send_replies(const BatchKey& key, const std::vector<Member>& members, const Computed& c) {
  // Each member's rows in BF16 (one per token, or per (token, part) with several parts).
  const int mb = key.mb;
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    MbSlot& s = m.p->mbs[static_cast<size_t>(mb)];
    FrameHeader h;
    h.kind = FrameKind::f2a;
    h.layer = key.layer;
    h.microbatch = static_cast<uint16_t>(mb);
    h.step = m.step;
    h.n_tokens = static_cast<uint32_t>(c.reply_rows[i]);
    h.hidden = mine_.hidden;
    h.payload_bytes = f2a_payload_bytes(c.reply_rows[i], mine_.hidden);
    h.ffn_us = static_cast<uint32_t>(std::min<int64_t>((c.t1 - c.t0) / 1000, UINT32_MAX));
    encode_header(h, s.send.data() + kFrameHeaderBytes, s.send.data());
    auto r = t_->post_send(m.p->id, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.send.data(),
                           kFrameHeaderBytes + h.payload_bytes);
    if (r.ok()) {
      s.send_id = *r;
      s.send_live = true;
    }
    policy_.served(s.agg, key.layer);
  }
}

bool FfnWorker::serve_one(const std::atomic<bool>* stop) {
  const std::optional<BatchKey> key = choose_batch(stop);
  if (!key) return false;
  ++rotate_;
  gather(*key, stop);
  const std::vector<Member> members = load_batch(*key);
  const Computed c = compute(*key, members);
  count_batch(*key, members, c);
  send_replies(*key, members, c);
  return true;
}

Status FfnWorker::run(const std::atomic<bool>* stop) {
  if (stats_.started_ns.load() == 0) stats_.started_ns = now_ns();
  int64_t next_log = now_ns() + 2000000000;
  while (!stop->load()) {
    handle_events();
    poll_frames();
    if (now_ns() >= next_log) {
      const int64_t serving = stats_.attention_serving.load();
      if (serving < opt_.n_attention) {
        spdlog::info("ffn worker {}: waiting for attention workers ({} of {} connected and accepted)", opt_.index,
                     serving, opt_.n_attention);
      }
      next_log = now_ns() + 5000000000;
    }
    if (serve_one(stop)) continue;
    std::vector<RequestId> ids;
    for (auto& p : peers_) {
      if (p->hello_live) ids.push_back(p->hello_id);
      if (p->ping_live) ids.push_back(p->ping_id);
      for (auto& s : p->mbs) {
        if (p->serving && s.agg.receiving) ids.push_back(s.recv_id);
      }
    }
    if (ids.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } else {
      t_->wait_any(ids, now_ns() + 20000000);
    }
  }
  return Status();
}

}  // namespace afd
