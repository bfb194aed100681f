#include <gtest/gtest.h>

#include <pthread.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "serve/text/chat_template.h"
#include "serve/text/jinja.h"

namespace afd::serve::jinja::test_jinja {
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
  // A "tool_use" template serves requests with tools, as transformers picks it.
  json named = {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T{{ tools | length }}"}},
                                               {{"name", "default"}, {"template", "D{{ tools is none }}"}}})}};
  auto nt = afd::serve::ChatTemplate::from_config_json(named.dump(), "tokenizer_config.json");
  ASSERT_TRUE(nt.ok()) << nt.status().to_string();
  EXPECT_EQ(*nt->render(json::array(), true), "DTrue");
  EXPECT_EQ(*nt->render(json::array(), true, json::array({1, 2})), "T2");
  auto none = afd::serve::ChatTemplate::from_config_json("{}", "tokenizer_config.json");
  EXPECT_EQ(none.status().code(), StatusCode::not_found);
}

// Python/jinja2 semantics (truthiness, precedence, rounding, methods as values, undefined
// in lists, code-point strings, float formatting); expected strings are python3-jinja2's
// output for the same templates (chat_template_jinja2_diff covers many more).
TEST(Jinja, FollowsJinja2Semantics) {
  json ctx = {{"messages", {1, 2}}, {"tools", nullptr}};
  EXPECT_EQ(render("{{ not '' }}|{{ -5 | abs }}|{{ {'a': {'b': 1}}.a.b }}|{{ 2 is in [1, 2] }}|{{ 2.5 | round }}|"
                   "{{ 1.25 | round(1) }}",
                   ctx),
            "True|5|1|True|2.0|1.2");
  EXPECT_EQ(render("{{ {'items': 1}.items is defined }}|{{ {'a': 1}['keys'] is defined }}|{{ [x, 1] }}|"
                   "{{ [1, x] | join('-') }}|{{ 'h\u00e9llo'[1:3] }}|{{ 'h\u00e9llo' | length }}",
                   ctx),
            "True|True|[Undefined, 1]|1-|\u00e9l|5");
  EXPECT_EQ(render("{{ 7 // -2 }}|{{ -7 % 3 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 0.1 + 0.2 }}|{{ true == 1 }}|"
                   "{{ ['it\\'s', 'x'] }}|{{ {'\u00e9': '\u00fc'} | tojson }}",
                   ctx),
            "-4|2|1e+16|1e-05|0.30000000000000004|True|[\"it's\", 'x']|{\"\u00e9\": \"\u00fc\"}");
  EXPECT_EQ(render("{% for m in messages %}{{ loop.previtem is defined }}{{ loop.cycle('a', 'b') }}{% endfor %}|"
                   "{{ tools is none }}|{{ ' a \u00a0' | trim }}|{{ 'Ab' | title }}",
                   ctx),
            "FalseaTrueb|True|a|Ab");
  EXPECT_NE(render("{{ x.y }}").find("'x' is undefined"), std::string::npos);
}

// ---- limits: nothing a template or its data contains can crash, stall or exhaust memory

std::string repeat(const std::string& s, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += s;
  return r;
}

std::string parse_error(const std::string& t, const Limits& lim = {}) {
  auto tp = Template::parse(t, lim);
  return tp.ok() ? "" : tp.status().message();
}

TEST(JinjaLimits, DeepExpressionsAreRefusedAtParseTime) {
  const std::string deep[] = {
      "{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}",
      "{{ " + repeat("not ", 5000) + "x }}",
      "{{ " + repeat("-", 5000) + "1 }}",
      "{{ " + repeat("[", 5000) + repeat("]", 5000) + " }}",
      "{{ " + repeat("{'a': ", 3000) + "1" + repeat("}", 3000) + " }}",
      "{{ x" + repeat(" + x", 20000) + " }}",  // left-deep chain built by a loop
      "{{ x" + repeat("|trim", 5000) + " }}",
      "{{ x" + repeat(".a", 5000) + " }}",
      "{{ x" + repeat("[0]", 5000) + " }}",
      "{{ f(" + repeat("f(", 5000) + repeat(")", 5001) + " }}",
      "{{ " + repeat("1 if 1 else ", 5000) + "1 }}",
  };
  for (const std::string& t : deep) {
    std::string m = parse_error(t);
    EXPECT_NE(m.find("max_expr_depth"), std::string::npos) << t.substr(0, 40) << ": " << m;
  }
  // Within the limit, the same shapes parse and render.
  EXPECT_EQ(render("{{ " + repeat("(", 100) + "1" + repeat(")", 100) + " }}"), "1");
  EXPECT_EQ(render("{{ " + repeat("not ", 100) + "false }}"), "False");
  EXPECT_EQ(render("{{ " + repeat("-", 100) + "2 }}"), "2");
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 100) + " }}"), "101");
}

TEST(JinjaLimits, DeepBlocksAreRefusedAtParseTime) {
  std::string t = repeat("{% if true %}", 20000) + "x" + repeat("{% endif %}", 20000);
  std::string m = parse_error(t);
  EXPECT_NE(m.find("max_block_depth"), std::string::npos) << m;
  std::string f = repeat("{% for i in [1] %}", 5000) + repeat("{% endfor %}", 5000);
  EXPECT_NE(parse_error(f).find("max_block_depth"), std::string::npos);
  std::string ok = repeat("{% if true %}", 60) + "x" + repeat("{% endif %}", 60);
  EXPECT_EQ(render(ok), "x");
  Limits small;
  small.max_block_depth = 3;
  EXPECT_EQ(parse_error("{% if 1 %}{% if 1 %}{% if 1 %}{% endif %}{% endif %}{% endif %}", small), "");
  EXPECT_NE(parse_error("{% if 1 %}{% if 1 %}{% if 1 %}{% if 1 %}{% endif %}{% endif %}{% endif %}{% endif %}", small)
                .find("max_block_depth"),
            std::string::npos);
}

TEST(JinjaLimits, ChatTemplateNamesTheSourceOfARefusedTemplate) {
  json cfg = {{"chat_template", "{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}"}};
  auto ct = afd::serve::ChatTemplate::from_config_json(cfg.dump(), "/m/tokenizer_config.json");
  ASSERT_FALSE(ct.ok());
  EXPECT_NE(ct.status().message().find("/m/tokenizer_config.json"), std::string::npos) << ct.status().message();
  EXPECT_NE(ct.status().message().find("chat_template"), std::string::npos) << ct.status().message();
  EXPECT_NE(ct.status().message().find("max_expr_depth"), std::string::npos) << ct.status().message();
}

TEST(JinjaLimits, RenderingIsBounded) {
  auto err = [](const std::string& t, const json& ctx = json::object()) {
    std::string r = render(t, ctx);
    return r.rfind("RENDER ERROR", 0) == 0 ? r : "rendered " + std::to_string(r.size()) + " bytes";
  };
  // Recursion: a macro calling itself.
  EXPECT_NE(err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("max_call_depth"), std::string::npos);
  // Work: nested loops, huge ranges, repetition, list building.
  EXPECT_NE(err("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").find("max_steps"),
            std::string::npos);
  EXPECT_NE(err("{{ range(10**9) | length }}").find("max_range"), std::string::npos);
  EXPECT_NE(err("{{ 'a' * 10**9 }}").find("max_output_bytes"), std::string::npos);
  EXPECT_NE(err("{{ [1] * 10**9 }}").find("max_steps"), std::string::npos);
  EXPECT_NE(err("{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .find("max_output_bytes"),
            std::string::npos);
  EXPECT_NE(err("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("max_"),
            std::string::npos);
  // Output: many modest strings add up.
  EXPECT_NE(err("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").find("max_output_bytes"), std::string::npos);
  // Data depth: a template nesting a value in itself.
  EXPECT_NE(err("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                "{{ ns.x | tojson }}")
                .find("max_data_depth"),
            std::string::npos);
  // Evaluation depth, with a smaller limit than the parser's.
  Limits lim;
  lim.max_eval_depth = 50;
  auto tp = Template::parse("{{ " + repeat("(", 60) + "1" + repeat(" + 1)", 60) + " }}", lim);
  ASSERT_TRUE(tp.ok());
  auto r = (*tp)->render(json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_eval_depth"), std::string::npos) << r.status().message();
}

TEST(JinjaLimits, HostileMessageContentIsBounded) {
  // Content is data, but filters run on it: amplification stops at the string limit.
  json ctx = {{"messages", json::array({{{"role", "user"}, {"content", std::string(1 << 20, 'a')}}})}};
  std::string r = render("{{ messages[0].content | replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}", ctx);
  EXPECT_NE(r.find("max_output_bytes"), std::string::npos) << r.substr(0, 80);
  r = render("{{ messages[0].content | list | length }}", ctx);
  EXPECT_EQ(r, "1048576");
  // Deeply nested data (the request parser limits depth; the template engine checks too),
  // built without recursion so that only the engine under test could overflow.
  json deep = json::array();
  for (int i = 0; i < 100000; ++i) deep = json::array({std::move(deep)});
  json hostile = {{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"extra", std::move(deep)}}})}};
  r = render("{{ messages | tojson }}{{ messages }}{{ messages == messages }}", hostile);
  EXPECT_NE(r.find("max_data_depth"), std::string::npos) << r.substr(0, 80);
  json ok_depth = json::array();
  for (int i = 0; i < 60; ++i) ok_depth = json::array({std::move(ok_depth)});
  r = render("{{ x | tojson | length }} {{ x == x }}", {{"x", ok_depth}});
  EXPECT_EQ(r, "122 True");
}

// The deepest nesting the limits allow (expressions inside blocks inside recursive macros)
// ends in an error naming the limit on a thread with a 4 MiB stack (Release needs under
// 512 KiB, ASan about 3 MiB): the depth limits, not the stack size, stop it.
TEST(JinjaLimits, DeepestAllowedNestingFitsASmallStack) {
  std::string expr = repeat("(", 120) + "n" + repeat(" + 1)", 120);
  std::string t = "{% macro f(n) %}" + repeat("{% if true %}", 60) + "{{ f(" + expr + ") }}" +
                  repeat("{% endif %}", 60) + "{% endmacro %}{{ f(0) }}{{ " + repeat("not ", 120) + "x }}";
  struct Job {
    std::string tmpl, result;
  } job{t, ""};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t{4} << 20);
  pthread_t th;
  auto body = [](void* p) -> void* {
    auto* j = static_cast<Job*>(p);
    j->result = render(j->tmpl);
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&th, &attr, body, &job), 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_NE(job.result.find("max_eval_depth"), std::string::npos) << job.result.substr(0, 200);
}

TEST(JinjaLimits, ManyMessagesRenderInLinearTime) {
  // Variable lookups and subscripts share storage instead of copying, so a template that
  // indexes `messages` once per message stays linear in the number of messages.
  const char* t =
      "{%- for m in messages %}{%- if loop.first or messages[loop.index0 - 1].role != m.role %}<{{ m.role }}>"
      "{%- endif %}{{ m.content }}{%- if loop.last or messages[loop.index0 + 1].role != m.role %}</>{% endif %}"
      "{%- endfor %}";
  json msgs = json::array();
  for (int i = 0; i < 20000; ++i) msgs.push_back({{"role", i % 3 ? "tool" : "user"}, {"content", "c"}});
  auto t0 = std::chrono::steady_clock::now();
  std::string r = render(t, {{"messages", msgs}});
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // 20000 contents, and 13334 alternating runs of user/tool each wrapped in 9 bytes of tags.
  EXPECT_EQ(r.size(), 20000u + 13334u * 9u) << r.substr(0, 100);
  EXPECT_LT(s, 20.0);  // ~0.1 s idle; an engine that copied `messages` per lookup would need minutes
}

}  // namespace
}  // namespace afd::serve::jinja::test_jinja
