#include "runtime/afd/ffn_routing.h"

#include <cstring>

#include "kernels/cpu/ops.h"

namespace afd {

using namespace comm;

namespace {

// One (slot, TP rank, TP degree) claim on a part (an expert, or the shared/dense part).
struct Claim {
  int worker, rank, degree;
};

// The claims on one part must be one TP degree t and ranks 0..t-1 each exactly once.
Status check_claims(const std::vector<Claim>& cs, const std::string& part) {
  if (cs.empty()) return invalid_argument("no FFN worker holds " + part);
  const int t = cs[0].degree;
  std::vector<int> by_rank(static_cast<size_t>(t), -1);
  for (const Claim& c : cs) {
    if (c.degree != t) {
      return invalid_argument(part + " is held with TP degree " + std::to_string(t) + " by FFN worker " +
                              std::to_string(cs[0].worker) + " but with TP degree " + std::to_string(c.degree) +
                              " by FFN worker " + std::to_string(c.worker) + " (overlapping intermediate slices)");
    }
    int& holder = by_rank[static_cast<size_t>(c.rank)];
    if (holder >= 0) {
      return invalid_argument(part + (t > 1 ? ", intermediate slice " + std::to_string(c.rank) + "/" + std::to_string(t) + "," : "") +
                              " is held by FFN workers " + std::to_string(holder) + " and " + std::to_string(c.worker));
    }
    holder = c.worker;
  }
  for (int r = 0; r < t; ++r) {
    if (by_rank[static_cast<size_t>(r)] < 0) {
      return invalid_argument("no FFN worker holds intermediate slice " + std::to_string(r) + "/" + std::to_string(t) +
                              " of " + part);
    }
  }
  return Status();
}

}  // namespace

Status build_routing_masks(std::span<const ShardClaim> claims, int64_t n_experts, FfnRouting* rt) {
  const int64_t E = n_experts;
  std::vector<std::vector<Claim>> experts(static_cast<size_t>(E));
  std::vector<Claim> shared;
  for (const ShardClaim& sc : claims) {
    // The handshake's decoder checked range and rank < degree.
    const Claim c{sc.slot, sc.range.tp_rank, sc.range.tp_degree};
    for (int64_t e = sc.range.begin; e < sc.range.end; ++e) experts[static_cast<size_t>(e)].push_back(c);
    if (sc.range.holds_shared) shared.push_back(c);
  }
  std::vector<uint64_t> masks(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    AFD_RETURN_IF_ERROR(check_claims(experts[static_cast<size_t>(e)], "expert " + std::to_string(e)));
    for (const Claim& c : experts[static_cast<size_t>(e)]) masks[static_cast<size_t>(e)] |= uint64_t{1} << c.worker;
  }
  AFD_RETURN_IF_ERROR(check_claims(shared, "the shared expert / dense layers"));
  uint64_t smask = 0;
  for (const Claim& c : shared) smask |= uint64_t{1} << c.worker;
  rt->expert_workers = std::move(masks);
  rt->shared_workers = smask;
  return Status();
}

std::vector<int16_t> parts_of_experts(int64_t n_experts, int parts) {
  const int64_t E = n_experts, P = parts;
  std::vector<int16_t> part(static_cast<size_t>(E), 0);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t e = q * E / P; e < (q + 1) * E / P; ++e) part[static_cast<size_t>(e)] = static_cast<int16_t>(q);
  return part;
}

Status route_tokens(const FfnRouting& rt, const TokenRoutes& in, bool by_parts, std::vector<uint64_t>* workers,
                    std::vector<uint64_t>* parts) {
  const int64_t K = in.moe ? in.top_k : 0;
  workers->assign(static_cast<size_t>(in.n), 0);
  parts->assign(static_cast<size_t>(in.n), 0);
  for (int64_t i = 0; i < in.n; ++i) {
    uint64_t mask = 0, touched = 0;
    if (!in.moe || rt.has_shared) {
      mask |= rt.shared_workers;
      touched |= 1;
    }
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = in.topk_ids[static_cast<size_t>(i * K + k)];
      if (e < 0 || e >= in.n_experts) return invalid_argument("ffn client: expert id " + std::to_string(e) + " out of range");
      mask |= rt.expert_workers[static_cast<size_t>(e)];
      if (by_parts) touched |= uint64_t{1} << rt.part_of_expert[static_cast<size_t>(e)];
    }
    (*workers)[static_cast<size_t>(i)] = mask;
    (*parts)[static_cast<size_t>(i)] = touched;
  }
  return Status();
}

void rows_of_slot(std::span<const uint64_t> workers, int slot, std::vector<int32_t>* rows) {
  rows->clear();
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i] >> slot & 1) rows->push_back(static_cast<int32_t>(i));
  }
}

void reply_rows_of_slot(std::span<const int32_t> rows, std::span<const uint64_t> parts, bool by_parts, int part_begin,
                        int part_end, std::vector<int32_t>* reply_rows) {
  if (!by_parts || part_end - part_begin <= 1) {
    reply_rows->assign(rows.begin(), rows.end());
    return;
  }
  reply_rows->clear();
  for (int q = part_begin; q < part_end; ++q) {
    for (int32_t i : rows) {
      if (parts[static_cast<size_t>(i)] >> q & 1) reply_rows->push_back(i);
    }
  }
}

Result<size_t> encode_a2f(const A2fFrame& f, std::span<const int32_t> rows, const float* h, const int32_t* topk_ids,
                          const float* topk_w, uint8_t* out) {
  const int64_t n = static_cast<int64_t>(rows.size()), H = f.hidden, K = f.top_k;
  const int64_t group = f.granularity == ScaleGranularity::per_block ? kScaleBlock : H;
  AFD_ASSIGN_OR_RETURN(A2fLayout l, a2f_layout(n, H, K, f.granularity));
  uint8_t* p = out + kFrameHeaderBytes;
  auto* scales = reinterpret_cast<float*>(p + l.scales);
  auto* ids = reinterpret_cast<int32_t*>(p + l.ids);
  auto* wts = reinterpret_cast<float*>(p + l.weights);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = rows[static_cast<size_t>(r)];
    kernels::quantize_fp8_e4m3(h + i * H, H, group, p + l.q + r * H, scales + r * l.n_scales_per_token);
    if (K > 0) {
      std::memcpy(ids + r * K, topk_ids + i * K, static_cast<size_t>(K) * 4);
      std::memcpy(wts + r * K, topk_w + i * K, static_cast<size_t>(K) * 4);
    }
  }
  FrameHeader hd;
  hd.kind = FrameKind::a2f;
  hd.granularity = f.granularity;
  hd.layer = f.layer;
  hd.microbatch = f.microbatch;
  hd.step = f.step;
  hd.n_tokens = static_cast<uint32_t>(n);
  hd.hidden = static_cast<uint32_t>(H);
  hd.top_k = static_cast<uint32_t>(K);
  hd.epoch = f.epoch;
  hd.payload_bytes = l.total;
  hd.flags = f.payload_checksum ? kFlagPayloadChecksum : 0;
  encode_header(hd, p, out);
  return kFrameHeaderBytes + l.total;
}

}  // namespace afd
