#include <gtest/gtest.h>

#include <filesystem>

#include "serve/request.h"
#include "serve/tokenizer_writer.h"

namespace afd::serve {
namespace {

class RequestTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("afd_req_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(write_tokenizer_files(dir_, 1024).ok());
    tok_ = *Tokenizer::load(dir_ + "/tokenizer.json");
    chat_ = std::make_unique<ChatTemplate>(*ChatTemplate::load(dir_ + "/tokenizer_config.json"));
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  Result<GenerationRequest> parse(Endpoint ep, const std::string& body) {
    RequestLimits lim;
    lim.model_name = "m";
    lim.vocab_size = 1024;
    lim.max_context = 64;
    return parse_request(ep, body, *tok_, chat_.get(), lim, 7);
  }
  void expect_400(Endpoint ep, const std::string& body, const std::string& needle) {
    auto r = parse(ep, body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << body;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  static inline std::string dir_;
  static inline std::shared_ptr<const Tokenizer> tok_;
  static inline std::unique_ptr<ChatTemplate> chat_;
};

TEST_F(RequestTest, CompletionWithTextAndIds) {
  auto r = parse(Endpoint::completions, R"({"model":"m","prompt":"hello","max_tokens":5,"temperature":0,"seed":3,
    "stop":["x","yz"],"logprobs":2,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt, tok_->encode("hello"));
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  EXPECT_EQ(r->sampling.seed, 3u);
  EXPECT_EQ(r->stop.size(), 2u);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->sampling.n_top_logprobs, 2);
  EXPECT_TRUE(r->stream && r->include_usage);
  auto ids = parse(Endpoint::completions, R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids->max_tokens, 61);  // the rest of the context
  EXPECT_EQ(ids->sampling.seed, 7u);
  EXPECT_EQ(ids->sampling.temperature, 1.0f);
  auto nested = parse(Endpoint::completions, R"({"prompt":[[5,6]],"max_completion_tokens":2})");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->max_tokens, 2);
}

TEST_F(RequestTest, ChatRendersTemplate) {
  auto r = parse(Endpoint::chat, R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
    "logprobs":true,"top_logprobs":3})");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(tok_->decode(r->prompt, false), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r->sampling.n_top_logprobs, 3);
}

TEST_F(RequestTest, BadInputIs400) {
  expect_400(Endpoint::completions, "{not json", "not valid JSON");
  expect_400(Endpoint::completions, "[1]", "JSON object");
  expect_400(Endpoint::completions, R"({})", "'prompt' is required");
  expect_400(Endpoint::completions, R"({"prompt":""})", "empty");
  expect_400(Endpoint::completions, R"({"prompt":[]})", "empty");
  expect_400(Endpoint::completions, R"({"prompt":5})", "'prompt'");
  expect_400(Endpoint::completions, R"({"prompt":["a","b"]})", "several prompts");
  expect_400(Endpoint::completions, R"({"prompt":[1,2000]})", "outside the vocabulary");
  expect_400(Endpoint::completions, R"({"prompt":[1,-1]})", "outside the vocabulary");
  expect_400(Endpoint::completions, R"({"prompt":[1,"x"]})", "prompt[1]");
  std::string long_prompt = "[" + std::string("1,", 0);
  for (int i = 0; i < 64; ++i) long_prompt += (i ? ",1" : "1");
  expect_400(Endpoint::completions, R"({"prompt":)" + long_prompt + "]}", "context");
  expect_400(Endpoint::completions, R"({"prompt":"a","max_tokens":0})", "max_tokens");
  expect_400(Endpoint::completions, R"({"prompt":"a","max_tokens":-3})", "max_tokens");
  expect_400(Endpoint::completions, R"({"prompt":"a","max_tokens":1000})", "exceeds the context");
  expect_400(Endpoint::completions, R"({"prompt":"a","max_tokens":"5"})", "integer");
  expect_400(Endpoint::completions, R"({"prompt":"a","temperature":3})", "temperature");
  expect_400(Endpoint::completions, R"({"prompt":"a","temperature":"hot"})", "temperature");
  expect_400(Endpoint::completions, R"({"prompt":"a","top_p":0})", "top_p");
  expect_400(Endpoint::completions, R"({"prompt":"a","top_p":1.5})", "top_p");
  expect_400(Endpoint::completions, R"({"prompt":"a","top_k":-5})", "top_k");
  expect_400(Endpoint::completions, R"({"prompt":"a","n":2})", "'n'");
  expect_400(Endpoint::completions, R"({"prompt":"a","stop":["a","b","c","d","e"]})", "stop");
  expect_400(Endpoint::completions, R"({"prompt":"a","stop":[""]})", "stop");
  expect_400(Endpoint::completions, R"({"prompt":"a","stop":7})", "stop");
  expect_400(Endpoint::completions, R"({"prompt":"a","logprobs":50})", "logprobs");
  expect_400(Endpoint::completions, R"({"prompt":"a","stream_options":{"include_usage":true}})", "stream");
  expect_400(Endpoint::completions, R"({"prompt":"a","presence_penalty":1})", "presence_penalty");
  expect_400(Endpoint::chat, R"({"messages":[]})", "empty");
  expect_400(Endpoint::chat, R"({"messages":"hi"})", "messages");
  expect_400(Endpoint::chat, R"({"messages":[{"role":"wizard","content":"x"}]})", "role");
  expect_400(Endpoint::chat, R"({"messages":[{"role":"user"}]})", "content");
  expect_400(Endpoint::chat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "logprobs");
  expect_400(Endpoint::chat, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":30,"logprobs":true})",
             "top_logprobs");
  auto nf = parse(Endpoint::completions, R"({"model":"other","prompt":"a"})");
  EXPECT_EQ(nf.status().code(), StatusCode::not_found);
}

}  // namespace
}  // namespace afd::serve
