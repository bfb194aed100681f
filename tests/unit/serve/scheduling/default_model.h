// The trained default model (assets/models/wordnet-dsv3), loaded once per test binary: its
// weights and tokenizer, for scheduler tests that need a model that speaks.
#pragma once

#include <memory>

#include <gtest/gtest.h>

#include "model/weights.h"
#include "serve/text/tokenizer.h"

namespace afd::serve::testing {

inline const char* kDefaultModel = AFD_SOURCE_DIR "/assets/models/wordnet-dsv3";

inline std::shared_ptr<const ModelWeights> default_weights() {
  static auto w = [] {
    auto r = load_model(kDefaultModel);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : nullptr;
  }();
  return w;
}

inline std::shared_ptr<const Tokenizer> default_tokenizer() {
  static auto t = [] {
    auto r = Tokenizer::load_dir(kDefaultModel);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : nullptr;
  }();
  return t;
}

}  // namespace afd::serve::testing
