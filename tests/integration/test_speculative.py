"""Speculative decoding through the CLI (issue 38) on the trained default model
(assets/models/wordnet-dsv3, one MTP layer):

- `afd generate --speculative mtp --draft-tokens 1..3` and `--speculative ngram --draft-tokens 4`
  print the greedy ids of a run without speculation, for a batch of prompts, in reference
  precision and in fast precision with --deterministic, in mono, 1A1F, 2A1F, EP2 and with FFN
  worker processes (--spawn-ffn, and `afd worker --role ffn` processes started here); stderr
  reports the acceptance (so a run that ignored the flags fails too).
- Bad input exits 1 naming the problem, with no crash: --draft-tokens out of range, an unknown
  method, --ngram-min > --ngram-max, --speculative mtp on a model without MTP layers (generate,
  serve, and serve with spawned attention workers).
- `afd serve --deterministic` with `--speculative mtp --draft-tokens 2` or `--speculative ngram
  --draft-tokens 4` answers greedy chat and completion requests, streamed or not, with the text,
  usage and logprobs of a server without speculation, and counts the verifications in /metrics;
  mtp the same through a front end over attention worker processes (--topology 2A1F), which
  must hand the flags to them.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_speculative.py
"""
import json
import re
import urllib.request

import pytest

from afd_bundle import TIMEOUT, Bundle, Proc, free_ports
from afd_cli import ROOT, afd, made

MODEL = ROOT / "assets/models/wordnet-dsv3"
# The trained model's golden prompts (tests/reference/trained/wordnet-dsv3.json) and a third that
# repeats itself (n-gram matches in the prompt).
PROMPTS = [[4090, 4092, 295, 321, 2523, 3020, 294, 63, 4093], [4090, 359, 1427, 990, 1810, 268],
           [4090, 359, 1427, 990, 1810, 268, 4090, 359]]
MAX_TOKENS = 40
SPECS = [("mtp", 1), ("mtp", 2), ("mtp", 3), ("ngram", 4)]
ACCEPTANCE = re.compile(r"afd generate: speculative (\w+): (\d+) drafts proposed, (\d+) accepted")
PRECISIONS = {"reference": ["--precision", "reference"],
              "fast-deterministic": ["--precision", "fast", "--deterministic"]}
TOPOLOGIES = {"mono": [], "1A1F": ["--topology", "1A1F"], "2A1F": ["--topology", "2A1F", "--microbatches", "2"],
              "EP2": ["--topology", "EP2"]}
CRASH = ("terminate called", "Segmentation", "Aborted", "InternalError", "core dumped")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("speculative")


def generate(*args, ignore_eos=True):
    """(the ids `afd generate` prints for PROMPTS, one list per prompt; its stderr)."""
    ids = [a for p in PROMPTS for a in ("--prompt-ids", ",".join(map(str, p)))]
    r = afd("--log-level", "error", "generate", "--model", MODEL, "--max-tokens", MAX_TOKENS,
            *(["--ignore-eos"] if ignore_eos else []), *ids, *args)
    assert r.returncode == 0, r.stderr[-2000:]
    out = [list(map(int, line.split(","))) for line in r.stdout.split()]
    assert len(out) == len(PROMPTS), r.stdout
    assert not ignore_eos or all(len(t) == MAX_TOKENS for t in out), r.stdout
    return out, r.stderr


def first_difference(want, got):
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            j = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
            return f"prompt {i} token {j}: {b[j]} instead of {a[j]}"
    return None


def check_every_method(*args):
    """Greedy ids with each of SPECS equal those without speculation, and each run reports its
    acceptance: drafts proposed and some accepted."""
    want, err = generate(*args)
    assert not ACCEPTANCE.search(err), err
    for method, k in SPECS:
        got, err = generate(*args, "--speculative", method, "--draft-tokens", str(k))
        assert got == want, f"--speculative {method} --draft-tokens {k}: {first_difference(want, got)}"
        m = ACCEPTANCE.search(err)
        assert m, f"--speculative {method}: no acceptance line in\n{err[-2000:]}"
        proposed, accepted = int(m.group(2)), int(m.group(3))
        assert m.group(1) == method and 0 < accepted <= proposed <= k * MAX_TOKENS * len(PROMPTS), m.group(0)


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_generate_greedy_equals_plain(precision, topology):
    check_every_method(*PRECISIONS[precision], *TOPOLOGIES[topology], "--threads", "1")


def test_generate_stops_at_eos_as_without():
    """Each prompt stops at its EOS, at different steps (no accepted draft after EOS is printed;
    the others go on)."""
    want, _ = generate("--precision", "reference", "--threads", "1", ignore_eos=False)
    eos = json.load(open(MODEL / "generation_config.json"))["eos_token_id"]
    assert all(t[-1] == eos for t in want) and len({len(t) for t in want}) > 1, want
    for method, k in (("mtp", 3), ("ngram", 8)):
        got, err = generate("--precision", "reference", "--threads", "1", "--speculative", method, "--draft-tokens", k,
                            ignore_eos=False)
        assert got == want, f"--speculative {method}: {got}"
        assert ACCEPTANCE.search(err), err


@pytest.mark.parametrize("precision", PRECISIONS)
def test_generate_with_spawned_ffn_workers(precision):
    check_every_method(*PRECISIONS[precision], "--topology", "1A2F", "--microbatches", "2", "--spawn-ffn",
                       "--threads", "1")


def test_generate_with_ffn_worker_processes(tmp):
    """Two `afd worker --role ffn` processes serve one `afd generate` after another."""
    ports = free_ports(2)
    workers = [Proc(["--log-level", "warn", "worker", "--role", "ffn", "--model", MODEL, "--listen",
                     f"127.0.0.1:{port}", "--shard", f"{i}/2", "--attention", "1", "--precision", "fast",
                     "--deterministic", "--threads", "1"], tmp, f"ffn{i}") for i, port in enumerate(ports)]
    try:
        check_every_method("--precision", "fast", "--deterministic", "--threads", "1", "--microbatches", "2", "--ffn",
                           ",".join(f"127.0.0.1:{p}" for p in ports))
    finally:
        for w in workers:
            w.close()


def model_without_mtp(tmp):
    """A DeepSeek-V3 checkpoint with no MTP layer (num_nextn_predict_layers 0) and a tokenizer."""
    d = made(tmp, "no-mtp", "--arch", "deepseek_v3", "--preset", "tiny", "--vocab", "320")
    assert json.load(open(d / "config.json"))["num_nextn_predict_layers"] == 0
    return d


def assert_refused(r, message):
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert message in r.stderr, r.stderr[-2000:]
    assert not any(c in r.stderr for c in CRASH), r.stderr[-2000:]


BAD = {
    "mtp-k0": (["--speculative", "mtp", "--draft-tokens", "0"],
               "--draft-tokens must be in [1, 3] for --speculative mtp, got 0"),
    "ngram-k0": (["--speculative", "ngram", "--draft-tokens", "0"],
                 "--draft-tokens must be in [1, 8] for --speculative ngram, got 0"),
    "mtp-k4": (["--draft-tokens", "4", "--speculative", "mtp"],
               "--draft-tokens must be in [1, 3] for --speculative mtp, got 4"),
    "ngram-k9": (["--draft-tokens", "9", "--speculative", "ngram"],
                 "--draft-tokens must be in [1, 8] for --speculative ngram, got 9"),
    "bogus": (["--speculative", "bogus"], "--speculative must be none, ngram or mtp, got 'bogus'"),
    "ngram-min-max": (["--speculative", "ngram", "--ngram-min", "3", "--ngram-max", "2"],
                      "--ngram-min / --ngram-max must satisfy 1 <= min <= max <= 16, got 3 / 2"),
}


@pytest.mark.parametrize("case", BAD)
def test_generate_refuses_bad_flags(case):
    args, message = BAD[case]
    r = afd("--log-level", "error", "generate", "--model", MODEL, "--prompt-ids", "1,2,3", "--max-tokens", "4", *args)
    assert_refused(r, message)
    assert r.stdout == ""


@pytest.mark.parametrize("case", ["mtp-k4", "bogus"])
def test_serve_refuses_bad_flags(case):
    args, message = BAD[case]
    r = afd("--log-level", "error", "serve", "--model", MODEL, "--port", "0", *args, timeout=60)
    assert_refused(r, message)


NO_MTP = "--speculative mtp: the model has no MTP module (config.json num_nextn_predict_layers is 0)"


def test_mtp_refused_without_mtp_layers(tmp):
    d = model_without_mtp(tmp)
    r = afd("--log-level", "error", "generate", "--model", d, "--prompt-ids", "1,2,3", "--max-tokens", "4",
            "--speculative", "mtp")
    assert_refused(r, NO_MTP)
    assert r.stdout == ""
    r = afd("--log-level", "error", "serve", "--model", d, "--port", "0", "--speculative", "mtp", timeout=60)
    assert_refused(r, NO_MTP)
    # The front end's attention worker processes refuse it (they get the flag) and so does the front end.
    r = afd("--log-level", "error", "serve", "--model", d, "--port", "0", "--speculative", "mtp", "--topology", "2A1F",
            "--threads", "1", timeout=60)
    assert_refused(r, NO_MTP)
    assert "before the bundle came up" in r.stderr, r.stderr[-2000:]
    # n-gram drafts need no MTP layer.
    r = afd("--log-level", "error", "generate", "--model", d, "--prompt-ids", "1,2,1,2,1", "--max-tokens", "4",
            "--speculative", "ngram", "--draft-tokens", "2")
    assert r.returncode == 0, r.stderr[-2000:]


# ---- afd serve ------------------------------------------------------------------------------

WORDS = json.load(open(MODEL / "chat_eval.json"))["words"][:3]
QUESTION = json.load(open(MODEL / "chat_eval.json"))["question"]


def requests():
    """(path, body) of greedy requests: chat questions and a completion that ignores EOS."""
    out = [("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION.format(w=w)}],
                                     "max_tokens": 32, "temperature": 0}) for w in WORDS]
    out[0][1].update(logprobs=True, top_logprobs=2)
    out.append(("/v1/completions", {"prompt": "A volt is", "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                                    "logprobs": 2}))
    return out


def answer(bundle, path, body):
    """What must be equal with and without speculation: the text, finish reason, usage and
    logprobs (--deterministic makes them bit-identical)."""
    status, text = bundle.post(path, body)
    assert status == 200, text
    j = json.loads(text)
    c = j["choices"][0]
    return (c["message"]["content"] if "chat" in path else c["text"]), c["finish_reason"], j["usage"], c["logprobs"]


def streamed(bundle, path, body):
    """The same from a streamed request: the pieces joined, the last finish reason, the usage chunk."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(f"http://127.0.0.1:{bundle.port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    text, fin, usage, done, chunks = "", None, None, False, 0
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            j = json.loads(line[6:])
            assert "error" not in j, j
            chunks += 1
            usage = j.get("usage") or usage
            for c in j.get("choices", []):
                text += (c.get("delta", {}).get("content") or "") if "chat" in path else c["text"]
                fin = c.get("finish_reason") or fin
    assert done and chunks > 1, (done, chunks)
    return text, fin, usage


def serve(tmp, name, *args, ready="on http://"):
    return Bundle(MODEL, tmp, ["--deterministic", "--threads", "2", *args], name=name, ready=ready)


@pytest.fixture(scope="module")
def plain_answers(tmp):
    """The answers of a server without speculation (mono; --afd-rounding 1 as a 2A1F bundle
    rounds, so --deterministic makes them that bundle's too)."""
    b = serve(tmp, "plain", "--afd-rounding", "1")
    try:
        out = [answer(b, p, body) for p, body in requests()]
        assert out[0][3] and out[-1][3], "logprobs asked for"
        assert all(usage["completion_tokens"] >= 8 for _, _, usage, _ in out), out
        assert b.metric("afd_spec_decode_verifications_total") == 0
        return out
    finally:
        b.close()


def check_speculative_server(b, want, k):
    for (path, body), w in zip(requests(), want):
        assert answer(b, path, body) == w, (path, body)
        assert streamed(b, path, body) == w[:3], (path, body)
    verified, accepted = b.metric("afd_spec_decode_verifications_total"), b.metric(
        "afd_spec_decode_accepted_tokens_total")
    assert verified > 0 and accepted > 0, (verified, accepted)
    assert b.metric("afd_spec_decode_draft_tokens_total") <= k * verified


@pytest.mark.parametrize("method,k", [("mtp", 2), ("ngram", 4)])
def test_serve_answers_as_without(tmp, plain_answers, method, k):
    b = serve(tmp, method, "--afd-rounding", "1", "--speculative", method, "--draft-tokens", str(k))
    try:
        check_speculative_server(b, plain_answers, k)
    finally:
        b.close()


def test_serve_attention_worker_processes_mtp_answers_as_without(tmp, plain_answers):
    b = serve(tmp, "mtp-2a1f", "--speculative", "mtp", "--draft-tokens", "2", "--topology", "2A1F",
              ready="bundle complete")
    try:
        attention = [argv for _, argv in b.children() if "attention" in argv]
        assert len(attention) == 2, b.children()
        for argv in attention:
            assert argv[argv.index("--speculative") + 1] == "mtp" and argv[argv.index("--draft-tokens") + 1] == "2"
        check_speculative_server(b, plain_answers, 2)
    finally:
        b.close()
