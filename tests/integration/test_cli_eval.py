"""`afd eval` end to end: the JSON report of a tiny model over a small text is sane; in reference
precision its mean NLL and top-1 accuracy are the float64 oracle's (hf_moe_ref / mla_mfa_ref,
teacher-forced on the token ids eval dumps), whole documents and sliding windows alike, and so
are --mtp's numbers for DeepSeek's MTP module (mla_mfa_ref mtp_forward, bf16 and FP8); an AFD
bundle gives exactly the mono result with the same rounding; and bad input exits 1 with a
message, never a crash.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_eval.py
"""
import json
import math
import random
import sys

import numpy as np
import pytest

from afd_cli import ROOT, afd, made

sys.path.insert(0, str(ROOT / "tests/reference"))
import mla_mfa_ref  # noqa: E402
import reference  # noqa: E402

WORDS = ("the engine reads the model from disk and answers requests from many users at the same time each "
         "request is a sequence of tokens Hello! How are you today? 1, 2, 3, 10, 42").split()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("eval")


@pytest.fixture(scope="module")
def text(tmp):
    """Five documents of 3 to 60 words separated by blank lines (plus stray whitespace)."""
    rng = random.Random(7)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))) for _ in range(5)]
    p = tmp / "corpus.txt"
    p.write_text("\n\n".join(docs) + "\n\n\n")
    return p


def model(tmp, arch):
    return made(tmp, arch, "--arch", arch, "--preset", "tiny", "--seed", "3")


def evaluate(*args):
    r = afd("--log-level", "error", "eval", "--json", *args)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def windows_of(n_tokens, window, stride):
    """[(begin, end, score_begin)]: the sliding windows of a document (runtime/perplexity.h)."""
    if window is None or n_tokens <= window:
        return [(0, n_tokens, 1)] if n_tokens >= 2 else []
    out, prev_end, begin = [], 0, 0
    while begin < n_tokens:
        end = min(begin + window, n_tokens)
        if max(prev_end, begin + 1) < end:
            out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens:
            break
        begin += stride
    return out


class Tally:
    def __init__(self):
        self.nll, self.top1, self.n = 0.0, 0, 0

    def add(self, row, target):
        row = np.asarray(row, dtype=np.float64)
        self.nll += row.max() + math.log(np.exp(row - row.max()).sum()) - row[target]
        self.top1 += int(np.argmax(row) == target)
        self.n += 1

    def result(self):
        return self.nll / self.n, self.top1 / self.n, self.n


def oracle_scores(model_dir, docs, window=None, stride=None, mtp=False):
    """(mean NLL, top-1 accuracy, tokens) of the documents (token id lists) by the float64
    oracle: each document (or each sliding window, scoring what the previous window did not) is
    a fresh sequence run teacher-forced. mtp: the same for the MTP module's predictions of the
    token after next (mla_mfa_ref mtp_forward), from each window's third token on."""
    m = mla_mfa_ref.Model.from_dir(str(model_dir), load_mtp=True) if mtp else reference.load_model(str(model_dir))
    main, head = Tally(), Tally()
    for doc in docs:
        for begin, end, score_begin in windows_of(len(doc), window, stride):
            toks = doc[begin:end]
            out = m.forward([(m.new_sequence(), toks)], return_hidden=True) if mtp else (m.forward(
                [(m.new_sequence(), toks)]), None)
            logits = out[0][0]
            for t in range(score_begin, end):
                main.add(logits[t - 1 - begin], doc[t])
            if mtp and len(toks) >= 2:
                ml = m.mtp_forward(m.new_mtp_sequence(), out[1][0][:-1], toks[1:])
                for t in range(max(score_begin, begin + 2), end):
                    head.add(ml[t - 2 - begin], doc[t])
    return head.result() if mtp else main.result()


def dumped(path):
    return [[int(x) for x in line.split(",")] for line in open(path).read().splitlines() if line]


def test_json_fields_are_sane(tmp, text):
    r = evaluate("--model", model(tmp, "qwen3_moe"), "--text", text, "--dump-tokens", tmp / "q.ids")
    docs = dumped(tmp / "q.ids")
    assert r["documents"] == len(docs) == 5
    assert r["tokens"] == sum(len(d) - 1 for d in docs)
    assert 0 < r["nll_mean"] < 20
    assert r["perplexity"] == pytest.approx(math.exp(r["nll_mean"]), rel=1e-12)
    assert 0 <= r["top1_accuracy"] <= 1
    assert r["seconds"] > 0
    assert r["window"] == 1024 and r["stride"] == 512 and r["add_bos"] is False
    # The human table carries the same numbers.
    h = afd("--log-level", "error", "eval", "--model", model(tmp, "qwen3_moe"), "--text", text)
    assert h.returncode == 0 and "perplexity" in h.stdout and str(r["tokens"]) in h.stdout, h.stdout


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
@pytest.mark.parametrize("windows", [None, (12, 5)], ids=["whole", "windows"])
def test_reference_precision_equals_the_oracle(tmp, text, arch, windows):
    extra = ["--window", windows[0], "--stride", windows[1]] if windows else []
    ids = tmp / f"{arch}_{bool(windows)}.ids"
    r = evaluate("--model", model(tmp, arch), "--text", text, "--precision", "reference", "--dump-tokens", ids, *extra)
    nll, top1, n = oracle_scores(model(tmp, arch), dumped(ids), *(windows or ()))
    assert r["tokens"] == n
    assert r["nll_mean"] == pytest.approx(nll, rel=1e-4)
    assert abs(r["top1_accuracy"] - top1) <= 1.0 / n + 1e-12  # a near-tie may flip one argmax


def mtp_model(tmp, dtype):
    return made(tmp, f"ds_mtp_{dtype}", "--arch", "deepseek_v3", "--preset", "tiny", "--mtp", "1", "--seed", "5",
                "--dtype", dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("windows", [None, (12, 5)], ids=["whole", "windows"])
def test_mtp_module_equals_the_oracle(tmp, text, dtype, windows):
    extra = ["--window", windows[0], "--stride", windows[1]] if windows else []
    ids = tmp / f"mtp_{dtype}_{bool(windows)}.ids"
    r = evaluate("--model", mtp_model(tmp, dtype), "--text", text, "--precision", "reference", "--mtp",
                 "--dump-tokens", ids, *extra)
    nll, top1, n = oracle_scores(mtp_model(tmp, dtype), dumped(ids), *(windows or (None, None)), mtp=True)
    assert r["mtp_tokens"] == n
    assert r["mtp_nll_mean"] == pytest.approx(nll, rel=1e-4)
    assert abs(r["mtp_top1_accuracy"] - top1) <= 1.0 / n + 1e-12
    # The main model's numbers are those of a run without --mtp.
    plain = evaluate("--model", mtp_model(tmp, dtype), "--text", text, "--precision", "reference", *extra)
    assert (plain["nll_mean"], plain["tokens"]) == (r["nll_mean"], r["tokens"])


def test_mtp_through_an_afd_bundle_equals_mono(tmp, text):
    base = ["--model", mtp_model(tmp, "bf16"), "--text", text, "--mtp", "--window", "24", "--stride", "16"]
    a = evaluate(*base, "--topology", "1A1F")
    m = evaluate(*base, "--afd-rounding", "1", "--microbatches", "3")
    for k in ("nll_mean", "top1_accuracy", "mtp_tokens", "mtp_nll_mean", "mtp_top1_accuracy"):
        assert a[k] == m[k], (k, a, m)


def test_add_bos_and_separator(tmp, text):
    m = model(tmp, "qwen3_moe")
    plain = evaluate("--model", m, "--text", text, "--dump-tokens", tmp / "plain.ids")
    bos = evaluate("--model", m, "--text", text, "--add-bos", "true", "--dump-tokens", tmp / "bos.ids")
    cfg = json.load(open(m / "config.json"))
    assert all(b == [cfg["bos_token_id"]] + p for b, p in zip(dumped(tmp / "bos.ids"), dumped(tmp / "plain.ids")))
    assert bos["tokens"] == plain["tokens"] + plain["documents"] and bos["add_bos"] is True
    one = evaluate("--model", m, "--text", text, "--separator", "none")
    assert one["documents"] == 1
    custom = tmp / "custom.txt"
    custom.write_text("first doc here\n---\nsecond doc here\n---\n\n")
    assert evaluate("--model", m, "--text", custom, "--separator", "\\n---\\n")["documents"] == 2


@pytest.mark.parametrize("precision", ["fast", "reference"])
def test_afd_bundle_equals_mono_with_its_rounding(tmp, text, precision):
    m = model(tmp, "qwen3_moe")
    base = ["--model", m, "--text", text, "--precision", precision, "--window", "24", "--stride", "16"]
    afd_run = evaluate(*base, "--topology", "1A1F")
    mono = evaluate(*base, "--afd-rounding", "1", "--microbatches", "3")
    for k in ("tokens", "nll_mean", "top1_accuracy"):
        assert afd_run[k] == mono[k], (k, afd_run, mono)
    two = evaluate(*base, "--topology", "1A2F")
    mono2 = evaluate(*base, "--afd-rounding", "2", "--microbatches", "3")
    assert (two["nll_mean"], two["top1_accuracy"]) == (mono2["nll_mean"], mono2["top1_accuracy"])


def fails(tmp, *args, message):
    r = afd("eval", *args)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert message in r.stderr, r.stderr[-2000:]
    assert "terminate" not in r.stderr and "Aborted" not in r.stderr


def test_bad_input_exits_1_with_a_message(tmp, text):
    m = model(tmp, "qwen3_moe")
    fails(tmp, "--model", m, "--text", tmp / "absent.txt", message="absent.txt: cannot open for reading")
    (tmp / "empty.txt").write_text("")
    fails(tmp, "--model", m, "--text", tmp / "empty.txt", message="empty.txt: empty")
    (tmp / "blank.txt").write_text(" \n\n \n")
    fails(tmp, "--model", m, "--text", tmp / "blank.txt", message="blank.txt: empty")
    (tmp / "nul.txt").write_bytes(b"hello\x00world")
    fails(tmp, "--model", m, "--text", tmp / "nul.txt", message="binary or not UTF-8 (a NUL byte at byte offset 5)")
    (tmp / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    fails(tmp, "--model", m, "--text", tmp / "latin1.txt", message="binary or not UTF-8 (invalid UTF-8 at byte offset 3)")
    (tmp / "one.txt").write_text("a\n")
    fails(tmp, "--model", m, "--text", tmp / "one.txt", message="fewer than two tokens")
    fails(tmp, "--model", tmp / "no_model", "--text", text, message="no_model")
    # A directory with a config and a tokenizer but no weights.
    broken = tmp / "broken"
    broken.mkdir(exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / f).write_bytes((m / f).read_bytes())
    fails(tmp, "--model", broken, "--text", text, message="safetensors")
    fails(tmp, "--model", m, "--text", text, "--window", "5000", message="longer than the model's context")
    fails(tmp, "--model", m, "--text", text, "--window", "8", "--stride", "9", message="stride 9")
    fails(tmp, "--model", m, "--text", text, "--separator", "\\q", message="unknown escape")
    fails(tmp, "--model", m, "--text", text, "--add-bos", "maybe", message="--add-bos 'maybe'")
    fails(tmp, "--model", m, "--text", text, "--mtp", message="has no MTP module (config.json num_nextn_predict_layers is 0)")
