#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../bytes_tokenizer.h"
#include "serve/api/output.h"
#include "serve/text/tokenizer.h"
#include "serve/text/unicode.h"

namespace afd::serve::test_output {
namespace {

using testing::bytes_tokenizer;

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

// Failover continuation: a processor that replays the first k tokens (whose text the client
// already has) releases, from token k+1 on, exactly the deltas of the original, for every k:
// in the middle of a multi-byte character, of a held-back stop-string prefix, anywhere.
TEST(OutputProcessor, ReplayContinuesTheDeltasExactly) {
  auto tok = bytes_tokenizer();
  const std::string text = "é👋 EN ENxyz \xf0\x9f\x8e STOP tail";
  const std::vector<std::string> stops = {"END", "STOP"};
  OutputProcessor original(tok.get(), {256}, stops, 100, false);
  std::vector<std::string> deltas;
  std::vector<int32_t> ids;
  FinishReason fr = FinishReason::none;
  for (unsigned char c : text) {
    ids.push_back(c);
    auto st = original.push(c);
    deltas.push_back(st.text);
    if ((fr = st.finish) != FinishReason::none) break;
  }
  ASSERT_EQ(fr, FinishReason::stop);
  for (size_t k = 0; k < ids.size(); ++k) {
    OutputProcessor resumed(tok.get(), {256}, stops, 100, false);
    ASSERT_TRUE(resumed.replay(std::span<const int32_t>(ids.data(), k)).is_ok()) << k;
    EXPECT_EQ(resumed.n_generated(), static_cast<int64_t>(k));
    for (size_t i = k; i < ids.size(); ++i) {
      auto st = resumed.push(ids[i]);
      EXPECT_EQ(st.text, deltas[i]) << "cut after " << k << " tokens, token " << i;
      EXPECT_EQ(st.finish, i + 1 == ids.size() ? FinishReason::stop : FinishReason::none) << k << " " << i;
    }
    EXPECT_EQ(resumed.n_generated(), original.n_generated());
  }
  // A replay that reaches the end of the output (here the stop string) is refused: the
  // request was complete, there is nothing to continue.
  OutputProcessor done(tok.get(), {256}, stops, 100, false);
  Status st = done.replay(ids);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("token " + std::to_string(ids.size()) + " of"), std::string::npos) << st.message();
  OutputProcessor capped(tok.get(), {256}, {}, 3, false);
  EXPECT_TRUE(capped.replay(std::vector<int32_t>{'a', 'b'}).is_ok());
  EXPECT_EQ(capped.push('c').finish, FinishReason::length);
  OutputProcessor over(tok.get(), {256}, {}, 3, false);
  EXPECT_FALSE(over.replay(std::vector<int32_t>{'a', 'b', 'c'}).is_ok());
}

}  // namespace
}  // namespace afd::serve::test_output
