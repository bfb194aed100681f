#include "serve/api/tool_calls.h"

#include <algorithm>

#include "serve/structured/gbnf_builder.h"

namespace afd::serve {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesBegin = "<tool_call>", kHermesEnd = "</tool_call>";
constexpr std::string_view kDsSectionBegin = "<｜tool▁calls▁begin｜>", kDsSectionEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

enum class Match { yes, no, partial };

// Whether `lit` is at text[*pos]: yes (and *pos moves past it), no, or partial (the text
// ends inside a prefix of it).
Match expect(std::string_view text, size_t* pos, std::string_view lit) {
  const std::string_view rest = text.substr(*pos);
  if (rest.size() >= lit.size()) {
    if (rest.substr(0, lit.size()) != lit) return Match::no;
    *pos += lit.size();
    return Match::yes;
  }
  return lit.substr(0, rest.size()) == rest ? Match::partial : Match::no;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
void skip_ws(std::string_view t, size_t* pos) {
  while (*pos < t.size() && is_ws(t[*pos])) ++*pos;
}

// Bytes at the end of text that could be the start of `marker` (held back while streaming).
size_t marker_prefix_len(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// End (one past) of the JSON object starting at text[pos] == '{', or npos while it is open.
size_t json_object_end(std::string_view text, size_t pos) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// End (one past the closing quote) of the JSON string starting at text[pos] == '"', or npos.
size_t json_string_end(std::string_view text, size_t pos) {
  bool esc = false;
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (esc) esc = false;
    else if (text[i] == '\\') esc = true;
    else if (text[i] == '"') return i + 1;
  }
  return std::string_view::npos;
}

struct ScanCall {
  std::string name;
  bool name_known = false;
  std::string args;        // the argument text so far
  bool args_done = false;  // args is a complete JSON object
  bool closed = false;     // the call's end marker was read
};

struct Scan {
  size_t content_end = 0;   // the content is text[0, content_end)
  size_t content_safe = 0;  // of it, releasable now (a possible marker start held back)
  std::vector<ScanCall> calls;
  bool bad = false;         // a call block that does not follow the syntax
  bool open = false;        // the text ends inside a call block (or between calls, undecided)
};

// hermes: one call after "<tool_call>" at *pos; *pos moves past it when it is closed. Marks s->open
// when the text ends inside it, s->bad when it breaks the syntax.
void scan_hermes_call(std::string_view t, size_t* pos, ScanCall* call, Scan* s) {
  size_t p = *pos;
  auto need = [&](std::string_view lit) {
    skip_ws(t, &p);
    const Match m = expect(t, &p, lit);
    if (m == Match::no) s->bad = true;
    if (m == Match::partial) s->open = true;
    return m == Match::yes;
  };
  auto end_open = [&] { s->open = true; };
  if (!need("{")) return;
  skip_ws(t, &p);
  if (p >= t.size()) return end_open();
  size_t q = p;
  const Match m_name = expect(t, &q, "\"name\"");
  if (m_name == Match::partial) return end_open();
  if (m_name == Match::no) {
    // Another key order: the call is read whole once its end marker is there.
    const size_t close = t.find(kHermesEnd, p);
    if (close == std::string_view::npos) return end_open();
    const std::string_view body = t.substr(*pos, close - *pos);
    nlohmann::json j = nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() ||
        !j.contains("arguments") || !j["arguments"].is_object()) {
      s->bad = true;
      return;
    }
    call->name = j["name"].get<std::string>();
    call->name_known = true;
    call->args = j["arguments"].dump();
    call->args_done = call->closed = true;
    *pos = close + kHermesEnd.size();
    return;
  }
  p = q;
  if (!need(":")) return;
  skip_ws(t, &p);
  if (p >= t.size()) return end_open();
  if (t[p] != '"') { s->bad = true; return; }
  const size_t ne = json_string_end(t, p);
  if (ne == std::string_view::npos) return end_open();
  nlohmann::json name = nlohmann::json::parse(t.substr(p, ne - p), nullptr, false);
  if (name.is_discarded() || !name.is_string() || name.get_ref<const std::string&>().empty()) { s->bad = true; return; }
  p = ne;
  if (!need(",")) return;
  if (!need("\"arguments\"")) return;
  if (!need(":")) return;
  call->name = name.get<std::string>();
  call->name_known = true;
  skip_ws(t, &p);
  if (p >= t.size()) return end_open();
  if (t[p] != '{') { s->bad = true; return; }
  const size_t ae = json_object_end(t, p);
  call->args = std::string(t.substr(p, (ae == std::string_view::npos ? t.size() : ae) - p));
  if (ae == std::string_view::npos) return end_open();
  call->args_done = true;
  p = ae;
  if (!need("}")) return;
  if (!need(kHermesEnd)) return;
  call->closed = true;
  *pos = p;
}

// deepseek_v3: after "<｜tool▁call▁begin｜>" at *pos.
void scan_deepseek_call(std::string_view t, size_t* pos, ScanCall* call, Scan* s) {
  size_t p = *pos;
  const size_t sep = t.find(kDsSep, p);
  if (sep == std::string_view::npos) {
    if (t.size() - p > 64) s->bad = true;  // a type is one short word ("function")
    else s->open = true;
    return;
  }
  if (t.substr(p, sep - p) != "function") { s->bad = true; return; }
  p = sep + kDsSep.size();
  const size_t nl = t.find('\n', p);
  if (nl == std::string_view::npos) {
    if (t.size() - p > 256) s->bad = true;
    else s->open = true;
    return;
  }
  const std::string_view name = t.substr(p, nl - p);
  if (name.empty()) { s->bad = true; return; }
  p = nl + 1;
  auto need = [&](std::string_view lit, bool ws) {
    if (ws) skip_ws(t, &p);
    const Match m = expect(t, &p, lit);
    if (m == Match::no) s->bad = true;
    if (m == Match::partial) s->open = true;
    return m == Match::yes;
  };
  if (!need("```json", false)) return;
  call->name = std::string(name);
  call->name_known = true;
  skip_ws(t, &p);
  if (p >= t.size()) { s->open = true; return; }
  if (t[p] != '{') { s->bad = true; return; }
  const size_t ae = json_object_end(t, p);
  call->args = std::string(t.substr(p, (ae == std::string_view::npos ? t.size() : ae) - p));
  if (ae == std::string_view::npos) { s->open = true; return; }
  call->args_done = true;
  p = ae;
  if (!need("```", true)) return;
  if (!need(kDsCallEnd, true)) return;
  call->closed = true;
  *pos = p;
}

Scan scan(std::string_view t, ToolSyntax syntax, bool final) {
  Scan s;
  const std::string_view first = syntax == ToolSyntax::hermes ? kHermesBegin : kDsSectionBegin;
  const size_t at = t.find(first);
  if (at == std::string_view::npos) {
    s.content_end = t.size();
    s.content_safe = final ? t.size() : t.size() - marker_prefix_len(t, first);
    return s;
  }
  s.content_end = s.content_safe = at;
  size_t pos = at + first.size();
  if (syntax == ToolSyntax::hermes) {
    for (;;) {
      ScanCall c;
      scan_hermes_call(t, &pos, &c, &s);
      s.calls.push_back(std::move(c));
      if (!s.calls.back().closed) return s;
      // Another call follows after white space, or the answer goes on with text (dropped).
      size_t p = pos;
      skip_ws(t, &p);
      const Match m = p < t.size() ? expect(t, &p, kHermesBegin) : Match::partial;
      if (m == Match::partial) {
        s.open = !final;
        return s;
      }
      if (m == Match::no) return s;
      pos = p;
    }
  }
  for (;;) {
    size_t p = pos;
    skip_ws(t, &p);
    const Match m = expect(t, &p, kDsCallBegin);
    if (m == Match::partial || p >= t.size()) {
      s.open = true;
      return s;
    }
    if (m == Match::no) {
      size_t q = p;
      const Match e = expect(t, &q, kDsSectionEnd);
      if (e == Match::partial) s.open = true;
      else if (e == Match::no || s.calls.empty()) s.bad = true;
      return s;
    }
    ScanCall c;
    scan_deepseek_call(t, &p, &c, &s);
    s.calls.push_back(std::move(c));
    if (!s.calls.back().closed) return s;
    pos = p;
  }
}

std::string call_id(std::string_view prefix, size_t i) {
  std::string id = "call_";
  id += prefix;
  id += '_';
  id += std::to_string(i);
  return id;
}

bool args_ok(const std::string& args) {
  nlohmann::json j = nlohmann::json::parse(args, nullptr, false);
  return !j.is_discarded() && j.is_object();
}

}  // namespace

const char* tool_syntax_name(ToolSyntax s) { return s == ToolSyntax::hermes ? "hermes" : "deepseek_v3"; }

ToolSyntax tool_syntax_of_template(std::string_view src) {
  return src.find(kDsCallBegin) != std::string_view::npos ? ToolSyntax::deepseek_v3 : ToolSyntax::hermes;
}

ParsedToolCalls parse_tool_calls(std::string_view text, ToolSyntax syntax, std::string_view id_prefix,
                                 bool parallel) {
  ParsedToolCalls out;
  const Scan s = scan(text, syntax, /*final=*/true);
  bool ok = !s.bad && !s.calls.empty();
  for (const ScanCall& c : s.calls) ok = ok && c.closed && args_ok(c.args);
  if (!ok) {
    out.content = std::string(text);
    return out;
  }
  out.content = std::string(text.substr(0, s.content_end));
  for (size_t i = 0; i < s.calls.size() && (parallel || i == 0); ++i)
    out.calls.push_back(ToolCall{call_id(id_prefix, i), s.calls[i].name, s.calls[i].args});
  return out;
}

ToolCallStream::ToolCallStream(ToolSyntax syntax, std::string id_prefix, bool parallel)
    : syntax_(syntax), id_prefix_(std::move(id_prefix)), parallel_(parallel) {}

ToolCallStream::Delta ToolCallStream::add(std::string_view text) {
  if (finished_) return {};
  text_ += text;
  return release(false);
}

ToolCallStream::Delta ToolCallStream::finish() {
  if (finished_) return {};
  Delta d = release(true);
  finished_ = true;
  return d;
}

ToolCallStream::Delta ToolCallStream::release(bool final) {
  Delta d;
  const Scan s = scan(text_, syntax_, final);
  // A block that breaks the syntax before any call was released: everything is content.
  if ((s.bad || (final && s.open)) && sent_args_.empty()) {
    const size_t end = final || s.bad ? text_.size() : s.content_safe;
    if (end > sent_content_) d.content = text_.substr(sent_content_, end - sent_content_);
    sent_content_ = std::max(sent_content_, end);
    return d;
  }
  if (s.content_safe > sent_content_) {
    d.content = text_.substr(sent_content_, s.content_safe - sent_content_);
    sent_content_ = s.content_safe;
  }
  for (size_t i = 0; i < s.calls.size() && (parallel_ || i == 0); ++i) {
    const ScanCall& c = s.calls[i];
    if (!c.name_known) break;
    if (i >= sent_args_.size()) {
      ojson item = {{"index", i},
                    {"id", call_id(id_prefix_, i)},
                    {"type", "function"},
                    {"function", {{"name", c.name}, {"arguments", ""}}}};
      d.tool_calls.push_back(std::move(item));
      sent_args_.push_back(0);
    }
    if (c.args.size() > sent_args_[i]) {
      d.tool_calls.push_back({{"index", i}, {"function", {{"arguments", c.args.substr(sent_args_[i])}}}});
      sent_args_[i] = c.args.size();
    }
  }
  return d;
}

Result<std::string> tool_call_gbnf(ToolSyntax syntax, const nlohmann::ordered_json& tools, std::string_view only,
                                   bool parallel) {
  GbnfBuilder b;
  std::string alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    std::string args;
    if (const auto p = fn.find("parameters"); p != fn.end()) {
      auto r = b.add_schema(*p, name + "-args");
      if (!r.ok()) return r.status().with_context("'tools[" + std::to_string(i) + "].function.parameters'");
      args = *r;
    } else {
      args = b.add_any_object();
    }
    std::string body;
    if (syntax == ToolSyntax::hermes)
      body = GbnfBuilder::literal("<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ") + " " + args + " " +
             GbnfBuilder::literal("}\n</tool_call>");
    else
      body = GbnfBuilder::literal(std::string(kDsCallBegin) + "function" + std::string(kDsSep) + name + "\n```json\n") +
             " " + args + " " + GbnfBuilder::literal("\n```" + std::string(kDsCallEnd));
    if (!alts.empty()) alts += " | ";
    alts += b.add_rule("call-" + name, body);
  }
  if (alts.empty()) return invalid_argument("'tool_choice' names a function that is not in 'tools'");
  const std::string call = b.add_rule("call", alts);
  const std::string calls = parallel ? call + " (\"\\n\" " + call + ")*" : call;
  if (syntax == ToolSyntax::hermes) return b.text(calls);
  return b.text(GbnfBuilder::literal(kDsSectionBegin) + " " + calls + " " + GbnfBuilder::literal(kDsSectionEnd));
}

}  // namespace afd::serve
