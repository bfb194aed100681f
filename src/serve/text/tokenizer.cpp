#include "serve/text/tokenizer.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

using json = nlohmann::json;

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

// Splits a merges entry ("a b" or ["a", "b"]) into its two parts.
bool merge_parts(const json& m, std::string* a, std::string* b) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    size_t sp = s.find(' ', 1);
    if (sp == std::string::npos) return false;
    *a = s.substr(0, sp);
    *b = s.substr(sp + 1);
    return true;
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    *a = m[0].get<std::string>();
    *b = m[1].get<std::string>();
    return true;
  }
  return false;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool flag(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

// A token named in tokenizer_config.json: a string, {"content": ...}, or null ("").
std::string config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return {};
}

}  // namespace

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::string& path) {
  AFD_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return from_json(text, path);
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load_dir(const std::string& dir) {
  const std::string tok_path = dir + "/tokenizer.json", cfg_path = dir + "/tokenizer_config.json";
  AFD_ASSIGN_OR_RETURN(std::string text, read_text_file(tok_path));
  std::string cfg;
  if (std::filesystem::exists(cfg_path)) {
    AFD_ASSIGN_OR_RETURN(cfg, read_text_file(cfg_path));
  }
  return from_json(text, tok_path, cfg, cfg_path);
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(const std::string& text, const std::string& src) {
  return from_json(text, src, "", "");
}

Status Tokenizer::read_model(const json& model, const std::string& src) {
  if (model.value("type", "BPE") != "BPE")
    return not_supported(src + ": model.type '" + model.value("type", "") + "' is not supported (only BPE)");
  if (flag(model, "byte_fallback"))
    return not_supported(src + ": model.byte_fallback=true (a SentencePiece-style BPE) is not supported; afd needs a "
                               "byte-level BPE");
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    return not_supported(src + ": model.dropout > 0 (random merges) is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      return not_supported(src + ": model." + k + " is not supported");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return corrupt_data(src + ": model.vocab missing");
  if (!model.contains("merges") || !model["merges"].is_array()) return corrupt_data(src + ": model.merges missing");
  ignore_merges_ = flag(model, "ignore_merges");
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return corrupt_data(src + ": vocab entry '" + it.key() + "' has no integer id");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (1 << 24)) return corrupt_data(src + ": vocab id out of range for '" + it.key() + "'");
    vocab_[it.key()] = static_cast<int32_t>(id);
  }
  return Status();
}

Status Tokenizer::read_post_processor(const json& pp, const std::string& where) {
  if (pp.is_null()) return Status();
  if (!pp.is_object()) return corrupt_data(where + " must be a JSON object");
  const std::string type = pp.value("type", "");
  auto check_id = [&](int64_t id, const std::string& what) -> Status {
    if (id < 0 || id >= vocab_size()) return corrupt_data(where + ": " + what + " id " + std::to_string(id) + " is not a token");
    return Status();
  };
  if (type == "ByteLevel") return Status();  // offsets only
  if (type == "Sequence") {
    if (!pp.contains("processors") || !pp["processors"].is_array())
      return corrupt_data(where + ": Sequence without a 'processors' array");
    for (size_t i = 0; i < pp["processors"].size(); ++i)
      AFD_RETURN_IF_ERROR(read_post_processor(pp["processors"][i], where + ".processors[" + std::to_string(i) + "]"));
    return Status();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json& cls = pp.contains("cls") ? pp["cls"] : json();
    const json& sep = pp.contains("sep") ? pp["sep"] : json();
    if (!cls.is_array() || cls.size() != 2 || !cls[1].is_number_integer() || !sep.is_array() || sep.size() != 2 ||
        !sep[1].is_number_integer())
      return corrupt_data(where + ": " + type + " needs 'cls' and 'sep' as [token, id]");
    AFD_RETURN_IF_ERROR(check_id(cls[1].get<int64_t>(), "cls"));
    AFD_RETURN_IF_ERROR(check_id(sep[1].get<int64_t>(), "sep"));
    prefix_.insert(prefix_.begin(), static_cast<int32_t>(cls[1].get<int64_t>()));
    suffix_.push_back(static_cast<int32_t>(sep[1].get<int64_t>()));
    return Status();
  }
  if (type == "TemplateProcessing") {
    if (!pp.contains("single") || !pp["single"].is_array())
      return corrupt_data(where + ": TemplateProcessing without a 'single' template");
    const json& specials = pp.contains("special_tokens") ? pp["special_tokens"] : json::object();
    std::vector<int32_t> pre, post;
    bool seen_a = false;
    for (const json& item : pp["single"]) {
      if (item.is_object() && item.contains("Sequence")) {
        if (seen_a) return not_supported(where + ": a single template with the sequence twice");
        seen_a = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string())
        return corrupt_data(where + ": template items must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array())
        return corrupt_data(where + ": template names special token '" + name + "' missing from special_tokens");
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) return corrupt_data(where + ": special token '" + name + "' has a non-integer id");
        AFD_RETURN_IF_ERROR(check_id(id.get<int64_t>(), "special token '" + name + "'"));
        (seen_a ? post : pre).push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    if (!seen_a) return corrupt_data(where + ": single template without the sequence ($A)");
    prefix_.insert(prefix_.begin(), pre.begin(), pre.end());
    suffix_.insert(suffix_.end(), post.begin(), post.end());
    return Status();
  }
  return not_supported(where + ": post_processor type '" + type +
                       "' is not supported (afd supports TemplateProcessing, RobertaProcessing, BertProcessing, "
                       "ByteLevel and Sequence)");
}

Status Tokenizer::read_config(const std::string& text, const std::string& src) {
  json cfg = json::parse(text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return corrupt_data(src + ": not a JSON object");
  auto resolve = [&](const char* key) -> Result<int32_t> {
    std::string name = config_token(cfg, key);
    if (name.empty()) return -1;
    int32_t id = token_id(name);
    if (id < 0) return corrupt_data(src + ": " + key + " '" + name + "' is not a token of the tokenizer");
    return id;
  };
  auto bos = resolve("bos_token");
  if (bos.ok()) bos_id_ = *bos;
  // As transformers: when either key is present, the post-processor becomes
  // [bos if add_bos_token] $A [eos if add_eos_token].
  if (!cfg.contains("add_bos_token") && !cfg.contains("add_eos_token")) return Status();
  prefix_.clear();
  suffix_.clear();
  if (flag(cfg, "add_bos_token")) {
    if (!bos.ok()) return bos.status();
    if (*bos >= 0) prefix_.push_back(*bos);
  }
  if (flag(cfg, "add_eos_token")) {
    AFD_ASSIGN_OR_RETURN(int32_t eos, resolve("eos_token"));
    if (eos >= 0) suffix_.push_back(eos);
  }
  return Status();
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(const std::string& text, const std::string& src,
                                                              const std::string& config_text,
                                                              const std::string& config_source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt_data(src + ": not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) return corrupt_data(src + ": missing 'model'");
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  AFD_RETURN_IF_ERROR(t->read_model(j["model"], src));

  const json null_node;
  AFD_ASSIGN_OR_RETURN(t->normalizer_,
                       Normalizer::from_json(j.contains("normalizer") ? j["normalizer"] : null_node, src + ": normalizer"));
  AFD_ASSIGN_OR_RETURN(t->pre_, PreTokenizer::from_json(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : null_node,
                                                        src + ": pre_tokenizer"));

  int64_t max_id = -1;
  for (const auto& [tok, id] : t->vocab_) max_id = std::max<int64_t>(max_id, id);
  std::vector<AddedToken> raw, norm;
  std::vector<AddedToken> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return corrupt_data(src + ": added_tokens entry without integer id and string content");
      int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > (1 << 24)) return corrupt_data(src + ": added token id out of range");
      AddedToken t_;
      t_.content = a["content"].get<std::string>();
      if (t_.content.empty()) return corrupt_data(src + ": added token " + std::to_string(id) + " has empty content");
      if (utf8_invalid_offset(t_.content) != std::string::npos)
        return corrupt_data(src + ": added token " + std::to_string(id) + " is not valid UTF-8");
      t_.id = static_cast<int32_t>(id);
      t_.special = flag(a, "special");
      t_.single_word = flag(a, "single_word");
      t_.lstrip = flag(a, "lstrip");
      t_.rstrip = flag(a, "rstrip");
      // HF's default for a missing 'normalized' is !special.
      t_.normalized = a.contains("normalized") && a["normalized"].is_boolean() ? a["normalized"].get<bool>() : !t_.special;
      added.push_back(t_);
      max_id = std::max(max_id, id);
    }
  }
  t->id_bytes_.assign(max_id + 1, std::string());
  t->special_.assign(max_id + 1, 0);
  for (const auto& [tok, id] : t->vocab_) t->id_bytes_[id] = byte_level_to_bytes(tok);
  if (t->ignore_merges_) {
    t->whole_tokens_.reserve(t->vocab_.size());
    for (const auto& [tok, id] : t->vocab_) {
      std::string raw = byte_level_to_bytes(tok);
      if (bytes_to_byte_level(raw) == tok) t->whole_tokens_.emplace(std::move(raw), id);  // byte-level keys only
    }
  }
  for (AddedToken& a : added) {
    t->id_bytes_[a.id] = a.content;
    t->special_[a.id] = a.special;
    t->added_ids_.emplace(a.content, a.id);
    if (a.normalized && !t->normalizer_.identity()) {
      auto n = t->normalizer_.apply(a.content);
      if (!n.ok()) return n.status().with_context(src + ": normalizing added token " + std::to_string(a.id));
      if (n->empty()) continue;  // normalizes to nothing: cannot be found in text
      a.content = std::move(*n);
    }
    (a.normalized ? norm : raw).push_back(a);
  }
  AFD_ASSIGN_OR_RETURN(t->raw_added_, AddedTokens::build(raw));
  AFD_ASSIGN_OR_RETURN(t->norm_added_, AddedTokens::build(norm));

  t->byte_token_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(&s, byte_to_unicode(static_cast<uint8_t>(b)));
    auto it = t->vocab_.find(s);
    if (it == t->vocab_.end())
      return corrupt_data(src + ": byte-level vocabulary lacks the token for byte " + std::to_string(b));
    t->byte_token_[b] = it->second;
  }

  int32_t rank = 0;
  std::string a, b;
  const json& model = j["model"];
  for (const json& m : model["merges"]) {
    if (!merge_parts(m, &a, &b)) return corrupt_data(src + ": malformed merge at rank " + std::to_string(rank));
    auto ia = t->vocab_.find(a), ib = t->vocab_.find(b), im = t->vocab_.find(a + b);
    if (ia == t->vocab_.end() || ib == t->vocab_.end() || im == t->vocab_.end())
      return corrupt_data(src + ": merge '" + a + " " + b + "' at rank " + std::to_string(rank) +
                          " names tokens missing from the vocabulary");
    t->merges_.emplace(pair_key(ia->second, ib->second), Merge{rank, im->second});
    ++rank;
  }

  AFD_RETURN_IF_ERROR(t->read_post_processor(j.contains("post_processor") ? j["post_processor"] : null_node,
                                             src + ": post_processor"));
  if (!config_text.empty()) AFD_RETURN_IF_ERROR(t->read_config(config_text, config_source));
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = whole_tokens_.find(piece);
    if (it != whole_tokens_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCacheMaxPiece) return bpe_uncached(piece, out);
  if (cache_mu_.try_lock_shared()) {
    auto it = cache_.find(piece);
    bool hit = it != cache_.end();
    if (hit) out->insert(out->end(), it->second.begin(), it->second.end());
    cache_mu_.unlock_shared();
    if (hit) return;
  }
  const size_t first = out->size();
  bpe_uncached(piece, out);
  if (!cache_full_.load(std::memory_order_relaxed) && cache_mu_.try_lock()) {
    if (cache_.size() < kCacheCapacity)
      cache_.emplace(std::string(piece), std::vector<int32_t>(out->begin() + first, out->end()));
    else
      cache_full_.store(true, std::memory_order_relaxed);
    cache_mu_.unlock();
  }
}

void Tokenizer::bpe_uncached(std::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(bytes_to_byte_level(piece));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Sym> s(n);
  for (int32_t i = 0; i < n; ++i) s[i] = {byte_token_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  // Candidate merges ordered by (rank, left position): the same order as HF tokenizers.
  struct Cand {
    int32_t rank, left, right, left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> pq;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    int32_t r = s[l].next;
    if (r < 0) return;
    auto it = merges_.find(pair_key(s[l].id, s[r].id));
    if (it != merges_.end()) pq.push({it->second.rank, l, r, s[l].id, s[r].id, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!pq.empty()) {
    Cand c = pq.top();
    pq.pop();
    Sym& L = s[c.left];
    if (!L.alive || L.next != c.right || L.id != c.left_id || !s[c.right].alive || s[c.right].id != c.right_id) continue;
    Sym& R = s[c.right];
    L.id = c.merged;
    R.alive = false;
    L.next = R.next;
    if (R.next >= 0) s[R.next].prev = c.left;
    push(L.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = s[i].next) out->push_back(s[i].id);
}

Status Tokenizer::encode_pretokenized(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  AFD_RETURN_IF_ERROR(pre_.split(text, &pieces, &arena));
  for (std::string_view p : pieces) bpe(p, out);
  return Status();
}

Status Tokenizer::encode_segment(std::string_view text, bool match_added, std::vector<int32_t>* out) const {
  std::string normalized;
  if (!normalizer_.identity()) {
    AFD_ASSIGN_OR_RETURN(normalized, normalizer_.apply(text));
    text = normalized;
  }
  if (!match_added || norm_added_.empty()) return encode_pretokenized(text, out);
  std::vector<AddedTokens::Segment> segs;
  AFD_RETURN_IF_ERROR(norm_added_.split(text, &segs));
  for (const auto& s : segs) {
    if (s.id >= 0) out->push_back(s.id);
    else AFD_RETURN_IF_ERROR(encode_pretokenized(text.substr(s.begin, s.end - s.begin), out));
  }
  return Status();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool parse_special) const {
  if (size_t bad = utf8_invalid_offset(text); bad != std::string_view::npos)
    return invalid_argument("text to tokenize is not valid UTF-8 (at byte " + std::to_string(bad) + ")");
  std::vector<int32_t> out;
  if (!parse_special || raw_added_.empty()) {
    AFD_RETURN_IF_ERROR(encode_segment(text, parse_special, &out));
    return out;
  }
  std::vector<AddedTokens::Segment> segs;
  AFD_RETURN_IF_ERROR(raw_added_.split(text, &segs));
  for (const auto& s : segs) {
    if (s.id >= 0) out.push_back(s.id);
    else AFD_RETURN_IF_ERROR(encode_segment(text.substr(s.begin, s.end - s.begin), true, &out));
  }
  return out;
}

Result<std::vector<int32_t>> Tokenizer::encode_prompt(std::string_view text) const {
  AFD_ASSIGN_OR_RETURN(std::vector<int32_t> body, encode(text, true));
  std::vector<int32_t> out;
  out.reserve(prefix_.size() + body.size() + suffix_.size());
  out.insert(out.end(), prefix_.begin(), prefix_.end());
  out.insert(out.end(), body.begin(), body.end());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  auto r = encode(text, true);
  return r.ok() ? std::move(*r) : std::vector<int32_t>{};
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= static_cast<int32_t>(id_bytes_.size())) return kEmpty;
  return id_bytes_[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(special_.size()) && special_[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids)
    if (!(skip_special && is_special(id))) bytes += token_bytes(id);
  return utf8_sanitize(bytes);
}

int32_t Tokenizer::token_id(const std::string& token) const {
  auto a = added_ids_.find(token);
  if (a != added_ids_.end()) return a->second;
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

std::string StreamDecoder::add(int32_t token) {
  if (skip_special_ && tok_->is_special(token)) return "";
  pending_ += tok_->token_bytes(token);
  size_t n = utf8_complete_prefix(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace afd::serve
