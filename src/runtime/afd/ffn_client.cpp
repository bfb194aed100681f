// FfnClient: creation and the data path (dispatch, combine). Class comment: ffn_client.h; the
// monitor, the connections and the membership changes are in ffn_client_*.cpp.
#include "runtime/afd/ffn_client.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/timer.h"
#include "model/fingerprint.h"
#include "model/weights.h"
#include "runtime/afd/liveness.h"
#include "runtime/afd/transport_ops.h"

namespace afd {

using namespace comm;

FfnClient::FfnClient(std::shared_ptr<const ModelWeights> w, Transport* t, FfnClientOptions opt, int parts)
    : w_(std::move(w)), t_(t), opt_(std::move(opt)), membership_(w_->config.n_experts, parts, opt_.takeover_ms) {}

FfnClient::~FfnClient() {
  stop_probes();
  for (size_t mb = 0; mb < slots_.size(); ++mb) abandon(static_cast<int>(mb));
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
  if (opt.expert_placement && (opt.eplb_interval_s < 0 || opt.eplb_redundant < 0))
    return invalid_argument("ffn client: the EPLB interval and redundant replicas must be >= 0");
  if (opt.parts > c.n_experts)
    return invalid_argument("ffn client: " + std::to_string(opt.parts) + " parts of " + std::to_string(c.n_experts) +
                            " routed experts (at most one part per expert)");
  ScaleGranularity g = opt.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token;
  AFD_ASSIGN_OR_RETURN(A2fLayout lay, a2f_layout(opt.max_tokens, c.hidden_size, c.n_experts_per_tok, g));

  const int parts = opt.parts > 0 ? opt.parts : static_cast<int>(opt.ffn_names.size());
  std::unique_ptr<FfnClient> cl(new FfnClient(w, transport, opt, parts));
  cl->fingerprint_ = model_fingerprint(*w);
  cl->a2f_bytes_ = static_cast<int64_t>(kFrameHeaderBytes + lay.total);
  cl->f2a_bytes_ = static_cast<int64_t>(kFrameHeaderBytes + f2a_payload_bytes(opt.max_tokens, c.hidden_size));
  cl->slots_.resize(static_cast<size_t>(opt.microbatches));
  for (size_t j = 0; j < opt.ffn_names.size(); ++j) {
    cl->membership_.add_started(opt.ffn_names[j], opt.ffn_addresses.empty() ? std::string() : opt.ffn_addresses[j],
                                now_ns());
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
    const size_t n = cl->membership_.members().size();
    if (opt.expert_placement && !cl->membership_.whole_experts())
      return invalid_argument("expert placement (--eplb) needs FFN workers holding whole experts (--ffn-tp 1)");
    if (cl->membership_.whole_experts() && cl->membership_.epoch() == 0 &&
        (parts != static_cast<int>(n) || opt.expert_placement)) {
      cl->fit_to_parts();
      cl->reassign(opt.expert_placement ? std::string("expert placement: the FFN workers compute the pairs they are sent")
                                        : "the experts are cut into " + std::to_string(parts) + " parts (" +
                                              std::to_string(n) + " FFN workers)");
    }
  }
  if (opt.expert_placement) {
    cl->load_ = std::make_unique<ExpertLoadCounter>(c);
    cl->placed_.resize(static_cast<size_t>(opt.microbatches));
    cl->last_plan_ns_ = now_ns();
  }
  // The monitor: liveness probes (when probe_interval_ms > 0), transport events, and the
  // membership decisions.
  cl->prober_ = std::thread([c = cl.get()] { c->probe_loop(); });
  return cl;
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
  AFD_RETURN_IF_ERROR(check_dispatch(layer, mb, b));
  if (layer == 0 && mb == 0) AFD_RETURN_IF_ERROR(start_pass());
  AFD_RETURN_IF_ERROR(check_ready(mb));
  const int64_t t0 = now_ns();
  AFD_RETURN_IF_ERROR(route(layer, mb, b));
  for (int j : active_) AFD_RETURN_IF_ERROR(send_to(j, layer, mb, b));
  times_at(layer).a2f_s += static_cast<double>(now_ns() - t0) * 1e-9;
  return Status();
}

Status FfnClient::check_dispatch(int64_t layer, int mb, const TokenBatch& b) const {
  if (mb < 0 || mb >= opt_.microbatches) {
    return invalid_argument("ffn client: micro-batch " + std::to_string(mb) + " outside [0, " +
                            std::to_string(opt_.microbatches) + ")");
  }
  if (layer < 0 || layer >= w_->config.n_layers)
    return invalid_argument("ffn client: layer " + std::to_string(layer) + " out of range");
  if (b.n > opt_.max_tokens) {
    return invalid_argument("ffn client: micro-batch of " + std::to_string(b.n) + " tokens exceeds max_tokens " +
                            std::to_string(opt_.max_tokens));
  }
  return Status();
}

Status FfnClient::start_pass() {
  // Operations still outstanding belong to a pass that failed (one micro-batch's combine
  // failed; the others' were never combined): end them, so every micro-batch starts clean.
  // Their late replies, if any, are dropped by the step check.
  for (int m = 0; m < opt_.microbatches; ++m) abandon(m);
  ++step_;
  AFD_RETURN_IF_ERROR(refresh_connections());
  return opt_.expert_placement ? update_placement() : Status();
}

Status FfnClient::update_placement() {
  const ModelConfig& c = w_->config;
  if (placement_slots_ != active_) {
    placement_ = contiguous_expert_placement(c, active_);
    placement_slots_ = active_;
    last_plan_ns_ = now_ns();
    spdlog::info("attention {}: expert placement: contiguous over {} FFN worker(s)", opt_.index, active_.size());
    std::lock_guard<std::mutex> l(mu_);
    placement_contiguous_ = placement_planned_ = 1;
    return Status();
  }
  const int64_t now = now_ns();
  if (opt_.eplb_interval_s <= 0 || static_cast<double>(now - last_plan_ns_) < opt_.eplb_interval_s * 1e9 ||
      load_->total() <= 0 || active_.size() < 2)  // one FFN worker: nothing to balance
    return Status();
  last_plan_ns_ = now;
  auto plan = plan_expert_placement(c, *load_, active_, opt_.eplb_redundant);
  load_->decay(0.5);  // the next plan weighs this window half
  if (!plan.ok()) {
    spdlog::error("attention {}: expert placement: no plan: {}", opt_.index, plan.status().to_string());
    return Status();  // the placement in effect stays
  }
  placement_ = std::move(plan->placement);
  std::lock_guard<std::mutex> l(mu_);
  ++placements_;
  placement_contiguous_ = plan->contiguous_mean;
  placement_planned_ = plan->planned_mean;
  spdlog::info("attention {}: expert placement {} in effect ({} FFN worker(s), {} redundant replica(s) per layer): "
               "predicted max/mean load {:.3f} (worst layer {:.3f}), contiguous {:.3f} (worst {:.3f})",
               opt_.index, placements_, active_.size(), plan->redundant, plan->planned_mean, plan->planned_worst,
               plan->contiguous_mean, plan->contiguous_worst);
  return Status();
}

Status FfnClient::check_ready(int mb) const {
  for (int j : active_) {
    const Worker& wk = workers_[static_cast<size_t>(j)];
    if (!wk.ready) return unavailable("FFN worker '" + wk.name + "' is not connected");
  }
  for (const Slot& s : slots_[mb]) {
    if (s.send_live || s.recv_live) {
      return invalid_argument("ffn client: dispatch of micro-batch " + std::to_string(mb) +
                              " before the previous one was combined");
    }
  }
  return Status();
}

Status FfnClient::route(int64_t layer, int mb, const TokenBatch& b) {
  const ModelConfig& c = w_->config;
  for (Slot& s : slots_[mb]) s.rows.clear();
  // At epochs >= 1 the parts each token touches: a worker holding several parts replies one
  // row per (token, part).
  const bool by_parts = applied_epoch_ > 0;
  TokenRoutes in;
  in.n = b.n;
  in.moe = c.is_moe_layer(layer);
  in.top_k = in.moe ? c.n_experts_per_tok : 0;
  in.n_experts = c.n_experts;
  in.topk_ids = std::span<const int32_t>(b.topk_ids.data(), static_cast<size_t>(b.n * in.top_k));
  if (opt_.expert_placement) {
    int shared_slot = -1;
    for (int j : active_)
      if (workers_[static_cast<size_t>(j)].hs.holds_shared) shared_slot = j;
    const bool shared_rows = !in.moe || routing_.has_shared;
    std::vector<PlacedSlot>& placed = placed_[static_cast<size_t>(mb)];
    if (placed_turn_.size() != static_cast<size_t>(c.n_layers)) placed_turn_.resize(static_cast<size_t>(c.n_layers));
    AFD_RETURN_IF_ERROR(route_placed(placement_, layer, in, active_, shared_slot, shared_rows,
                                     &placed_turn_[static_cast<size_t>(layer)], &placed));
    if (in.moe) load_->add(layer, in.topk_ids);
    for (size_t i = 0; i < active_.size(); ++i) {
      Slot& s = slots_[mb][static_cast<size_t>(active_[i])];
      s.rows = placed[i].rows;
      s.reply_rows = placed[i].reply_rows;
    }
    return Status();
  }
  AFD_RETURN_IF_ERROR(route_tokens(routing_, in, by_parts, &token_workers_, &token_parts_));
  for (int j : active_) {
    Slot& s = slots_[mb][static_cast<size_t>(j)];
    const Share& sh = workers_[static_cast<size_t>(j)].share;
    rows_of_slot(token_workers_, j, &s.rows);
    reply_rows_of_slot(s.rows, token_parts_, by_parts, sh.part_begin, sh.part_end, &s.reply_rows);
  }
  return Status();
}

Status FfnClient::send_to(int j, int64_t layer, int mb, const TokenBatch& b) {
  const ModelConfig& c = w_->config;
  Slot& s = slots_[mb][static_cast<size_t>(j)];
  const Worker& wk = workers_[static_cast<size_t>(j)];
  const A2fFrame f{.layer = static_cast<uint32_t>(layer),
                   .microbatch = static_cast<uint16_t>(mb),
                   .step = step_,
                   .epoch = applied_epoch_,
                   .hidden = c.hidden_size,
                   .top_k = c.is_moe_layer(layer) ? c.n_experts_per_tok : 0,
                   .granularity = opt_.per_block_scales ? ScaleGranularity::per_block : ScaleGranularity::per_token,
                   .payload_checksum = opt_.payload_checksum};
  const int32_t* ids = b.topk_ids.data();
  if (opt_.expert_placement) {  // this slot's pairs; -1 for the others'
    const auto it = std::find(active_.begin(), active_.end(), j);
    ids = placed_[static_cast<size_t>(mb)][static_cast<size_t>(it - active_.begin())].ids.data();
  }
  AFD_ASSIGN_OR_RETURN(size_t bytes, encode_a2f(f, s.rows, b.h.data(), ids, b.topk_w.data(), s.send.data()));
  s.layer = f.layer;
  s.step = step_;
  auto r = t_->post_recv(wk.peer, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.recv.data(), s.recv.capacity());
  if (!r.ok()) {
    abandon(mb);
    return r.status().with_context("FFN worker '" + wk.name + "'");
  }
  s.recv_id = *r;
  s.recv_live = true;
  auto sd = t_->post_send(wk.peer, frame_tag(TagFamily::a2f, static_cast<uint32_t>(mb)), s.send.data(), bytes);
  if (!sd.ok()) {
    abandon(mb);
    return sd.status().with_context("FFN worker '" + wk.name + "'");
  }
  s.send_id = *sd;
  s.send_live = true;
  return Status();
}

Status FfnClient::combine(int64_t layer, int mb, TokenBatch& b) {
  if (mb < 0 || mb >= opt_.microbatches) return invalid_argument("ffn client: micro-batch out of range");
  const int64_t t0 = now_ns();
  std::memset(b.ffn_out.data(), 0, static_cast<size_t>(b.n * w_->config.hidden_size) * sizeof(float));
  const int64_t deadline = deadline_in_ms(opt_.timeout_ms);
  uint32_t slowest_ffn_us = 0;  // the FFN workers compute in parallel: the slowest one counts
  for (int j : active_) AFD_RETURN_IF_ERROR(receive_from(j, layer, mb, deadline, b, &slowest_ffn_us));
  if (opt_.expert_placement) {
    placed_replies_.clear();
    for (int j : active_) placed_replies_.push_back(slots_[mb][static_cast<size_t>(j)].reply);
    sum_placed_replies(placed_[static_cast<size_t>(mb)], placed_replies_, b.n, w_->config.hidden_size,
                       b.ffn_out.data());
  }
  FfnLayerTimes& lt = times_at(layer);
  lt.f2a_s += static_cast<double>(now_ns() - t0) * 1e-9;
  lt.ffn_s += static_cast<double>(slowest_ffn_us) * 1e-6;
  last_ok_ns_.store(now_ns());
  return Status();
}

Status FfnClient::fail_combine(size_t j, int64_t layer, int mb, Status s) {
  abandon(mb);
  std::string where =
      "FFN worker '" + workers_[j].name + "', layer " + std::to_string(layer) + ", micro-batch " + std::to_string(mb);
  spdlog::error("attention {}: {}: {}", opt_.index, where, s.to_string());
  if (s.code() == StatusCode::timeout) {
    std::lock_guard<std::mutex> l(stall_mu_);
    last_stall_ = where + ": " + s.message();
    last_stall_ns_.store(now_ns());
  }
  return s.with_context(where);
}

Status FfnClient::receive_from(int jj, int64_t layer, int mb, int64_t deadline, TokenBatch& b,
                               uint32_t* slowest_ffn_us) {
  const int64_t H = w_->config.hidden_size;
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
      return fail_combine(j, layer, mb, timeout_error("no reply within " + std::to_string(opt_.timeout_ms) + " ms"));
    }
    s.recv_live = false;
    if (!c.status.is_ok()) return fail_combine(j, layer, mb, c.status);
    auto hdr = decode_header(s.recv.data(), c.bytes);
    if (!hdr.ok()) return fail_combine(j, layer, mb, hdr.status());
    // Steps start at 1; an error frame of step 0 answers a frame whose header could not be
    // read, so it cannot be told stale: it fails the pass it arrives in.
    const bool errs = hdr->kind == FrameKind::error && hdr->step != 0;
    if ((hdr->kind == FrameKind::f2a || errs) && (hdr->step != s.step || hdr->layer != s.layer)) {
      // A late reply (or error) from a pass that already failed: drop it and keep waiting.
      spdlog::debug("attention {}: dropping a stale {} (step {}, layer {})", opt_.index, frame_kind_name(hdr->kind),
                    hdr->step, hdr->layer);
      auto r = t_->post_recv(workers_[j].peer, frame_tag(TagFamily::f2a, static_cast<uint32_t>(mb)), s.recv.data(),
                             s.recv.capacity());
      if (!r.ok()) return fail_combine(j, layer, mb, r.status());
      s.recv_id = *r;
      s.recv_live = true;
      continue;
    }
    if (hdr->kind == FrameKind::error) {
      // The next pass says hello again first (e.g. after an assignment epoch mismatch).
      workers_[j].ready = false;
      auto why = decode_reason(s.recv.data(), c.bytes);
      return fail_combine(j, layer, mb, unavailable("the FFN worker failed: " + (why.ok() ? *why : why.status().message())));
    }
    auto v = decode_f2a(s.recv.data(), c.bytes, static_cast<uint32_t>(H), static_cast<uint32_t>(s.reply_rows.size()));
    if (!v.ok()) return fail_combine(j, layer, mb, v.status());
    *slowest_ffn_us = std::max(*slowest_ffn_us, hdr->ffn_us);
    if (opt_.expert_placement) {  // added in expert order once every reply is in (combine)
      s.reply = v->out;
      break;
    }
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
  if (cs.status.code() == StatusCode::timeout) return fail_combine(j, layer, mb, timeout_error("send did not complete"));
  s.send_live = false;
  if (!cs.status.is_ok()) return fail_combine(j, layer, mb, cs.status);
  return Status();
}

}  // namespace afd
