#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api/tool_calls.h"

namespace afd::serve::test_tool_calls {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kQwenCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const std::string kDsCall =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
    "\"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

TEST(ToolCalls, SyntaxFromTemplate) {
  EXPECT_EQ(tool_syntax_of_template("{{ '<tool_call>' }}"), ToolSyntax::hermes);
  EXPECT_EQ(tool_syntax_of_template("{{'<｜tool▁call▁begin｜>' + tool['type']}}"), ToolSyntax::deepseek_v3);
  EXPECT_EQ(tool_syntax_of_template("anything else"), ToolSyntax::hermes);
}

TEST(ToolCalls, HermesWholeAnswer) {
  ParsedToolCalls p = parse_tool_calls("Let me check.\n" + kQwenCall + "\n" + kQwenCall, ToolSyntax::hermes, "abc");
  EXPECT_EQ(p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].id, "call_abc_0");
  EXPECT_EQ(p.calls[1].id, "call_abc_1");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");
  // parallel false: the first call only.
  EXPECT_EQ(parse_tool_calls(kQwenCall + "\n" + kQwenCall, ToolSyntax::hermes, "x", false).calls.size(), 1u);
}

TEST(ToolCalls, HermesOtherKeyOrder) {
  ParsedToolCalls p =
      parse_tool_calls("<tool_call>{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"f\"}</tool_call>",
                       ToolSyntax::hermes, "x");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(ojson::parse(p.calls[0].arguments), ojson::parse("{\"a\": [1, {\"b\": \"}\"}]}"));
}

TEST(ToolCalls, BrokenCallsStayContent) {
  for (const std::string& text : {std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}"),  // left open
                                 std::string("<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>"),
                                 std::string("<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>"),
                                 std::string("<tool_call>not json</tool_call>"),
                                 std::string("no call at all <tool_ca")}) {
    ParsedToolCalls p = parse_tool_calls(text, ToolSyntax::hermes, "x");
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(ToolCalls, DeepSeekWholeAnswer) {
  ParsedToolCalls p = parse_tool_calls("ok" + kDsCall, ToolSyntax::deepseek_v3, "q");
  EXPECT_EQ(p.content, "ok");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_TRUE(parse_tool_calls("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>web<｜tool▁sep｜>f\n```json\n{}\n```",
                               ToolSyntax::deepseek_v3, "q")
                  .calls.empty());
}

// Streams text in pieces of `step` bytes and rebuilds content and calls from the deltas as
// the openai client does.
struct Rebuilt {
  std::string content;
  std::vector<std::string> names, ids, args;
  int64_t n_calls = 0;
};
Rebuilt stream(const std::string& text, ToolSyntax syntax, size_t step, bool parallel = true) {
  ToolCallStream s(syntax, "id", parallel);
  Rebuilt r;
  auto take = [&](const ToolCallStream::Delta& d) {
    r.content += d.content;
    for (const auto& tc : d.tool_calls) {
      const size_t i = tc["index"].get<size_t>();
      if (tc.contains("id")) {
        EXPECT_EQ(i, r.names.size());
        EXPECT_EQ(tc["type"], "function");
        r.ids.push_back(tc["id"].get<std::string>());
        r.names.push_back(tc["function"]["name"].get<std::string>());
        r.args.emplace_back();
      }
      EXPECT_LT(i, r.args.size());
      if (tc["function"].contains("arguments")) r.args[i] += tc["function"]["arguments"].get<std::string>();
    }
  };
  for (size_t i = 0; i < text.size(); i += step) take(s.add(text.substr(i, step)));
  take(s.finish());
  r.n_calls = s.n_calls();
  return r;
}

TEST(ToolCalls, StreamedPiecesRebuildTheWholeAnswer) {
  const std::string hermes = "Checking.\n" + kQwenCall + "\n" + kQwenCall;
  for (size_t step : {1, 2, 3, 7, 1000}) {
    Rebuilt r = stream(hermes, ToolSyntax::hermes, step);
    ParsedToolCalls p = parse_tool_calls(hermes, ToolSyntax::hermes, "id");
    EXPECT_EQ(r.content, p.content) << step;
    ASSERT_EQ(r.names.size(), 2u) << step;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(r.names[i], p.calls[i].name);
      EXPECT_EQ(r.ids[i], p.calls[i].id);
      EXPECT_EQ(r.args[i], p.calls[i].arguments);
    }
    Rebuilt ds = stream(kDsCall, ToolSyntax::deepseek_v3, step);
    ASSERT_EQ(ds.names.size(), 2u) << step;
    EXPECT_EQ(ds.args[0], "{\"city\": \"Paris\"}");
    EXPECT_EQ(ds.content, "");
    EXPECT_EQ(stream(hermes, ToolSyntax::hermes, step, false).names.size(), 1u);
  }
}

TEST(ToolCalls, StreamedTextWithoutCallsIsAllContent) {
  for (const std::string& text : {std::string("plain answer < with <tool brackets"), std::string("ends in <tool_ca"),
                                 std::string("<tool_call>{broken</tool_call> tail")}) {
    for (size_t step : {1, 4, 100}) {
      Rebuilt r = stream(text, ToolSyntax::hermes, step);
      EXPECT_EQ(r.content, text) << step;
      EXPECT_EQ(r.n_calls, 0);
    }
  }
}

TEST(ToolCalls, StreamedArgumentsArriveInPieces) {
  ToolCallStream s(ToolSyntax::hermes, "id");
  EXPECT_TRUE(s.add("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ").tool_calls.size() == 2);
  ToolCallStream::Delta d = s.add("\"xyz\"");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0]["function"]["arguments"], "\"xyz\"");
  EXPECT_FALSE(d.tool_calls[0].contains("id"));
}

}  // namespace
}  // namespace afd::serve::test_tool_calls
