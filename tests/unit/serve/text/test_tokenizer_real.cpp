// afd's tokenizer on real tokenizer.json files against token ids from an independent
// implementation (a transformers.js fork). tests/unit/serve/real_tokenizers/run.sh (ctest
// serve_real_tokenizers) installs the packages, writes the reference ids and sets the
// environment; without it these cases skip.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serve/api/tool_calls.h"
#include "serve/structured/gbnf_builder.h"
#include "serve/structured/grammar_cache.h"
#include "serve/structured/matcher.h"
#include "serve/text/tokenizer.h"

namespace afd::serve::test_tokenizer_real {
namespace {

using json = nlohmann::json;

json read_json(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

class RealTokenizers : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* ref = std::getenv("AFD_REAL_TOKENIZERS_REF");
    const char* corpus = std::getenv("AFD_REAL_TOKENIZERS_CORPUS");
    if (!ref || !corpus) GTEST_SKIP() << "run through ctest serve_real_tokenizers (real_tokenizers/run.sh)";
    ref_ = read_json(ref);
    corpus_ = read_json(corpus);
    ASSERT_TRUE(ref_.is_object() && corpus_.is_array()) << ref << ", " << corpus;
  }
  std::shared_ptr<const Tokenizer> load(const std::string& model) {
    if (!ref_.contains(model)) {
      ADD_FAILURE() << "no reference for " << model;
      return nullptr;
    }
    auto t = Tokenizer::load_dir(ref_[model]["dir"].get<std::string>());
    EXPECT_TRUE(t.ok()) << model << ": " << t.status().to_string();
    return t.ok() ? *t : nullptr;
  }
  std::vector<int32_t> ref_ids(const std::string& model, size_t i, const char* which = "ids") {
    return ref_[model][which][i].get<std::vector<int32_t>>();
  }
  std::vector<int32_t> enc(const Tokenizer& t, std::string_view s, bool parse_special = true) {
    auto r = t.encode(s, parse_special);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : std::vector<int32_t>{};
  }
  std::vector<std::string> pieces(const Tokenizer& t, std::string_view s) {
    std::vector<std::string> out;
    for (int32_t id : enc(t, s)) out.push_back(t.token_bytes(id));
    return out;
  }
  json ref_, corpus_;
};

// Every corpus text gives the reference ids; identity-normalizer tokenizers decode back to
// the text. Prints afd's encode throughput per tokenizer (not asserted).
TEST_F(RealTokenizers, MatchReferenceIds) {
  std::string long_text;
  for (int r = 0; r < 100; ++r)
    for (const json& t : corpus_) long_text += t.get<std::string>() + "\n";
  for (const auto& [model, _] : ref_.items()) {
    auto tok = load(model);
    if (!tok) continue;
    const bool identity_normalizer = model != "qwen3" && model != "claude";  // NFC, NFKC
    size_t n_tokens = 0;
    for (size_t i = 0; i < corpus_.size(); ++i) {
      const std::string text = corpus_[i].get<std::string>();
      std::vector<int32_t> want = ref_ids(model, i);
      std::vector<int32_t> got = enc(*tok, text);
      EXPECT_EQ(got, want) << model << " on corpus[" << i << "]: " << text;
      if (identity_normalizer) {
        EXPECT_EQ(tok->decode(got, false), text) << model << " round trip of corpus[" << i << "]";
      }
      n_tokens += got.size();
    }
    EXPECT_GT(n_tokens, 500u) << model;
    double best = 1e9;
    size_t n = 0;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      n = enc(*tok, long_text).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("[ afd encode ] %-12s %zu bytes -> %zu tokens in %.3f s: %.1f MB/s\n", model.c_str(),
                long_text.size(), n, best, long_text.size() / best / 1e6);
  }
}

// Facts about these tokenizers known independently of either implementation, and the
// prompt ids a completions request gets.
TEST_F(RealTokenizers, KnownFactsAndPromptIds) {
  if (auto ds = load("deepseek_v3")) {
    // MODELS.md: Step-3's vocab_size 128815 is the DeepSeek-V3 tokenizer's (the DeepSeek-V3
    // embedding, 129280 rows, pads it).
    EXPECT_EQ(ds->vocab_size(), 128815);
    EXPECT_EQ(ds->token_id("<｜begin▁of▁sentence｜>"), 0);
    EXPECT_EQ(ds->token_id("<｜end▁of▁sentence｜>"), 1);
    // tokenizer_config.json: LlamaTokenizerFast with add_bos_token=true, so transformers
    // (and vLLM through it) prepend the BOS to a completions prompt. The JS reference does
    // not implement add_bos_token, hence [0] + its ids.
    EXPECT_EQ(ds->bos_id(), 0);
    EXPECT_TRUE(ds->add_bos());
    EXPECT_TRUE(ds->prompt_suffix().empty());
    for (size_t i = 0; i < corpus_.size(); ++i) {
      std::vector<int32_t> want = ref_ids("deepseek_v3", i);
      want.insert(want.begin(), 0);
      auto got = ds->encode_prompt(corpus_[i].get<std::string>());
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, want) << "corpus[" << i << "]";
    }
    // Digits split in groups of at most three; CJK runs are split off; role markers are
    // (non-special) added tokens.
    EXPECT_EQ(pieces(*ds, "1234567"), (std::vector<std::string>{"123", "456", "7"}));
    EXPECT_EQ(enc(*ds, "<｜User｜>"), (std::vector<int32_t>{128803}));
    EXPECT_FALSE(ds->is_special(128803));
    // parse_special=false: control-token text is plain text.
    std::vector<int32_t> plain = enc(*ds, "<｜User｜>hi<｜end▁of▁sentence｜>", false);
    for (int32_t id : plain) EXPECT_TRUE(id != 128803 && id != 1) << id;
    EXPECT_EQ(ds->decode(plain, false), "<｜User｜>hi<｜end▁of▁sentence｜>");
  }
  if (auto qw = load("qwen3")) {
    EXPECT_EQ(qw->token_id("<|endoftext|>"), 151643);
    EXPECT_EQ(qw->token_id("<|im_start|>"), 151644);
    EXPECT_EQ(qw->token_id("<|im_end|>"), 151645);
    EXPECT_FALSE(qw->add_bos());  // add_bos_token=false, bos_token null
    EXPECT_TRUE(qw->prompt_prefix().empty() && qw->prompt_suffix().empty());
    EXPECT_EQ(pieces(*qw, "2024").size(), 4u);  // single digits
    // NFC: a decomposed accent encodes like the composed one.
    EXPECT_EQ(enc(*qw, "cafe\u0301"), enc(*qw, "caf\u00e9"));
  }
  if (auto ll = load("llama3")) {
    EXPECT_EQ(ll->token_id("<|begin_of_text|>"), 128000);
    EXPECT_EQ(ll->token_id("<|eot_id|>"), 128009);
    EXPECT_EQ(pieces(*ll, "1234567"), (std::vector<std::string>{"123", "456", "7"}));
  }
  if (auto g4 = load("gpt4o")) {
    EXPECT_EQ(g4->token_id("<|endoftext|>"), 199999);
    EXPECT_EQ(g4->vocab_size(), 200019);
  }
  if (auto cl = load("claude")) {
    EXPECT_EQ(enc(*cl, "\ufb01nance"), enc(*cl, "finance"));  // NFKC folds the ligature
  }
  if (auto wn = load("wordnet")) {
    // afd's trained tokenizer (scripts/train/tokenizer.py): 256 bytes, the merges, then the
    // six special tokens at the top ids; add_bos_token=true, so a completions prompt is
    // [<|bos|>] + the text's ids (the JS reference does not implement add_bos_token).
    EXPECT_EQ(wn->vocab_size(), 4096);
    EXPECT_EQ(wn->token_id("<|bos|>"), 4090);
    EXPECT_EQ(wn->token_id("<|eos|>"), 4091);
    EXPECT_EQ(wn->token_id("<|assistant|>"), 4093);
    EXPECT_TRUE(wn->add_bos());
    EXPECT_EQ(wn->bos_id(), 4090);
    for (size_t i = 0; i < corpus_.size(); ++i) {
      std::vector<int32_t> want = ref_ids("wordnet", i);
      want.insert(want.begin(), 4090);
      auto got = wn->encode_prompt(corpus_[i].get<std::string>());
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, want) << "corpus[" << i << "]";
    }
  }
  // Without add_bos_token in their configs and with no template post-processor, the
  // others' completions prompts are the reference's add_special_tokens=true ids.
  for (const char* model : {"qwen3", "llama3", "gpt4o", "claude"}) {
    auto tok = load(model);
    if (!tok) continue;
    for (size_t i = 0; i < corpus_.size(); ++i) {
      auto got = tok->encode_prompt(corpus_[i].get<std::string>());
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, ref_ids(model, i, "ids_special")) << model << " corpus[" << i << "]";
    }
  }
}

// Structured outputs on real vocabularies (DeepSeek-V3's 128k, Qwen3's 151k tokens): the
// grammar of a forced tool call in the family's own syntax takes the call as the model's
// tokenizer spells it (markers as single added tokens), token by token, each token allowed by
// the mask before it, and ends there; inside a JSON string, special tokens such as Qwen3's
// <|im_end|> are never allowed; the answer parses back into the call. Prints mask times.
TEST_F(RealTokenizers, ToolCallGrammarsOnRealVocabularies) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city", "days"]}}}])");
  struct Family {
    const char* model;
    ToolSyntax syntax;
    const char* eos;
    std::string call;
  };
  const std::vector<Family> families = {
      {"deepseek_v3", ToolSyntax::deepseek_v3, "<｜end▁of▁sentence｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
       "{\"city\": \"Paris\", \"days\": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"qwen3", ToolSyntax::hermes, "<|im_end|>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"}};
  for (const Family& f : families) {
    auto tok = load(f.model);
    if (!tok) continue;
    const int32_t eos = tok->token_id(f.eos);
    ASSERT_GE(eos, 0) << f.model;
    auto vocab = TokenVocab::build(*tok, {eos}, tok->vocab_size());
    GrammarCache cache(vocab);
    auto gbnf = tool_call_gbnf(f.syntax, tools, "", true);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().to_string();
    auto g = cache.get(*gbnf);
    ASSERT_TRUE(g.ok()) << f.model << ": " << g.status().to_string();
    GrammarMatcher m(*g);
    std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
    const std::vector<int32_t> ids = enc(*tok, f.call);
    double worst_us = 0;
    for (int32_t id : ids) {
      const auto t0 = std::chrono::steady_clock::now();
      m.fill_next_token_mask(mask.data());
      worst_us = std::max(worst_us, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      ASSERT_TRUE((mask[id / 64] >> (id % 64)) & 1) << f.model << ": token " << id << " '" << tok->token_bytes(id) << "'";
      ASSERT_TRUE(m.accept_token(id)) << f.model;
    }
    EXPECT_TRUE(m.can_end()) << f.model;
    EXPECT_TRUE(m.accept_token(eos)) << f.model;
    EXPECT_TRUE(m.is_finished());
    ParsedToolCalls p = parse_tool_calls(tok->decode(ids, true), f.syntax, "x");
    ASSERT_EQ(p.calls.size(), 1u) << f.model << ": " << tok->decode(ids, true);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(nlohmann::json::parse(p.calls[0].arguments), nlohmann::json::parse(R"({"city": "Paris", "days": 3})"));
    std::printf("%s: forced tool call of %zu tokens, slowest mask %.0f us (first visits included)\n", f.model, ids.size(),
                worst_us);
  }
  // Inside a JSON string on Qwen3: text tokens yes, special tokens never.
  if (auto tok = load("qwen3")) {
    auto vocab = TokenVocab::build(*tok, {tok->token_id("<|im_end|>")}, tok->vocab_size());
    GrammarCache cache(vocab);
    auto g = cache.get(*json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "string"})")));
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    GrammarMatcher m(*g);
    ASSERT_TRUE(m.accept_bytes("\"abc"));
    std::vector<uint64_t> mask(static_cast<size_t>(m.mask_words()));
    m.fill_next_token_mask(mask.data());
    for (const char* special : {"<|im_end|>", "<|im_start|>", "<|endoftext|>"}) {
      const int32_t id = tok->token_id(special);
      ASSERT_GE(id, 0);
      EXPECT_FALSE((mask[id / 64] >> (id % 64)) & 1) << special;
    }
    const int32_t hello = enc(*tok, "hello")[0];
    EXPECT_TRUE((mask[hello / 64] >> (hello % 64)) & 1);
  }
}

}  // namespace
}  // namespace afd::serve::test_tokenizer_real
