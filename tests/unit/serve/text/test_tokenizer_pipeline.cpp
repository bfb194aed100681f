// The tokenizer.json components afd implements with Hugging Face semantics: PCRE2 regexes
// with Oniguruma's escapes and bounded matching, Split behaviors, Digits, ByteLevel,
// normalizers, added-token flags, post-processors and tokenizer_config.json's
// add_bos_token. Expected values follow the HF tokenizers sources and docs cited per test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "serve/text/pre_tokenizer.h"
#include "serve/text/tokenizer.h"
#include "serve/text/tokenizer_normalizer.h"
#include "serve/text/tokenizer_regex.h"
#include "serve/text/unicode.h"

namespace afd::serve::test_tokenizer_pipeline {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

std::vector<Regex::Span> spans(const Regex& re, std::string_view text) {
  std::vector<Regex::Span> out;
  Status s = re.find_all(text, &out);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

std::shared_ptr<const Regex> compile(std::string_view pattern, bool literal = false) {
  auto re = Regex::compile(pattern, literal);
  EXPECT_TRUE(re.ok()) << pattern << ": " << re.status().to_string();
  return re.ok() ? *re : nullptr;
}

std::vector<std::string> split(std::string_view text, std::string_view pattern, SplitBehavior b, bool invert = false,
                               bool literal = false) {
  auto re = compile(pattern, literal);
  std::vector<std::string_view> v;
  EXPECT_TRUE(split_pieces(text, *re, b, invert, &v).is_ok());
  return {v.begin(), v.end()};
}

std::vector<std::string> pre_tokenize(const json& node, std::string_view text) {
  auto p = PreTokenizer::from_json(node, "pre");
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  std::vector<std::string_view> v;
  std::deque<std::string> arena;
  EXPECT_TRUE(p->split(text, &v, &arena).is_ok());
  return {v.begin(), v.end()};
}

std::string normalize(const json& node, std::string_view text) {
  auto n = Normalizer::from_json(node, "norm");
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  auto r = n->apply(text);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : "";
}

// Bytes-only byte-level tokenizer.json (byte b has id b), plus `added` tokens from id 256
// on and the given extra top-level fields.
json byte_tokenizer(const json& added = json::array(), const json& extra = json::object()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
            {"added_tokens", added},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

json added(int id, const std::string& content, json flags = json::object()) {
  json a = {{"id", id}, {"content", content}, {"special", false}, {"single_word", false}, {"lstrip", false},
            {"rstrip", false}, {"normalized", false}};
  for (auto& [k, v] : flags.items()) a[k] = v;
  return a;
}

std::shared_ptr<const Tokenizer> make(const json& j, const std::string& config = "") {
  auto t = Tokenizer::from_json(j.dump(), "t.json", config, "t_config.json");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : nullptr;
}

Ids bytes(std::string_view s) {
  Ids out;
  for (char c : s) out.push_back(static_cast<uint8_t>(c));
  return out;
}

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Ids enc(const Tokenizer& t, std::string_view s, bool parse_special = true) {
  auto r = t.encode(s, parse_special);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : Ids{};
}

TEST(TokenizerRegex, OnigurumaEscapes) {
  // \s is Unicode White_Space as in Oniguruma: U+0085 is space, U+180E is not (PCRE2's
  // own \s takes both).
  auto s = compile("\\s");
  EXPECT_EQ(spans(*s, "a\u0085b\u180Ec").size(), 1u);
  auto not_s = compile("[^\\s]+");
  EXPECT_EQ(spans(*not_s, "a\u180Eb").size(), 1u);
  // \w includes marks (Oniguruma: Letter | Mark | Number | Connector_Punctuation).
  auto w = compile("\\w+");
  EXPECT_EQ(spans(*w, "e\u0301x\u203Fy"), (std::vector<Regex::Span>{{0, 8}}));
  // \h is a hex digit in Oniguruma.
  EXPECT_EQ(spans(*compile("\\h+"), "xx 0fA9 yy"), (std::vector<Regex::Span>{{3, 7}}));
  // ^ and $ are line anchors.
  EXPECT_EQ(spans(*compile("^x"), "x\nx").size(), 2u);
  EXPECT_EQ(onig_to_pcre2("[^\\s\\p{L}]").value(),
            "[^\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
            "\\x{3000}\\p{L}]");
  EXPECT_EQ(onig_to_pcre2("\\Q[\\s]\\E\\d").value(), "\\Q[\\s]\\E\\d");
  // What PCRE2 would read differently is refused, as are patterns that do not compile.
  for (const char* bad : {"[a-z&&[^aeiou]]", "[[:alpha:][a]]", "[\\W]", "(", "[a-"}) {
    auto r = Regex::compile(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  auto r = Regex::compile("[a-z&&[^aeiou]]");
  EXPECT_NE(r.status().message().find("&&"), std::string::npos) << r.status().message();
  // A String pattern is literal.
  EXPECT_EQ(spans(*compile("a.b", true), "axb a.b").size(), 1u);
  EXPECT_FALSE(Regex::compile("", true).ok());
}

TEST(TokenizerRegex, EmptyMatchesAdvanceLikeOniguruma) {
  // onig/Rust find_iter: an empty match right after the previous match is skipped.
  EXPECT_EQ(spans(*compile("a*"), "baa"), (std::vector<Regex::Span>{{0, 0}, {1, 3}}));
  EXPECT_EQ(spans(*compile("(?=b)"), "abab"), (std::vector<Regex::Span>{{1, 1}, {3, 3}}));
  // An empty match still cuts the text (HF find_matches yields it as a match).
  EXPECT_EQ(split("abab", "(?=b)", SplitBehavior::isolated), (std::vector<std::string>{"a", "ba", "b"}));
  // Lookbehind sees the text before the start position.
  EXPECT_EQ(spans(*compile("(?<=a)b"), "abcb"), (std::vector<Regex::Span>{{1, 2}}));
}

TEST(TokenizerRegex, CatastrophicPatternErrorsInsteadOfHanging) {
  auto re = compile("(a+)+$");
  std::vector<Regex::Span> out;
  Status s = re->find_all(std::string(40, 'a') + "b", &out);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::out_of_range);
  // The same through a tokenizer: encode reports it.
  json j = byte_tokenizer(json::array(),
                          {{"pre_tokenizer",
                            {{"type", "Sequence"},
                             {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}},
                                                             {"behavior", "Isolated"}},
                                                            {{"type", "ByteLevel"}, {"use_regex", false}}})}}}});
  auto t = make(j);
  ASSERT_TRUE(t);
  auto r = t->encode(std::string(60, 'a') + "b", true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::out_of_range);
  EXPECT_TRUE(t->encode(std::string_view("aab"), true).ok());
  // The real patterns stay within the limits on long runs of one class.
  for (SplitPattern p : {SplitPattern::gpt2, SplitPattern::qwen2, SplitPattern::llama3}) {
    auto q = compile(split_pattern_regex(p));
    for (std::string text : {std::string(1 << 20, ' '), std::string(1 << 20, 'a'), std::string(1 << 20, '7'),
                             std::string(1 << 19, '!') + std::string(1 << 19, '\n')}) {
      std::vector<Regex::Span> v;
      EXPECT_TRUE(q->find_all(text, &v).is_ok());
    }
  }
}

TEST(PreTokenizer, SplitBehaviorsAsHuggingFaceDocuments) {
  // The example of HF's SplitDelimiterBehavior documentation: "the-final--countdown" on "-".
  using V = std::vector<std::string>;
  const char* t = "the-final--countdown";
  EXPECT_EQ(split(t, "-", SplitBehavior::removed, false, true), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split(t, "-", SplitBehavior::isolated, false, true), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split(t, "-", SplitBehavior::merged_with_previous, false, true), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split(t, "-", SplitBehavior::merged_with_next, false, true), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split(t, "-", SplitBehavior::contiguous, false, true), (V{"the", "-", "final", "--", "countdown"}));
  // invert: the gaps play the part of the matches (GPT-4o's Removed + invert keeps the
  // matches only).
  EXPECT_EQ(split("ab, cd!", "\\p{L}+", SplitBehavior::removed, true), (V{"ab", "cd"}));
  EXPECT_EQ(split("ab, cd!", "\\p{L}+", SplitBehavior::merged_with_previous, true), (V{"ab, ", "cd!"}));
  EXPECT_EQ(split("ab, cd!", "\\p{L}+", SplitBehavior::merged_with_next, true), (V{"ab", ", cd", "!"}));
  for (const char* name : {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
    EXPECT_TRUE(split_behavior_from_name(name).ok()) << name;
  EXPECT_FALSE(split_behavior_from_name("Merged").ok());
}

TEST(PreTokenizer, DigitsByteLevelAndSequence) {
  using V = std::vector<std::string>;
  // HF's Digits docs: "Call 123 please".
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "Call 123 please"),
            (V{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "Call 123 please"),
            (V{"Call ", "123", " please"}));
  // ByteLevel: GPT-2 pattern; add_prefix_space prefixes every piece that lacks a space.
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}}, "Hello my friend, how?"),
            (V{" Hello", " my", " friend", ",", " how", "?"}));
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}}, "Hello there       dear"),
            (V{"Hello", " there", "      ", " dear"}));
  json seq = {{"type", "Sequence"},
              {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                             {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}})}};
  EXPECT_EQ(pre_tokenize(seq, "ab12"), (V{" ab", " 1", " 2"}));
  // Unsupported components are named.
  auto m = PreTokenizer::from_json({{"type", "Metaspace"}, {"replacement", "_"}}, "x.json: pre_tokenizer");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("Metaspace"), std::string::npos);
  EXPECT_NE(m.status().message().find("x.json"), std::string::npos);
  EXPECT_FALSE(PreTokenizer::from_json({{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}}, "p").ok());
}

TEST(Normalizer, UnicodeFormsReplacePrepend) {
  EXPECT_EQ(normalize({{"type", "NFC"}}, "cafe\u0301 xe\u0301"), "caf\u00e9 x\u00e9");
  EXPECT_EQ(normalize({{"type", "NFC"}}, "d\u0301 plain"), "d\u0301 plain");  // no precomposed form
  EXPECT_EQ(normalize({{"type", "NFD"}}, "caf\u00e9"), "cafe\u0301");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, "\ufb01 \u2460 \uff21"), "fi 1 A");
  EXPECT_EQ(normalize({{"type", "NFKD"}}, "\u00bd"), "1\u20442");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}, "a b c"),
            "a\u2581b\u2581c");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}, "a   b  c d"), "a b c d");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "\u2581"}}, "x"), "\u2581x");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "\u2581"}}, ""), "");
  json seq = {{"type", "Sequence"},
              {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", " "}},
                                           {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}})}};
  EXPECT_EQ(normalize(seq, "a b"), "_a_b");
  EXPECT_TRUE(Normalizer::from_json({{"type", "Sequence"}, {"normalizers", json::array()}}, "n")->identity());
  for (const char* type : {"Lowercase", "BertNormalizer", "Precompiled", "StripAccents"}) {
    auto n = Normalizer::from_json({{"type", type}}, "t.json: normalizer");
    ASSERT_FALSE(n.ok()) << type;
    EXPECT_NE(n.status().message().find(type), std::string::npos) << n.status().message();
  }
}

TEST(AddedTokens, FlagsFollowHuggingFace) {
  // Ids: 256 [WORD] single_word, 257 <L> lstrip, 258 <R> rstrip, 259 <s> special,
  // 260 <s>! (longer, leftmost-longest wins).
  auto t = make(byte_tokenizer(json::array({added(256, "[WORD]", {{"single_word", true}}),
                                            added(257, "<L>", {{"lstrip", true}}), added(258, "<R>", {{"rstrip", true}}),
                                            added(259, "<s>", {{"special", true}}), added(260, "<s>!")})));
  ASSERT_TRUE(t);
  // single_word: a match inside a word is dropped (and its span consumed).
  EXPECT_EQ(enc(*t, "a[WORD] [WORD]"), cat({bytes("a[WORD] "), {256}}));
  EXPECT_EQ(enc(*t, "[WORD]b"), bytes("[WORD]b"));
  EXPECT_EQ(enc(*t, "([WORD])"), cat({bytes("("), {256}, bytes(")")}));
  EXPECT_EQ(enc(*t, "e\u0301[WORD]"), bytes("e\u0301[WORD]"));  // a mark is a word character
  // lstrip / rstrip absorb the white space on that side.
  EXPECT_EQ(enc(*t, "x \t <L>y"), cat({bytes("x"), {257}, bytes("y")}));
  EXPECT_EQ(enc(*t, "x<R> \n z"), cat({bytes("x"), {258}, bytes("z")}));
  EXPECT_EQ(enc(*t, "<R>  <L>"), (Ids{258, 257}));
  // Leftmost-longest.
  EXPECT_EQ(enc(*t, "<s>!<s>"), (Ids{260, 259}));
  // parse_special=false: no added token is recognised.
  EXPECT_EQ(enc(*t, "<s>! [WORD]", false), bytes("<s>! [WORD]"));
  EXPECT_TRUE(t->is_special(259));
  EXPECT_FALSE(t->is_special(260));
  EXPECT_EQ(t->decode({259, 'a'}, true), "a");
  EXPECT_EQ(t->decode({259, 'a'}, false), "<s>a");
}

TEST(AddedTokens, NormalizedTokensMatchAfterNormalization) {
  // Normalizer Q -> ab. 256 "ab" normalized, 257 "Qz" not normalized (found in raw text),
  // 258 "Q!" normalized (its content is normalized too: "ab!").
  json norm = {{"type", "Replace"}, {"pattern", {{"String", "Q"}}}, {"content", "ab"}};
  auto t = make(byte_tokenizer(
      json::array({added(256, "ab", {{"normalized", true}}), added(257, "Qz"), added(258, "Q!", {{"normalized", true}})}),
      {{"normalizer", norm}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "Qz Q"), (Ids{257, ' ', 256}));
  EXPECT_EQ(enc(*t, "Q! ab!"), (Ids{258, ' ', 258}));
  EXPECT_EQ(enc(*t, "xQy"), cat({bytes("x"), {256}, bytes("y")}));
  EXPECT_EQ(enc(*t, "xQy", false), bytes("xaby"));
  // Missing 'normalized' defaults to !special, as HF's AddedToken.
  json plain = byte_tokenizer(json::array({{{"id", 256}, {"content", "ab"}, {"special", false}}}), {{"normalizer", norm}});
  EXPECT_EQ(enc(*make(plain), "Q"), (Ids{256}));
}

TEST(TokenizerPrompt, PostProcessorAndAddBosToken) {
  json added_toks = json::array({added(256, "<s>", {{"special", true}}), added(257, "</s>", {{"special", true}})});
  // Llama 3's shape: Sequence [ByteLevel, TemplateProcessing "<s> $A"].
  json tp = {{"type", "TemplateProcessing"},
             {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
             {"pair", json::array()},
             {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({256})}, {"tokens", json::array({"<s>"})}}}}}};
  json seq = {{"type", "Sequence"},
              {"processors", json::array({{{"type", "ByteLevel"}, {"add_prefix_space", false}}, tp})}};
  auto t = make(byte_tokenizer(added_toks, {{"post_processor", seq}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->prompt_prefix(), (Ids{256}));
  EXPECT_EQ(t->encode_prompt("hi").value(), (Ids{256, 'h', 'i'}));
  EXPECT_EQ(enc(*t, "hi"), bytes("hi"));  // encode() never adds them (chat templates write the BOS)
  EXPECT_EQ(t->bos_id(), -1);             // no tokenizer_config.json
  // tokenizer_config.json keys replace the template, as transformers does.
  auto off = make(byte_tokenizer(added_toks, {{"post_processor", seq}}), R"({"add_bos_token": false, "bos_token": "<s>"})");
  EXPECT_TRUE(off->prompt_prefix().empty());
  EXPECT_EQ(off->bos_id(), 256);
  EXPECT_FALSE(off->add_bos());
  auto both = make(byte_tokenizer(added_toks),
                   R"({"add_bos_token": true, "add_eos_token": true, "bos_token": {"__type": "AddedToken", "content": "<s>"},
                       "eos_token": "</s>"})");
  EXPECT_TRUE(both->add_bos());
  EXPECT_EQ(both->encode_prompt("a").value(), (Ids{256, 'a', 257}));
  // No add_* key: the tokenizer.json post-processor stays.
  auto keep = make(byte_tokenizer(added_toks, {{"post_processor", seq}}), R"({"bos_token": "<s>"})");
  EXPECT_TRUE(keep->add_bos());
  // RobertaProcessing: <cls> $A <sep>.
  auto rob = make(byte_tokenizer(added_toks, {{"post_processor",
                                               {{"type", "RobertaProcessing"}, {"cls", json::array({"<s>", 256})},
                                                {"sep", json::array({"</s>", 257})}}}}));
  EXPECT_EQ(rob->encode_prompt("a").value(), (Ids{256, 'a', 257}));
  // Errors name the file and the field.
  auto bad_bos = Tokenizer::from_json(byte_tokenizer(added_toks).dump(), "t.json",
                                      R"({"add_bos_token": true, "bos_token": "<bos>"})", "dir/tokenizer_config.json");
  ASSERT_FALSE(bad_bos.ok());
  EXPECT_NE(bad_bos.status().message().find("dir/tokenizer_config.json"), std::string::npos);
  EXPECT_NE(bad_bos.status().message().find("bos_token"), std::string::npos);
  auto bad_pp = Tokenizer::from_json(byte_tokenizer(added_toks, {{"post_processor", {{"type", "Weird"}}}}).dump(), "t.json");
  ASSERT_FALSE(bad_pp.ok());
  EXPECT_NE(bad_pp.status().message().find("Weird"), std::string::npos);
}

TEST(TokenizerPrompt, LoadDirReadsTheConfig) {
  auto dir = std::filesystem::temp_directory_path() / ("afd_tok_dir_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json")
      << byte_tokenizer(json::array({added(256, "<bos>", {{"special", true}})})).dump();
  auto plain = Tokenizer::load_dir(dir.string());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_FALSE((*plain)->add_bos());
  std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": true, "bos_token": "<bos>"})";
  auto with = Tokenizer::load_dir(dir.string());
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  EXPECT_TRUE((*with)->add_bos());
  EXPECT_EQ((*with)->encode_prompt("x").value(), (Ids{256, 'x'}));
  std::filesystem::remove_all(dir);
}

TEST(TokenizerInput, RefusesInvalidUtf8AndNonByteLevelModels) {
  auto t = make(byte_tokenizer());
  ASSERT_TRUE(t);
  auto r = t->encode(std::string_view("ok\xFF"), true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(t->encode(std::string_view("ok\xFF")).empty());  // the transitional form: no ids
  json sp = byte_tokenizer();
  sp["model"]["byte_fallback"] = true;
  auto f = Tokenizer::from_json(sp.dump(), "sp.json");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("byte_fallback"), std::string::npos);
  json lower = byte_tokenizer(json::array(), {{"normalizer", {{"type", "Lowercase"}}}});
  auto l = Tokenizer::from_json(lower.dump(), "low.json");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("Lowercase"), std::string::npos);
  EXPECT_NE(l.status().message().find("low.json"), std::string::npos);
}

TEST(TokenizerInput, ConcurrentEncodesAgree) {
  // Threads share one tokenizer and its piece memo; every result equals the serial one.
  json merges = json::array({"h e", "l l", "he ll", "o \u0120", "w o"});
  json j = byte_tokenizer();
  for (const char* tok : {"he", "ll", "hell", "o\u0120", "wo"}) j["model"]["vocab"][tok] = j["model"]["vocab"].size();
  j["model"]["merges"] = merges;
  auto t = make(j);
  ASSERT_TRUE(t);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("hello world " + std::to_string(i * 7919) + " wohello\n");
  std::vector<Ids> serial;
  for (const auto& s : texts) serial.push_back(enc(*t, s));
  EXPECT_LT(serial[0].size(), 20u);  // merges applied
  std::vector<std::thread> pool;
  std::vector<int> mismatches(4, 0);
  for (int w = 0; w < 4; ++w)
    pool.emplace_back([&, w] {
      for (int r = 0; r < 50; ++r)
        for (size_t i = 0; i < texts.size(); ++i) {
          auto got = t->encode(texts[(i + w) % texts.size()], true);
          if (!got.ok() || *got != serial[(i + w) % texts.size()]) ++mismatches[w];
        }
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>(4, 0)));
}

}  // namespace
}  // namespace afd::serve::test_tokenizer_pipeline
