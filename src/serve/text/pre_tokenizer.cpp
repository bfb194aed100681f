#include "serve/text/pre_tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace afd::serve {
namespace {

using json = nlohmann::json;

const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
const char* kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
// Rust's char::is_numeric (Digits) is general category N.
const char* kNumeric = "\\p{N}";

struct Piece {
  size_t begin, end;
  bool is_match;
};

std::string str_field(const json& node, const char* key) {
  auto it = node.find(key);
  return it != node.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool bool_field(const json& node, const char* key, bool def) {
  auto it = node.find(key);
  return it != node.end() && it->is_boolean() ? it->get<bool>() : def;
}

}  // namespace

const char* split_pattern_regex(SplitPattern p) {
  switch (p) {
    case SplitPattern::gpt2: return kGpt2;
    case SplitPattern::qwen2: return kQwen2;
    case SplitPattern::llama3: return kLlama3;
  }
  return kQwen2;
}

Result<SplitBehavior> split_behavior_from_name(std::string_view name) {
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  return not_supported("split behavior '" + std::string(name) +
                       "' is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
}

Status split_pieces(std::string_view text, const Regex& re, SplitBehavior behavior, bool invert,
                    std::vector<std::string_view>* out) {
  if (text.empty()) return Status();
  thread_local std::vector<Regex::Span> spans;
  thread_local std::vector<Piece> parts, merged;
  spans.clear();
  AFD_RETURN_IF_ERROR(re.find_all(text, &spans));
  // The whole text as alternating gaps (is_match=false) and matches, in order.
  parts.clear();
  size_t prev = 0;
  for (const auto& [s, e] : spans) {
    if (prev != s) parts.push_back({prev, s, invert});
    parts.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != text.size()) parts.push_back({prev, text.size(), invert});

  const std::vector<Piece>* result = &parts;
  merged.clear();
  switch (behavior) {
    case SplitBehavior::isolated:
      break;
    case SplitBehavior::removed:
      for (const Piece& p : parts)
        if (!p.is_match) merged.push_back(p);
      result = &merged;
      break;
    case SplitBehavior::contiguous: {
      bool previous = false;
      for (const Piece& p : parts) {
        if (p.is_match == previous && !merged.empty()) merged.back().end = p.end;
        else merged.push_back(p);
        previous = p.is_match;
      }
      result = &merged;
      break;
    }
    case SplitBehavior::merged_with_previous: {
      bool previous = false;
      for (const Piece& p : parts) {
        if (p.is_match && !previous && !merged.empty()) merged.back().end = p.end;
        else merged.push_back(p);
        previous = p.is_match;
      }
      result = &merged;
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool next = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !next && !merged.empty()) merged.back().begin = it->begin;
        else merged.push_back(*it);
        next = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      result = &merged;
      break;
    }
  }
  for (const Piece& p : *result)
    if (p.end > p.begin) out->push_back(text.substr(p.begin, p.end - p.begin));
  return Status();
}

Result<PreTokenizer> PreTokenizer::from_json(const json& node, const std::string& where) {
  PreTokenizer p;
  if (!node.is_null()) AFD_RETURN_IF_ERROR(p.add_steps(node, where));
  return p;
}

Status PreTokenizer::add_steps(const json& node, const std::string& where) {
  if (!node.is_object()) return corrupt_data(where + ": a pre-tokenizer must be a JSON object");
  const std::string type = str_field(node, "type");
  if (type == "Sequence") {
    auto it = node.find("pretokenizers");
    if (it == node.end() || !it->is_array()) return corrupt_data(where + ": Sequence without a 'pretokenizers' array");
    for (size_t i = 0; i < it->size(); ++i)
      AFD_RETURN_IF_ERROR(add_steps((*it)[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
    return Status();
  }
  Step s;
  if (type == "Split") {
    auto pat = node.find("pattern");
    if (pat == node.end() || !pat->is_object())
      return corrupt_data(where + ": Split without a 'pattern' object");
    bool literal = pat->contains("String");
    auto src = pat->find(literal ? "String" : "Regex");
    if (src == pat->end() || !src->is_string())
      return corrupt_data(where + ": Split pattern must be {\"Regex\": string} or {\"String\": string}");
    auto re = Regex::compile(src->get<std::string>(), literal);
    if (!re.ok()) return re.status().with_context(where + ": Split");
    s.re = *re;
    std::string behavior = node.contains("behavior") ? str_field(node, "behavior") : "Isolated";
    auto b = split_behavior_from_name(behavior);
    if (!b.ok()) return b.status().with_context(where + ": Split");
    s.behavior = *b;
    s.invert = bool_field(node, "invert", false);
  } else if (type == "Digits") {
    AFD_ASSIGN_OR_RETURN(s.re, Regex::compile(kNumeric));
    s.behavior = bool_field(node, "individual_digits", false) ? SplitBehavior::isolated : SplitBehavior::contiguous;
  } else if (type == "ByteLevel") {
    s.add_prefix_space = bool_field(node, "add_prefix_space", false);
    if (bool_field(node, "use_regex", true)) {
      AFD_ASSIGN_OR_RETURN(s.re, Regex::compile(kGpt2));
    }
  } else {
    return not_supported(where + ": pre-tokenizer type '" + type +
                         "' is not supported (afd supports Split, Digits, ByteLevel and Sequence)");
  }
  steps_.push_back(std::move(s));
  return Status();
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces,
                           std::deque<std::string>* arena) const {
  pieces->clear();
  if (text.empty()) return Status();
  pieces->push_back(text);
  std::vector<std::string_view> next;
  for (const Step& s : steps_) {
    next.clear();
    for (std::string_view p : *pieces) {
      if (s.add_prefix_space && p.front() != ' ') {
        std::string& spaced = arena->emplace_back();
        spaced.reserve(p.size() + 1);
        spaced.push_back(' ');
        spaced.append(p);
        p = spaced;
      }
      if (s.re) AFD_RETURN_IF_ERROR(split_pieces(p, *s.re, s.behavior, s.invert, &next));
      else next.push_back(p);
    }
    pieces->swap(next);
  }
  return Status();
}

}  // namespace afd::serve
