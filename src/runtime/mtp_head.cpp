#include "runtime/mtp_head.h"

#include <algorithm>

#include "model/attention_variant.h"

namespace afd {

Result<std::unique_ptr<MtpHead>> MtpHead::create(MtpModule module, const EngineOptions& opt,
                                                 std::shared_ptr<ThreadPool> pool) {
  if (!module.block) return invalid_argument("MTP head: no module");
  const ModelConfig& c = module.block->config;
  const bool ref = opt.precision == Precision::reference;
  KvCacheConfig kc;
  kc.n_layers = 1;
  const KvLayout kvl = kv_layout(c);
  kc.n_kv_heads = kvl.n_kv_heads;
  kc.head_dim = kvl.k_dim;
  kc.k_only = kvl.v_dim == 0;
  kc.block_size = opt.kv.block_size;
  kc.dtype = ref ? DType::f32 : opt.kv.dtype;
  kc.prefix_caching = false;
  int64_t cap = opt.kv.capacity_tokens;
  if (cap == 0) cap = std::min<int64_t>(opt.kv.max_seqs * c.max_position_embeddings, 131072);
  kc.n_blocks = (cap + kc.block_size - 1) / kc.block_size;
  AFD_ASSIGN_OR_RETURN(auto kv, PagedKvCache::create(kc));
  AttentionOptions ao;
  ao.prec = ref ? kernels::ActPrecision::f32 : kernels::ActPrecision::bf16;
  ao.batch_invariant = opt.batch_invariant();
  LocalFfnOptions fo;
  fo.part.prec = ao.prec;
  fo.part.order = ao.order();
  if (!pool) pool = std::make_shared<ThreadPool>(opt.n_threads);
  return std::unique_ptr<MtpHead>(
      new MtpHead(std::move(module), std::move(kv), std::move(pool), ao, std::move(fo), opt.kv.max_seqs));
}

MtpHead::MtpHead(MtpModule module, std::unique_ptr<PagedKvCache> kv, std::shared_ptr<ThreadPool> pool,
                 AttentionOptions ao, LocalFfnOptions fo, int64_t max_seqs)
    : module_(std::move(module)),
      kv_(std::move(kv)),
      pool_(std::move(pool)),
      attn_(module_.block, kv_.get(), ao, pool_.get()),
      ffn_(module_.block, std::move(fo), pool_.get()),
      prec_(ao.prec),
      order_(ao.order()),
      max_seqs_(max_seqs),
      scratch_(pool_->size()) {}

Result<int64_t> MtpHead::create_sequence() {
  if (n_live_ >= max_seqs_)
    return resource_exhausted("MTP head: " + std::to_string(max_seqs_) + " sequences already live");
  const int64_t id = next_seq_++;
  AFD_RETURN_IF_ERROR(kv_->add_sequence(id));
  ++n_live_;
  return id;
}

void MtpHead::release_sequence(int64_t seq_id) {
  if (!kv_->has_sequence(seq_id)) return;
  kv_->remove_sequence(seq_id);
  --n_live_;
}

KvUsage MtpHead::kv_usage() const {
  return KvUsage{kv_->config().n_blocks, kv_->n_used_blocks(), kv_->config().block_size};
}

void MtpHead::truncate(int64_t seq_id, int64_t new_length) {
  const int64_t len = kv_->length(seq_id);
  if (len < 0 || new_length >= len) return;
  kv_->truncate(seq_id, std::max<int64_t>(new_length, 0));
}

Status MtpHead::forward(std::span<const Item> items, std::vector<float>* logits, std::vector<float>* block_out) {
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  int64_t n = 0, blocks = 0;
  for (const Item& it : items) {
    const int64_t len = kv_->length(it.seq_id);
    if (len < 0) return invalid_argument("MTP head: unknown sequence " + std::to_string(it.seq_id));
    const int64_t k = static_cast<int64_t>(it.next_tokens.size());
    if (k == 0 || static_cast<int64_t>(it.hidden.size()) != k * H)
      return invalid_argument("MTP head: sequence " + std::to_string(it.seq_id) + ": " + std::to_string(k) +
                              " tokens with " + std::to_string(it.hidden.size()) + " hidden values (hidden_size " +
                              std::to_string(H) + ")");
    for (int32_t t : it.next_tokens) {
      if (t < 0 || t >= V)
        return out_of_range("MTP head: token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
    }
    if (c.max_position_embeddings > 0 && len + k > c.max_position_embeddings)
      return out_of_range("MTP head: context of " + std::to_string(len + k) +
                          " tokens exceeds max_position_embeddings");
    blocks += kv_->blocks_needed(it.seq_id, k);
    n += k;
  }
  if (blocks > kv_->n_free_blocks())
    return resource_exhausted("MTP head kv cache: " + std::to_string(blocks) + " blocks needed, " +
                              std::to_string(kv_->n_free_blocks()) + " free");
  std::vector<int64_t> old_len;
  for (const Item& it : items) {
    old_len.push_back(kv_->length(it.seq_id));
    AFD_RETURN_IF_ERROR(kv_->append(it.seq_id, static_cast<int64_t>(it.next_tokens.size())));  // checked above
  }
  b_.resize(c, n);
  cat_.resize(static_cast<size_t>(n * 2 * H));
  int64_t t = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    for (size_t k = 0; k < items[i].next_tokens.size(); ++k, ++t) {
      b_.tokens[t] = items[i].next_tokens[k];
      b_.seq[t] = items[i].seq_id;
      b_.pos[t] = old_len[i] + static_cast<int64_t>(k);
      kernels::rmsnorm(&items[i].hidden[k * H], module_.hnorm.data, 1, H, static_cast<float>(c.rms_norm_eps),
                       &cat_[t * 2 * H + H]);
    }
  }
  attn_.embed(b_);  // x = the module's embedding of t[i+1]
  for (int64_t r = 0; r < n; ++r)
    kernels::rmsnorm(&b_.x[r * H], module_.enorm.data, 1, H, static_cast<float>(c.rms_norm_eps), &cat_[r * 2 * H]);
  linear(module_.eh_proj, cat_.data(), n, b_.x.data(), prec_, pool_.get(), scratch_, order_);
  attn_.forward(0, b_);
  Status s = ffn_.dispatch(0, 0, b_);
  if (s.is_ok()) s = ffn_.combine(0, 0, b_);
  if (!s.is_ok()) {
    for (size_t i = 0; i < items.size(); ++i) kv_->truncate(items[i].seq_id, old_len[i]);
    return s;
  }
  attn_.add_ffn(b_);
  if (block_out) block_out->assign(b_.x.begin(), b_.x.begin() + n * H);
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) rows[r] = r;
  logits->resize(static_cast<size_t>(n * V));
  attn_.logits(b_, rows, logits->data());
  return Status();
}

}  // namespace afd
