#include "serve/text/tokenizer_normalizer.h"

#include <cstdlib>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

namespace afd::serve {
namespace {

using json = nlohmann::json;

bool is_ascii(char c) { return static_cast<unsigned char>(c) < 0x80; }

// Unicode normalization form of s through utf8proc (NFC: COMPOSE; NFD: DECOMPOSE;
// K forms add COMPAT). Only the stretches with non-ASCII characters go through utf8proc:
// ASCII characters are invariant under all four forms and are starters that nothing
// composes onto, so each stretch runs from the ASCII character before a non-ASCII run
// (a base that a following combining mark may compose with) to the next ASCII character.
Result<std::string> unicode_normalize(std::string_view s, utf8proc_option_t form) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (is_ascii(s[i])) {
      out.push_back(s[i++]);
      continue;
    }
    size_t begin = i, end = i;
    while (end < s.size() && !is_ascii(s[end])) ++end;
    if (begin > 0 && is_ascii(s[begin - 1])) {
      --begin;
      out.pop_back();
    }
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + begin),
                                      static_cast<utf8proc_ssize_t>(end - begin), &dst,
                                      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | form));
    if (n < 0) return invalid_argument(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
    out.append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
    i = end;
  }
  return out;
}

}  // namespace

Result<Normalizer> Normalizer::from_json(const json& node, const std::string& where) {
  Normalizer n;
  if (!node.is_null()) AFD_RETURN_IF_ERROR(n.add_steps(node, where));
  return n;
}

Status Normalizer::add_steps(const json& node, const std::string& where) {
  if (!node.is_object()) return corrupt_data(where + ": a normalizer must be a JSON object");
  const std::string type = node.contains("type") && node["type"].is_string() ? node["type"].get<std::string>() : "";
  if (type == "Sequence") {
    auto it = node.find("normalizers");
    if (it == node.end() || !it->is_array()) return corrupt_data(where + ": Sequence without a 'normalizers' array");
    for (size_t i = 0; i < it->size(); ++i)
      AFD_RETURN_IF_ERROR(add_steps((*it)[i], where + ".normalizers[" + std::to_string(i) + "]"));
    return Status();
  }
  if (type == "NFC") { steps_.push_back({Kind::nfc, nullptr, {}}); return Status(); }
  if (type == "NFD") { steps_.push_back({Kind::nfd, nullptr, {}}); return Status(); }
  if (type == "NFKC") { steps_.push_back({Kind::nfkc, nullptr, {}}); return Status(); }
  if (type == "NFKD") { steps_.push_back({Kind::nfkd, nullptr, {}}); return Status(); }
  if (type == "Prepend") {
    if (!node.contains("prepend") || !node["prepend"].is_string())
      return corrupt_data(where + ": Prepend without a 'prepend' string");
    steps_.push_back({Kind::prepend, nullptr, node["prepend"].get<std::string>()});
    return Status();
  }
  if (type == "Replace") {
    auto pat = node.find("pattern");
    if (pat == node.end() || !pat->is_object() || !node.contains("content") || !node["content"].is_string())
      return corrupt_data(where + ": Replace needs a 'pattern' object and a 'content' string");
    bool literal = pat->contains("String");
    auto src = pat->find(literal ? "String" : "Regex");
    if (src == pat->end() || !src->is_string())
      return corrupt_data(where + ": Replace pattern must be {\"Regex\": string} or {\"String\": string}");
    auto re = Regex::compile(src->get<std::string>(), literal);
    if (!re.ok()) return re.status().with_context(where + ": Replace");
    steps_.push_back({Kind::replace, *re, node["content"].get<std::string>()});
    return Status();
  }
  return not_supported(where + ": normalizer type '" + type +
                       "' is not supported (afd supports NFC, NFD, NFKC, NFKD, Replace, Prepend and Sequence)");
}

Result<std::string> Normalizer::apply(std::string_view text) const {
  std::string cur(text);
  std::vector<Regex::Span> spans;
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::nfc:
      case Kind::nfd:
      case Kind::nfkc:
      case Kind::nfkd: {
        int form = s.kind == Kind::nfc || s.kind == Kind::nfkc ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (s.kind == Kind::nfkc || s.kind == Kind::nfkd) form |= UTF8PROC_COMPAT;
        AFD_ASSIGN_OR_RETURN(cur, unicode_normalize(cur, static_cast<utf8proc_option_t>(form)));
        break;
      }
      case Kind::prepend:
        if (!cur.empty()) cur.insert(0, s.content);
        break;
      case Kind::replace: {
        spans.clear();
        AFD_RETURN_IF_ERROR(s.re->find_all(cur, &spans));
        if (spans.empty()) break;
        std::string out;
        size_t prev = 0;
        for (const auto& [b, e] : spans) {
          out.append(cur, prev, b - prev);
          out += s.content;
          prev = e;
        }
        out.append(cur, prev, std::string::npos);
        cur = std::move(out);
        break;
      }
    }
  }
  return cur;
}

}  // namespace afd::serve
