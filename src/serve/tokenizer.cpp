#include "serve/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serve/unicode.h"

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

// Finds the Split regex (and checks the byte-level stage) in a pre_tokenizer node.
Status read_pre_tokenizer(const json& pt, const std::string& src, SplitPattern* pattern) {
  if (pt.is_null()) return invalid_argument(src + ": pre_tokenizer is null; afd needs a byte-level pre-tokenizer");
  std::string type = pt.value("type", "");
  if (type == "ByteLevel") {
    if (pt.value("use_regex", true)) *pattern = SplitPattern::gpt2;
    if (pt.value("add_prefix_space", false))
      return not_supported(src + ": pre_tokenizer.add_prefix_space=true is not supported");
    return Status::ok();
  }
  if (type == "Split") {
    const json& p = pt.contains("pattern") ? pt["pattern"] : json();
    if (!p.is_object() || !p.contains("Regex") || !p["Regex"].is_string())
      return not_supported(src + ": pre_tokenizer Split without a Regex pattern");
    AFD_ASSIGN_OR_RETURN(*pattern, split_pattern_from_regex(p["Regex"].get<std::string>()));
    if (pt.value("behavior", "Isolated") != "Isolated" || pt.value("invert", false))
      return not_supported(src + ": pre_tokenizer Split behavior other than Isolated");
    return Status::ok();
  }
  if (type == "Sequence") {
    if (!pt.contains("pretokenizers") || !pt["pretokenizers"].is_array())
      return corrupt_data(src + ": pre_tokenizer Sequence without pretokenizers");
    for (const json& x : pt["pretokenizers"]) AFD_RETURN_IF_ERROR(read_pre_tokenizer(x, src, pattern));
    return Status::ok();
  }
  if (type == "Digits" || type == "Punctuation")
    return not_supported(src + ": pre_tokenizer type " + type + " is not supported");
  return not_supported(src + ": pre_tokenizer type '" + type + "' is not supported");
}

}  // namespace

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open tokenizer file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path);
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(const std::string& text, const std::string& src) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt_data(src + ": not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) return corrupt_data(src + ": missing 'model'");
  const json& model = j["model"];
  if (model.value("type", "BPE") != "BPE")
    return not_supported(src + ": model.type '" + model.value("type", "") + "' is not supported (only BPE)");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return corrupt_data(src + ": model.vocab missing");
  if (!model.contains("merges") || !model["merges"].is_array()) return corrupt_data(src + ": model.merges missing");

  std::shared_ptr<Tokenizer> t(new Tokenizer());
  if (j.contains("pre_tokenizer")) AFD_RETURN_IF_ERROR(read_pre_tokenizer(j["pre_tokenizer"], src, &t->pattern_));
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    std::string nt = j["normalizer"].value("type", "");
    // NFC is accepted and treated as identity: input text is assumed to be NFC already.
    if (nt != "NFC") return not_supported(src + ": normalizer type '" + nt + "' is not supported");
  }
  t->ignore_merges_ = model.value("ignore_merges", false);

  int64_t max_id = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return corrupt_data(src + ": vocab entry '" + it.key() + "' has no integer id");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (1LL << 31) - 1) return corrupt_data(src + ": vocab id out of range for '" + it.key() + "'");
    t->vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  std::vector<std::pair<std::string, int32_t>> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return corrupt_data(src + ": added_tokens entry without integer id and string content");
      int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= (1LL << 31) - 1) return corrupt_data(src + ": added token id out of range");
      std::string content = a["content"].get<std::string>();
      if (content.empty()) return corrupt_data(src + ": added token with empty content");
      added.push_back({content, static_cast<int32_t>(id)});
      max_id = std::max(max_id, id);
      if (a.value("special", false)) {
        if (static_cast<int64_t>(t->special_.size()) <= id) t->special_.resize(id + 1, 0);
        t->special_[id] = 1;
      }
    }
  }
  if (max_id > (1 << 24)) return corrupt_data(src + ": vocabulary larger than 16M entries");
  t->id_bytes_.assign(max_id + 1, std::string());
  t->special_.resize(max_id + 1, 0);
  for (const auto& [tok, id] : t->vocab_) t->id_bytes_[id] = byte_level_to_bytes(tok);
  for (const auto& [content, id] : added) {
    t->id_bytes_[id] = content;
    t->added_.push_back({content, id});
    t->added_first_[static_cast<uint8_t>(content[0])] = true;
  }
  std::stable_sort(t->added_.begin(), t->added_.end(),
                   [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });

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
  for (const json& m : model["merges"]) {
    if (!merge_parts(m, &a, &b)) return corrupt_data(src + ": malformed merge at rank " + std::to_string(rank));
    auto ia = t->vocab_.find(a), ib = t->vocab_.find(b), im = t->vocab_.find(a + b);
    if (ia == t->vocab_.end() || ib == t->vocab_.end() || im == t->vocab_.end())
      return corrupt_data(src + ": merge '" + a + " " + b + "' at rank " + std::to_string(rank) +
                          " names tokens missing from the vocabulary");
    t->merges_.emplace(pair_key(ia->second, ib->second), Merge{rank, im->second});
    ++rank;
  }
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
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

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>* out) const {
  for (std::string_view piece : pre_tokenize(text, pattern_)) bpe(piece, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!added_first_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const Added* hit = nullptr;
    for (const Added& a : added_) {
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    encode_plain(text.substr(start, i - start), &out);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  encode_plain(text.substr(start), &out);
  return out;
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
  for (const Added& a : added_)
    if (a.content == token) return a.id;
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
