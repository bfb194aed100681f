#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serve/text/pre_tokenizer.h"
#include "serve/text/tokenizer.h"
#include "serve/text/tokenizer_writer.h"
#include "serve/text/unicode.h"

namespace afd::serve::test_tokenizer {
namespace {

using json = nlohmann::json;

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("afd_serve_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

// Byte-level tokenizer.json with the 256 byte tokens, then `merges` (each "a b", a+b added).
std::string tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                           const std::string& regex = split_pattern_regex(SplitPattern::qwen2)) {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = id++;
  json m = json::array();
  for (auto& [a, b] : merges) {
    std::string A = bytes_to_byte_level(a), B = bytes_to_byte_level(b);
    m.push_back(A + " " + B);
    if (!vocab.contains(A + B)) vocab[A + B] = id++;
  }
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
            {"added_tokens", json::array({{{"id", id}, {"content", "<|im_end|>"}, {"special", true}}})},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}},
                                             {{"type", "ByteLevel"}, {"use_regex", false}}})}}}};
  return j.dump();
}

TEST(Unicode, ByteMappingRoundTripsAllBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string mapped = bytes_to_byte_level(all);
  EXPECT_EQ(byte_level_to_bytes(mapped), all);
  // GPT-2's mapping: printable ASCII maps to itself, space to U+0120 ('Ġ').
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');
}

TEST(Unicode, CompletePrefixHoldsSplitSequences) {
  std::string wave = "\xF0\x9F\x91\x8B";  // U+1F44B
  EXPECT_EQ(utf8_complete_prefix("ab" + wave.substr(0, 1)), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab" + wave.substr(0, 3)), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab" + wave), 6u);
  EXPECT_EQ(utf8_sanitize("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_sanitize("\xC3"), "\xEF\xBF\xBD");
  EXPECT_TRUE(is_whitespace(U'\u3000'));
  EXPECT_TRUE(is_whitespace(U'\u0085'));
  EXPECT_FALSE(is_whitespace(U'\u180E'));
  EXPECT_FALSE(is_whitespace(U'x'));
  EXPECT_EQ(utf8_invalid_offset("h\xC3\xA9llo"), std::string_view::npos);
  EXPECT_EQ(utf8_invalid_offset("ab\xC3"), 2u);
  EXPECT_EQ(utf8_invalid_offset("a\xED\xA0\x80"), 1u);  // a surrogate
  EXPECT_EQ(utf8_invalid_offset("\xC0\xAF"), 0u);        // overlong '/'
}

TEST(PreTokenizer, MatchesRealRegexGolden) {
  json g = json::parse(read_file(std::string(AFD_SOURCE_DIR) + "/tests/unit/serve/data/pretokenizer_golden.json"));
  const std::pair<const char*, SplitPattern> pats[] = {
      {"gpt2", SplitPattern::gpt2}, {"qwen2", SplitPattern::qwen2}, {"llama3", SplitPattern::llama3}};
  std::map<std::string, std::shared_ptr<const Regex>> res;
  for (auto& [name, p] : pats) EXPECT_EQ(g["patterns"][name].get<std::string>(), split_pattern_regex(p)) << name;
  for (auto& [name, pattern] : g["patterns"].items()) {
    auto re = Regex::compile(pattern.get<std::string>());
    ASSERT_TRUE(re.ok()) << name << ": " << re.status().to_string();
    res[name] = *re;
  }
  int n = 0;
  for (const json& c : g["cases"]) {
    std::string text = c["text"];
    for (auto& [name, re] : res) {
      std::vector<std::string> want = c[name];
      std::vector<std::string_view> views;
      ASSERT_TRUE(split_pieces(text, *re, SplitBehavior::isolated, false, &views).is_ok());
      std::vector<std::string> got(views.begin(), views.end());
      EXPECT_EQ(got, want) << name << " on: " << text;
      ++n;
    }
  }
  EXPECT_GE(n, 60);
}

TEST(Tokenizer, MergesApplyByRank) {
  // "a b" (rank 0), "ab c" (rank 1), "b c" (rank 2): "abc" -> [abc]; "bc" -> [bc].
  auto t = Tokenizer::from_json(tokenizer_json({{"a", "b"}, {"ab", "c"}, {"b", "c"}}));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Tokenizer& tok = **t;
  int32_t ab = tok.token_id("ab"), abc = tok.token_id("abc"), bc = tok.token_id("bc");
  ASSERT_GE(ab, 256);
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{abc}));
  EXPECT_EQ(tok.encode("bc"), (std::vector<int32_t>{bc}));
  EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{ab, ab}));
  // "xabc": x stays a byte token.
  EXPECT_EQ(tok.encode("xabc"), (std::vector<int32_t>{'x', abc}));
  // Special tokens are matched before BPE and decode to their content unless skipped.
  int32_t im_end = tok.token_id("<|im_end|>");
  EXPECT_TRUE(tok.is_special(im_end));
  std::vector<int32_t> ids = tok.encode("ab<|im_end|>c");
  EXPECT_EQ(ids, (std::vector<int32_t>{ab, im_end, 'c'}));
  EXPECT_EQ(tok.decode(ids, false), "ab<|im_end|>c");
  EXPECT_EQ(tok.decode(ids, true), "abc");
}

TEST(Tokenizer, RejectsBrokenFiles) {
  EXPECT_FALSE(Tokenizer::from_json("{not json").ok());
  EXPECT_FALSE(Tokenizer::from_json("{}").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model":{"type":"WordPiece","vocab":{}}})").ok());
  // A merge naming tokens the vocabulary lacks.
  json j = json::parse(tokenizer_json({}));
  j["model"]["merges"].push_back("zz qq");
  auto r = Tokenizer::from_json(j.dump(), "x/tokenizer.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x/tokenizer.json"), std::string::npos);
  // Missing byte tokens.
  json k = json::parse(tokenizer_json({}));
  k["model"]["vocab"].erase("A");
  EXPECT_FALSE(Tokenizer::from_json(k.dump()).ok());
  EXPECT_FALSE(Tokenizer::from_json(tokenizer_json({}, "[a-z")).ok());  // does not compile
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json").ok());
}

TEST(Tokenizer, StreamDecoderNeverSplitsUtf8) {
  auto t = Tokenizer::from_json(tokenizer_json({}));  // bytes only: one token per byte
  ASSERT_TRUE(t.ok());
  const std::string text = "héllo 👋🏽 你好 ok";
  std::vector<int32_t> ids = (*t)->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  StreamDecoder d(t->get());
  std::string all;
  for (int32_t id : ids) {
    std::string chunk = d.add(id);
    EXPECT_EQ(utf8_sanitize(chunk), chunk) << "chunk is not valid UTF-8";
    EXPECT_EQ(utf8_complete_prefix(chunk), chunk.size());
    all += chunk;
  }
  all += d.flush();
  EXPECT_EQ(all, text);
  // A truncated sequence at the end is flushed as U+FFFD.
  StreamDecoder d2(t->get());
  EXPECT_EQ(d2.add(0xE4), "");
  EXPECT_EQ(d2.flush(), "\xEF\xBF\xBD");
}

TEST(TokenizerWriter, WritesLoadableDeterministicTokenizer) {
  std::string d1 = temp_dir("w1"), d2 = temp_dir("w2");
  auto info = write_tokenizer_files(d1, 2048);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_TRUE(write_tokenizer_files(d2, 2048).ok());
  EXPECT_EQ(read_file(d1 + "/tokenizer.json"), read_file(d2 + "/tokenizer.json"));
  EXPECT_EQ(info->im_end_id, 2047);
  EXPECT_EQ(info->im_start_id, 2046);
  EXPECT_EQ(info->endoftext_id, 2045);
  auto t = Tokenizer::load(d1 + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.vocab_size(), 2048);
  EXPECT_EQ(tok.token_id("<|im_end|>"), 2047);
  for (const char* s : {"The engine reads the model.", "héllo 👋 你好\n\n  x", "def main():\n    return 0\n"}) {
    std::vector<int32_t> ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
    for (int32_t id : ids) EXPECT_LT(id, 2045);
  }
  // Merges learned from the corpus compress common English.
  EXPECT_LT(tok.encode("the engine reads the model").size(), 15u);
  std::vector<int32_t> chat = tok.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(chat.front(), 2046);
  EXPECT_EQ(chat.back(), 2047);
  EXPECT_FALSE(write_tokenizer_files(d1, 100).ok());
  ModelConfig cfg;
  cfg.vocab_size = 2048;
  EXPECT_TRUE(write_tokenizer_for_model(cfg, d2).is_ok());
  EXPECT_EQ(read_file(d1 + "/tokenizer.json"), read_file(d2 + "/tokenizer.json"));
  cfg.vocab_size = 10;
  EXPECT_FALSE(write_tokenizer_for_model(cfg, d2).is_ok());
  // A Qwen-sized vocabulary is filled too.
  std::string d3 = temp_dir("w3");
  auto big = write_tokenizer_files(d3, 151936);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  auto tb = Tokenizer::load(d3 + "/tokenizer.json");
  ASSERT_TRUE(tb.ok()) << tb.status().to_string();
  EXPECT_EQ((*tb)->vocab_size(), 151936);
  std::filesystem::remove_all(d1);
  std::filesystem::remove_all(d2);
  std::filesystem::remove_all(d3);
}

}  // namespace
}  // namespace afd::serve::test_tokenizer
