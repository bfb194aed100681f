#include "runtime/speculative.h"

#include <algorithm>

#include "model/weights.h"
#include "runtime/mtp_head.h"

namespace afd {

namespace {
int32_t argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}
}  // namespace

std::vector<int32_t> NgramDrafter::lookup(std::span<const int32_t> ctx, int64_t max_drafts) const {
  const int64_t L = static_cast<int64_t>(ctx.size());
  for (int64_t n = std::min(max_, L - 1); n >= min_ && max_drafts > 0; --n) {
    const int32_t* tail = ctx.data() + L - n;
    // Latest earlier occurrence: start s < L - n, scanning backwards.
    for (int64_t s = L - n - 1; s >= 0; --s) {
      if (!std::equal(tail, tail + n, ctx.data() + s)) continue;
      const int64_t from = s + n, to = std::min(L, from + max_drafts);
      return std::vector<int32_t>(ctx.begin() + from, ctx.begin() + to);
    }
  }
  return {};
}

Status NgramDrafter::propose(std::span<const Query> queries, std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(queries.size(), {});
  for (size_t i = 0; i < queries.size(); ++i) (*drafts)[i] = lookup(queries[i].context, queries[i].max_drafts);
  return Status();
}

MtpDrafter::MtpDrafter(std::unique_ptr<MtpHead> head) : head_(std::move(head)) {}
MtpDrafter::~MtpDrafter() {
  for (auto& [key, s] : seqs_) head_->release_sequence(s.head_seq);
}

Status MtpDrafter::add_sequence(int64_t key) {
  if (seqs_.count(key)) return invalid_argument("MTP drafter: sequence " + std::to_string(key) + " exists");
  AFD_ASSIGN_OR_RETURN(int64_t id, head_->create_sequence());
  seqs_[key].head_seq = id;
  return Status();
}

void MtpDrafter::release_sequence(int64_t key) {
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return;
  head_->release_sequence(it->second.head_seq);
  seqs_.erase(it);
}

Status MtpDrafter::observe(int64_t key, int64_t pos, std::span<const float> hidden, std::span<const int32_t> next) {
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return invalid_argument("MTP drafter: unknown sequence " + std::to_string(key));
  Seq& s = it->second;
  const int64_t H = head_->config().hidden_size;
  if (static_cast<int64_t>(hidden.size()) != static_cast<int64_t>(next.size()) * H)
    return invalid_argument("MTP drafter: " + std::to_string(next.size()) + " tokens with " +
                            std::to_string(hidden.size()) + " hidden values");
  // The pending rows continue the final positions: they start at n_final.
  const int64_t expect = s.n_final + static_cast<int64_t>(s.pending_next.size());
  if (pos != expect)
    return invalid_argument("MTP drafter: sequence " + std::to_string(key) + " observed at position " +
                            std::to_string(pos) + ", expected " + std::to_string(expect));
  s.pending_hidden.insert(s.pending_hidden.end(), hidden.begin(), hidden.end());
  s.pending_next.insert(s.pending_next.end(), next.begin(), next.end());
  return Status();
}

Status MtpDrafter::propose(std::span<const Query> queries, std::vector<std::vector<int32_t>>* drafts) {
  drafts->assign(queries.size(), {});
  const int64_t H = head_->config().hidden_size, V = head_->config().vocab_size;
  // Pass 0: the final positions observed since the last proposal (the speculative positions
  // of that proposal dropped first); each sequence's last row gives d1. Passes 1..: the module
  // on its own block output and the previous draft.
  std::vector<MtpHead::Item> items;
  std::vector<size_t> who;
  for (size_t i = 0; i < queries.size(); ++i) {
    auto it = seqs_.find(queries[i].key);
    if (it == seqs_.end()) return invalid_argument("MTP drafter: unknown sequence " + std::to_string(queries[i].key));
    Seq& s = it->second;
    head_->truncate(s.head_seq, s.n_final);
    if (s.pending_next.empty()) continue;
    items.push_back(MtpHead::Item{s.head_seq, s.pending_hidden, s.pending_next});
    who.push_back(i);
  }
  std::vector<float> logits, block_out, prev;
  if (!items.empty()) AFD_RETURN_IF_ERROR(head_->forward(items, &logits, &block_out));
  int64_t row = 0;
  std::vector<size_t> more;  // queries that want another draft
  for (size_t j = 0; j < items.size(); ++j) {
    const size_t i = who[j];
    Seq& s = seqs_[queries[i].key];
    const int64_t n = static_cast<int64_t>(s.pending_next.size());
    row += n;
    s.n_final += n;
    s.pending_hidden.clear();
    s.pending_next.clear();
    if (queries[i].max_drafts <= 0) continue;
    (*drafts)[i].push_back(argmax(&logits[(row - 1) * V], V));
    if (queries[i].max_drafts > 1) {
      more.push_back(i);
      prev.insert(prev.end(), block_out.begin() + (row - 1) * H, block_out.begin() + row * H);
    }
  }
  while (!more.empty()) {
    items.clear();
    for (size_t j = 0; j < more.size(); ++j) {
      const size_t i = more[j];
      items.push_back(MtpHead::Item{seqs_[queries[i].key].head_seq,
                                    std::span<const float>(prev.data() + j * H, static_cast<size_t>(H)),
                                    std::span<const int32_t>(&(*drafts)[i].back(), 1)});
    }
    AFD_RETURN_IF_ERROR(head_->forward(items, &logits, &block_out));
    std::vector<size_t> next_more;
    std::vector<float> next_prev;
    for (size_t j = 0; j < more.size(); ++j) {
      const size_t i = more[j];
      (*drafts)[i].push_back(argmax(&logits[j * V], V));
      if (static_cast<int64_t>((*drafts)[i].size()) < queries[i].max_drafts) {
        next_more.push_back(i);
        next_prev.insert(next_prev.end(), block_out.begin() + j * H, block_out.begin() + (j + 1) * H);
      }
    }
    more = std::move(next_more);
    prev = std::move(next_prev);
  }
  return Status();
}

Result<std::unique_ptr<Drafter>> make_drafter(const EngineOptions& opt, std::shared_ptr<const ModelWeights> weights,
                                              const Engine* engine) {
  const SpeculativeOptions& so = opt.speculative;
  switch (so.method) {
    case SpeculativeMethod::none:
      return std::unique_ptr<Drafter>();
    case SpeculativeMethod::ngram:
      return std::unique_ptr<Drafter>(new NgramDrafter(so.ngram_min, so.ngram_max));
    case SpeculativeMethod::mtp: {
      if (!weights) return invalid_argument("--speculative mtp: no model");
      if (weights->config.num_nextn_predict_layers < 1)
        return invalid_argument("--speculative mtp: the model has no MTP module (config.json num_nextn_predict_layers "
                                "is 0); use --speculative ngram");
      auto module = load_mtp_module(weights, 0);
      if (!module.ok()) return module.status().with_context("--speculative mtp");
      auto head = MtpHead::create(std::move(*module), opt, engine ? engine->compute_pool() : nullptr);
      if (!head.ok()) return head.status().with_context("--speculative mtp");
      return std::unique_ptr<Drafter>(new MtpDrafter(std::move(*head)));
    }
  }
  return invalid_argument("unknown speculative method");
}

std::vector<SampledToken> verify_drafts(Sampler& sampler, const float* rows, int64_t vocab,
                                        std::span<const int32_t> drafts, std::span<const uint64_t* const> masks) {
  std::vector<SampledToken> out;
  auto mask = [&](size_t j) { return masks.empty() ? nullptr : masks[j]; };
  for (size_t j = 0; j < drafts.size(); ++j) {
    bool accepted = false;
    out.push_back(sampler.verify(rows + j * vocab, vocab, drafts[j], &accepted, mask(j)));
    if (!accepted) return out;
  }
  out.push_back(sampler.sample(rows + drafts.size() * vocab, vocab, mask(drafts.size())));
  return out;
}

void SpeculativeStats::record(int64_t proposed, int64_t accepted) {
  ++steps;
  drafts_proposed += proposed;
  drafts_accepted += accepted;
  tokens_emitted += accepted + 1;
  if (static_cast<int64_t>(proposed_at.size()) < proposed) {
    proposed_at.resize(static_cast<size_t>(proposed), 0);
    accepted_at.resize(static_cast<size_t>(proposed), 0);
  }
  for (int64_t j = 0; j < proposed; ++j) ++proposed_at[j];
  for (int64_t j = 0; j < accepted; ++j) ++accepted_at[j];
}

void SpeculativeStats::add(const SpeculativeStats& o) {
  steps += o.steps;
  drafts_proposed += o.drafts_proposed;
  drafts_accepted += o.drafts_accepted;
  tokens_emitted += o.tokens_emitted;
  if (proposed_at.size() < o.proposed_at.size()) {
    proposed_at.resize(o.proposed_at.size(), 0);
    accepted_at.resize(o.proposed_at.size(), 0);
  }
  for (size_t j = 0; j < o.proposed_at.size(); ++j) {
    proposed_at[j] += o.proposed_at[j];
    accepted_at[j] += o.accepted_at[j];
  }
}

}  // namespace afd
