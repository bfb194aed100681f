#include "serve/text/tokenizer_writer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "serve/text/pre_tokenizer.h"
#include "serve/text/tokenizer.h"
#include "serve/text/unicode.h"

namespace afd {
namespace {

using json = nlohmann::ordered_json;
using serve::bytes_to_byte_level;

// Training text for the built-in merges (written for afd; any English prose would do).
const char* kCorpus =
    "The engine reads the model from disk and answers requests from many users at the same time. "
    "Each request is a sequence of tokens; the scheduler puts the sequences that are ready into one batch, "
    "and every step of the model produces one new token for each of them. When a sequence is finished, "
    "its place in the batch is given to the next request that is waiting in the queue. "
    "The attention part of every layer keeps the keys and values of the past tokens in a paged cache, "
    "and the expert part sends each token to the few experts that the router chose for it. "
    "Hello! How are you today? I am fine, thank you. What is the weather like in the city where you live? "
    "It is sunny and warm, with a light wind from the west. We should go for a walk in the park this afternoon. "
    "Numbers such as 1, 2, 3, 10, 42, 100, 2024 and 3.14 appear in text, and so do names like Alice and Bob. "
    "You are a helpful assistant. Please write a short story about a robot who learns to paint. "
    "Once upon a time there was a small robot that lived in a quiet town near the sea. Every morning it "
    "watched the sun rise over the water and wished that it could keep the colors forever. "
    "The user asked a question and the assistant gave an answer that was clear, short and correct. "
    "def main():\n    print(\"hello world\")\n    return 0\n\nfor i in range(10):\n    total += i\n"
    "{\"role\": \"user\", \"content\": \"hello\"}\n"
    "Serving systems measure the time to the first token and the time per output token for every request, "
    "and they report the throughput of the whole system in tokens per second. ";

std::vector<std::string> split_utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    serve::utf8_decode(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

struct Trainer {
  std::vector<std::string> tokens;                 // id -> byte-level string
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::pair<std::string, std::string>> merges;

  int32_t add(const std::string& t) {
    auto [it, inserted] = ids.emplace(t, static_cast<int32_t>(tokens.size()));
    if (inserted) tokens.push_back(t);
    return it->second;
  }

  // Classic BPE training: repeatedly merge the most frequent adjacent pair (ties broken
  // by the pair's strings, so the result is deterministic) until `target` tokens exist
  // or no pair occurs twice.
  void train(const std::vector<std::string_view>& pieces, size_t target) {
    std::map<std::string, int64_t> word_counts;
    for (std::string_view p : pieces) word_counts[bytes_to_byte_level(p)]++;
    std::vector<std::pair<std::vector<std::string>, int64_t>> words;
    for (auto& [w, c] : word_counts) words.push_back({split_utf8_chars(w), c});
    while (tokens.size() < target) {
      std::map<std::pair<std::string, std::string>, int64_t> counts;
      for (auto& [w, c] : words)
        for (size_t i = 0; i + 1 < w.size(); ++i) counts[{w[i], w[i + 1]}] += c;
      const std::pair<std::string, std::string>* best = nullptr;
      int64_t best_count = 1;
      for (auto& [pair, c] : counts)
        if (c > best_count && !ids.count(pair.first + pair.second)) {
          best = &pair;
          best_count = c;
        }
      if (!best) break;
      std::string a = best->first, b = best->second, ab = a + b;
      merges.push_back({a, b});
      add(ab);
      for (auto& [w, c] : words) {
        std::vector<std::string> nw;
        for (size_t i = 0; i < w.size(); ++i) {
          if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
            nw.push_back(ab);
            ++i;
          } else {
            nw.push_back(w[i]);
          }
        }
        w = std::move(nw);
      }
    }
  }

  // Fills up to `target` with merges of pairs of existing tokens, enumerated by
  // anti-diagonals over the first `base` ids (skipping strings already present).
  bool fill(size_t target) {
    const size_t base = tokens.size();
    for (size_t d = 0; d < 2 * base && tokens.size() < target; ++d) {
      for (size_t a = d >= base ? d - base + 1 : 0; a <= d && a < base && tokens.size() < target; ++a) {
        size_t b = d - a;
        std::string ab = tokens[a] + tokens[b];
        if (ids.count(ab)) continue;
        merges.push_back({tokens[a], tokens[b]});
        add(ab);
      }
    }
    return tokens.size() >= target;
  }
};

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return io_error("cannot write " + path);
  f << text;
  f.close();
  if (!f) return io_error("short write to " + path);
  return Status();
}

// A Qwen-style ChatML template (written for afd): optional system message first, each
// message as <|im_start|>role\ncontent<|im_end|>\n, then the assistant header.
const char* kChatTemplate =
    "{%- for message in messages %}\n"
    "{%- if message.content is string %}\n"
    "{%- set content = message.content %}\n"
    "{%- else %}\n"
    "{%- set ns = namespace(text='') %}\n"
    "{%- for part in message.content %}\n"
    "{%- if part.type == 'text' %}{%- set ns.text = ns.text + part.text %}{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- set content = ns.text %}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + content | trim + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

}  // namespace

Result<TokenizerFilesInfo> write_tokenizer_files(const std::string& dir, int64_t vocab_size) {
  if (vocab_size < 259) return invalid_argument("tokenizer vocab_size must be >= 259, got " + std::to_string(vocab_size));
  if (vocab_size > (1 << 20)) return invalid_argument("tokenizer vocab_size too large: " + std::to_string(vocab_size));
  const size_t n_bpe = static_cast<size_t>(vocab_size - 3);
  Trainer tr;
  for (int b = 0; b < 256; ++b) tr.add(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  // The corpus is cut into words by the same Split pattern the written tokenizer uses.
  AFD_ASSIGN_OR_RETURN(auto split_re, serve::Regex::compile(serve::split_pattern_regex(serve::SplitPattern::qwen2)));
  std::vector<std::string_view> words;
  AFD_RETURN_IF_ERROR(serve::split_pieces(kCorpus, *split_re, serve::SplitBehavior::isolated, false, &words));
  tr.train(words, n_bpe);
  if (!tr.fill(n_bpe)) return internal_error("tokenizer writer could not fill " + std::to_string(n_bpe) + " tokens");

  TokenizerFilesInfo info;
  info.vocab_size = vocab_size;
  info.endoftext_id = static_cast<int32_t>(vocab_size - 3);
  info.im_start_id = static_cast<int32_t>(vocab_size - 2);
  info.im_end_id = static_cast<int32_t>(vocab_size - 1);
  const std::pair<const char*, int32_t> specials[] = {
      {"<|endoftext|>", info.endoftext_id}, {"<|im_start|>", info.im_start_id}, {"<|im_end|>", info.im_end_id}};

  json tj;
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  json added = json::array();
  for (auto& [content, id] : specials)
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  tj["added_tokens"] = added;
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", serve::split_pattern_regex(serve::SplitPattern::qwen2)}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}};
  tj["post_processor"] = nullptr;
  tj["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  // The vocabulary is serialised by hand: ordered_json inserts in linear time per key.
  std::string vocab_text = "{";
  for (size_t i = 0; i < tr.tokens.size(); ++i) {
    vocab_text += (i ? ",\n      " : "\n      ") + json(tr.tokens[i]).dump() + ": " + std::to_string(i);
  }
  vocab_text += "\n    }";
  const std::string kVocabMark = "@@AFD_VOCAB@@";
  json merges = json::array();
  for (auto& [a, b] : tr.merges) merges.push_back(a + " " + b);
  tj["model"] = {{"type", "BPE"},      {"dropout", nullptr},        {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},  {"byte_fallback", false},    {"ignore_merges", false},
                 {"vocab", kVocabMark}, {"merges", merges}};

  json cfg;
  cfg["add_bos_token"] = false;
  cfg["add_prefix_space"] = false;
  json dec = json::object();
  for (auto& [content, id] : specials)
    dec[std::to_string(id)] = {{"content", content}, {"lstrip", false}, {"normalized", false},
                               {"rstrip", false},   {"single_word", false}, {"special", true}};
  cfg["added_tokens_decoder"] = dec;
  cfg["additional_special_tokens"] = json::array({"<|im_start|>", "<|im_end|>"});
  cfg["bos_token"] = nullptr;
  cfg["chat_template"] = kChatTemplate;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = "<|im_end|>";
  cfg["errors"] = "replace";
  cfg["model_max_length"] = 131072;
  cfg["pad_token"] = "<|endoftext|>";
  cfg["split_special_tokens"] = false;
  cfg["tokenizer_class"] = "Qwen2Tokenizer";
  cfg["unk_token"] = nullptr;

  std::string text = tj.dump(2);
  size_t mark = text.find("\"" + kVocabMark + "\"");
  if (mark == std::string::npos) return internal_error("tokenizer writer: vocabulary placeholder missing");
  text.replace(mark, kVocabMark.size() + 2, vocab_text);
  AFD_RETURN_IF_ERROR(write_file(dir + "/tokenizer.json", text + "\n"));
  AFD_RETURN_IF_ERROR(write_file(dir + "/tokenizer_config.json", cfg.dump(2) + "\n"));
  return info;
}

Status write_tokenizer_for_model(const ModelConfig& config, const std::string& dir) {
  auto r = write_tokenizer_files(dir, config.vocab_size);
  return r.ok() ? Status() : r.status();
}

Status copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir, int64_t vocab_size) {
  namespace fs = std::filesystem;
  AFD_ASSIGN_OR_RETURN(auto tok, serve::Tokenizer::load_dir(from_dir));
  if (tok->vocab_size() > vocab_size)
    return invalid_argument(from_dir + "/tokenizer.json: " + std::to_string(tok->vocab_size()) +
                            " tokens, more than the model's vocab_size " + std::to_string(vocab_size));
  std::error_code ec;
  if (fs::equivalent(from_dir, to_dir, ec)) return Status();
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const fs::path from = fs::path(from_dir) / name;
    if (!fs::exists(from, ec)) continue;  // tokenizer.json exists: load_dir read it
    fs::copy_file(from, fs::path(to_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error(from.string() + ": cannot copy to " + to_dir + ": " + ec.message());
  }
  return Status();
}

}  // namespace afd
