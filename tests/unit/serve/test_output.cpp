#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/output.h"
#include "serve/tokenizer.h"
#include "serve/unicode.h"

namespace afd::serve {
namespace {

// Bytes-only tokenizer: token id == byte value; 256 = <|im_end|>.
std::shared_ptr<const Tokenizer> bytes_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                      {"added_tokens", nlohmann::json::array({{{"id", 256}, {"content", "<|im_end|>"}, {"special", true}}})},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}}};
  return *Tokenizer::from_json(j.dump());
}

std::string run(OutputProcessor& p, const std::string& bytes, FinishReason* fr, int* n_pushed = nullptr) {
  std::string out;
  int n = 0;
  for (unsigned char c : bytes) {
    auto st = p.push(c);
    ++n;
    out += st.text;
    if (st.finish != FinishReason::none) {
      *fr = st.finish;
      break;
    }
  }
  if (n_pushed) *n_pushed = n;
  return out;
}

TEST(OutputProcessor, StopStringCutsAndHoldsBack) {
  auto tok = bytes_tokenizer();
  OutputProcessor p(tok.get(), {256}, {"END", "\n\n"}, 100, false);
  FinishReason fr = FinishReason::none;
  int n = 0;
  // "EN" must be held back until it is clear it is not "END".
  std::string out;
  for (char c : std::string("abEN")) out += p.push(static_cast<unsigned char>(c)).text;
  EXPECT_EQ(out, "ab");
  out += run(p, "xyEND more", &fr, &n);
  EXPECT_EQ(out, "abENxy");
  EXPECT_EQ(fr, FinishReason::stop);
  EXPECT_EQ(p.n_generated(), 4 + 5);
  EXPECT_TRUE(p.finished());
}

TEST(OutputProcessor, EosAndLength) {
  auto tok = bytes_tokenizer();
  OutputProcessor eos(tok.get(), {256}, {}, 100, false);
  FinishReason fr = FinishReason::none;
  EXPECT_EQ(run(eos, "hi", &fr), "hi");
  auto st = eos.push(256);
  EXPECT_EQ(st.finish, FinishReason::stop);
  EXPECT_EQ(eos.n_generated(), 3);

  OutputProcessor len(tok.get(), {256}, {}, 3, false);
  fr = FinishReason::none;
  EXPECT_EQ(run(len, "abcdef", &fr), "abc");
  EXPECT_EQ(fr, FinishReason::length);

  OutputProcessor ign(tok.get(), {256}, {}, 2, true);
  EXPECT_EQ(ign.push(256).finish, FinishReason::none);  // ignore_eos: special token decodes to nothing
  EXPECT_EQ(ign.push('a').finish, FinishReason::length);
}

TEST(OutputProcessor, Utf8NeverSplitAcrossDeltas) {
  auto tok = bytes_tokenizer();
  OutputProcessor p(tok.get(), {}, {"🎉"}, 100, false);
  FinishReason fr = FinishReason::none;
  std::string text = "é👋 ok 🎉 rest";
  std::string out;
  for (unsigned char c : text) {
    auto st = p.push(c);
    EXPECT_EQ(utf8_sanitize(st.text), st.text);
    EXPECT_EQ(utf8_complete_prefix(st.text), st.text.size());
    out += st.text;
    if (st.finish != FinishReason::none) {
      fr = st.finish;
      break;
    }
  }
  EXPECT_EQ(out, "é👋 ok ");
  EXPECT_EQ(fr, FinishReason::stop);
}

}  // namespace
}  // namespace afd::serve
