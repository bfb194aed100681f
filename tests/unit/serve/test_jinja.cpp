#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/chat_template.h"
#include "serve/jinja.h"

namespace afd::serve::jinja {
namespace {

using json = nlohmann::ordered_json;

std::string render(const std::string& t, const json& ctx = json::object()) {
  auto tp = Template::parse(t);
  if (!tp.ok()) return "PARSE ERROR: " + tp.status().message();
  auto r = (*tp)->render(ctx);
  if (!r.ok()) return "RENDER ERROR: " + r.status().message();
  return *r;
}

TEST(Jinja, ExpressionsAndFilters) {
  EXPECT_EQ(render("{{ 'a' + 'b' ~ 1 }}"), "ab1");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ 1 / 2 }}"), "7 3 1 8 0.5");
  EXPECT_EQ(render("{{ '  x  ' | trim }}|{{ [1,2,3] | length }}|{{ 'abc' | upper }}"), "x|3|ABC");
  EXPECT_EQ(render("{{ x | default('d') }}{{ none }}{{ true }}"), "dNoneTrue");
  EXPECT_EQ(render("{{ 'a' if 1 > 2 else 'b' }}{{ 'c' if not false }}"), "bc");
  EXPECT_EQ(render("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] | join(',') }}{{ xs[::-1] | join('') }}", {{"xs", {1, 2, 3}}}),
            "132,3321");
  EXPECT_EQ(render("{{ d.k }}{{ d['k'] }}{{ d.missing is defined }}{{ d.k is string }}", {{"d", {{"k", "v"}}}}),
            "vvFalseTrue");
  EXPECT_EQ(render("{{ 'x' in 'axb' }}{{ 2 in [1,2] }}{{ 3 not in [1,2] }}"), "TrueTrueTrue");
  EXPECT_EQ(render("{{ 'a<b>c'.split('<')[1].split('>')[0] }}|{{ ' hi\n'.strip() }}|{{ 'abc'.startswith('ab') }}"),
            "b|hi|True");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [true, none, 'q\"']} | tojson }}"), "{\"b\": 1, \"a\": [true, null, \"q\\\"\"]}");
  EXPECT_EQ(render("{{ {'a': 1} | tojson(indent=2) }}"), "{\n  \"a\": 1\n}");
  EXPECT_EQ(render("{{ xs | selectattr('r', 'equalto', 'u') | list | length }}",
                   {{"xs", json::array({{{"r", "u"}}, {{"r", "a"}}, {{"r", "u"}}})}}),
            "2");
  EXPECT_EQ(render("{{ xs | map(attribute='r') | join('-') }}", {{"xs", json::array({{{"r", "u"}}, {{"r", "a"}}})}}),
            "u-a");
}

TEST(Jinja, StatementsScopesAndLoops) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
                   {{"xs", {"a", "b"}}}),
            "1a,2b");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}), "a=1;b=2;");
  // set inside a loop does not leak; namespace attributes do.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(c=0) %}{% for i in range(3) %}{% set n = n + 1 %}"
                   "{% set ns.c = ns.c + 1 %}{% endfor %}{{ n }}{{ ns.c }}"),
            "03");
  EXPECT_EQ(render("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {{"a", false}, {"b", true}}), "B");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('Bo') }}/{{ greet('Al', p='Yo') }}"),
            "Hi Bo/Yo Al");
  EXPECT_EQ(render("{% set x %}in{{ 1 }}{% endset %}[{{ x }}]"), "[in1]");
  EXPECT_EQ(render("{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}", {{"xs", {1, 2, 3}}}), "2232");
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  // trim_blocks removes the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("{# comment #}\nz"), "z");
  EXPECT_EQ(render("{{ 'e' }}\nf"), "e\nf");
}

TEST(Jinja, ErrorsAreStatuses) {
  EXPECT_NE(render("{% if x %}").find("PARSE ERROR"), std::string::npos);
  EXPECT_NE(render("{{ 1 + }}").find("PARSE ERROR"), std::string::npos);
  EXPECT_NE(render("{% frobnicate %}").find("PARSE ERROR"), std::string::npos);
  std::string r = render("{{ raise_exception('roles must alternate') }}");
  EXPECT_NE(r.find("RENDER ERROR"), std::string::npos);
  EXPECT_NE(r.find("roles must alternate"), std::string::npos);
  EXPECT_NE(render("{{ 1 / 0 }}").find("RENDER ERROR"), std::string::npos);
  EXPECT_NE(render("{{ x | nosuchfilter }}").find("RENDER ERROR"), std::string::npos);
  EXPECT_NE(render("{% for i in range(100000000) %}{% endfor %}").find("RENDER ERROR"), std::string::npos);
  EXPECT_NE(render("{{ 'x' * 100000000 }}").find("RENDER ERROR"), std::string::npos);
}

// A ChatML template in the style of the Qwen family (tools, system default, reversed
// scan with a namespace, content checks), written for this test.
const char* kQwenStyle = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.last_user == -1 and message.role == "user" %}
        {%- set ns.last_user = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role != "system" %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

TEST(ChatTemplate, QwenStyleTemplate) {
  auto ct = afd::serve::ChatTemplate::from_template(kQwenStyle, "", "<|im_end|>");
  ASSERT_TRUE(ct.ok()) << ct.status().to_string();
  json msgs = json::array({{{"role", "user"}, {"content", "Hi"}},
                           {{"role", "assistant"}, {"content", "<think>hmm</think>\n\nHello!"}},
                           {{"role", "user"}, {"content", "Bye"}}});
  auto r = ct->render(msgs, true);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  auto t = ct->render(json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}), false, tools);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t,
            "<|im_start|>system\nS\n\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n"
            "</tools><|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
  auto bad = ct->render(json::array({{{"role", "user"}, {"content", "x"}}, {{"role", "wizard"}, {"content", "y"}}}), true);
  EXPECT_FALSE(bad.ok());
}

// Llama-3 style: bos token, header ids, trim filter, loop.index0 check.
TEST(ChatTemplate, LlamaStyleTemplate) {
  const char* t =
      "{% set loop_messages = messages %}{% for message in loop_messages %}"
      "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
      "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
  auto ct = afd::serve::ChatTemplate::from_template(t, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(ct.ok()) << ct.status().to_string();
  auto r = ct->render(json::array({{{"role", "user"}, {"content", "  Hi  "}}}), true);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ConfigJsonForms) {
  json cfg = {{"eos_token", {{"content", "</s>"}}},
              {"bos_token", "<s>"},
              {"chat_template", json::array({{{"name", "default"}, {"template", "{{ bos_token }}{{ messages[0].content }}"}}})}};
  auto ct = afd::serve::ChatTemplate::from_config_json(cfg.dump(), "tokenizer_config.json");
  ASSERT_TRUE(ct.ok()) << ct.status().to_string();
  EXPECT_EQ(ct->eos_token(), "</s>");
  EXPECT_EQ(*ct->render(json::array({{{"role", "user"}, {"content", "x"}}}), true), "<s>x");
  auto none = afd::serve::ChatTemplate::from_config_json("{}", "tokenizer_config.json");
  EXPECT_EQ(none.status().code(), StatusCode::not_found);
}

}  // namespace
}  // namespace afd::serve::jinja
