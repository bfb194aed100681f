// Normalizer of a Hugging Face tokenizer.json: text rewriting applied before
// pre-tokenization (to the text between added tokens). Supported, with HF semantics:
// NFC, NFD, NFKC, NFKD (Unicode normalization by utf8proc), Replace (String or Regex
// pattern -> content), Prepend, and Sequence of these; an empty Sequence is the identity.
// Anything else is refused at load with the component's name. Immutable; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "serve/text/tokenizer_regex.h"

namespace afd::serve {

class Normalizer {
 public:
  // node: tokenizer.json's "normalizer" (null or absent: identity). Errors name `where`.
  static Result<Normalizer> from_json(const nlohmann::json& node, const std::string& where);

  bool identity() const { return steps_.empty(); }
  // The normalized text. text must be valid UTF-8. Errors: a Replace regex ran past its
  // match limit.
  Result<std::string> apply(std::string_view text) const;

 private:
  enum class Kind { nfc, nfd, nfkc, nfkd, replace, prepend };
  struct Step {
    Kind kind;
    std::shared_ptr<const Regex> re;  // Replace
    std::string content;              // Replace: replacement; Prepend: prefix
  };
  Status add_steps(const nlohmann::json& node, const std::string& where);

  std::vector<Step> steps_;
};

}  // namespace afd::serve
