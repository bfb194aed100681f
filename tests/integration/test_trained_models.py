"""afd's shipped trained models (assets/models/wordnet-dsv3, wordnet-step3) through the CLI,
against the f64 reference's golden data (tests/reference/trained/, written by
tests/reference/make_golden_trained.py):
  * `afd eval --precision reference` over the held-out sample scores the golden's tokens with the
    golden's perplexity to 0.1 % (and, with --mtp, the MTP module's top-1 on the token after next);
  * `afd generate --precision reference` gives the golden greedy tokens of a chat and a text prompt;
  * fast precision stays within 1 % of the reference perplexity, the FP8 twin (`afd quantize --fp8`)
    within 2 % of bf16;
  * every in-process AFD wiring gives the monolithic engine's numbers with the wire's rounding;
  * `afd serve` on the default model answers chat questions about held-out words in English.
So an engine change that hurts these models' quality fails here.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_trained_models.py
"""
import functools
import json
import re
import socket
import subprocess
import time
import urllib.request

import pytest

from afd_bundle import AFD, TIMEOUT
from afd_cli import ROOT, afd

MODELS = ["wordnet-dsv3", "wordnet-step3"]
# The kernels' ISA level this run uses (`afd version` prints the CPU features AFD_CPU_DISABLE leaves).
HAS_AVX512 = "avx512f" in afd("version").stdout
GOLDEN = ROOT / "tests/reference/trained"


def model_dir(name):
    return ROOT / "assets/models" / name


def golden(name):
    return json.load(open(GOLDEN / f"{name}.json"))


def evaluate(name, *args, model=None):
    r = afd("--log-level", "error", "eval", "--model", model or model_dir(name), "--text",
            model_dir(name) / "eval-sample.txt", "--json", *args, timeout=3 * TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", MODELS)
def test_reference_perplexity_matches_oracle(name):
    g = golden(name)
    mtp = "mtp_top1" in g
    e = evaluate(name, "--precision", "reference", *(["--mtp"] if mtp else []))
    assert e["documents"] == g["documents"]
    assert e["tokens"] == g["tokens"], "afd's tokenizer and the trainer's give different ids"
    assert abs(e["perplexity"] / g["perplexity"] - 1) <= 1e-3, (e, g["perplexity"])
    if mtp:  # the MTP module's predictions of the token after next: at most two argmax flips
        assert e["mtp_tokens"] == g["mtp_tokens"]
        assert abs(e["mtp_top1_accuracy"] - g["mtp_top1"]) * g["mtp_tokens"] <= 2.5, (e, g["mtp_top1"])


@pytest.mark.parametrize("name", MODELS)
def test_greedy_matches_oracle(name):
    g = golden(name)
    args = [a for p in g["prompts"] for a in ("--prompt-ids", ",".join(map(str, p)))]
    r = afd("--log-level", "error", "generate", "--model", model_dir(name), "--precision", "reference",
            "--max-tokens", len(g["greedy_tokens"][0]), "--ignore-eos", *args, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [list(map(int, l.split(","))) for l in r.stdout.split()] == g["greedy_tokens"]


@pytest.mark.parametrize("name", MODELS)
def test_fast_and_fp8_perplexity(name, tmp_path):
    g = golden(name)
    fast = evaluate(name, "--precision", "fast")
    assert abs(fast["perplexity"] / g["perplexity"] - 1) <= 0.01, (fast, g["perplexity"])
    r = afd("--log-level", "error", "quantize", "--fp8", "--model", model_dir(name), "--out", tmp_path / "fp8")
    assert r.returncode == 0, r.stderr[-2000:]
    fp8 = evaluate(name, "--precision", "fast", model=tmp_path / "fp8")
    assert fp8["tokens"] == fast["tokens"]
    assert abs(fp8["perplexity"] / fast["perplexity"] - 1) <= 0.02, (fp8, fast)


@functools.lru_cache(maxsize=None)
def mono_evaluation(name, precision, rounding, mb, det):
    """The monolithic engine's numbers with a wiring's rounding, once per set of flags (1A1F and
    2A1F compare with the same ones)."""
    return evaluate(name, "--precision", precision, "--afd-rounding", rounding, "--microbatches", mb, *det)


@pytest.mark.parametrize("topology,rounding,mb", [("1A1F", "1", "3"), ("2A1F", "1", "3"), ("1A2F", "2", "3"),
                                                ("EP2", "2", "1")])
@pytest.mark.parametrize("precision", ["reference", "fast"])
@pytest.mark.parametrize("name", MODELS)
def test_afd_wirings_give_mono(name, precision, topology, rounding, mb):
    """Bit for bit with --deterministic in both precisions. Without it, the products are exact
    where each forward call holds the same documents as mono's (1A1F, 1A2F); two attention
    engines split the documents between them (2A1F, EP2), so each call holds other documents
    than mono's, and products whose summation order depends on the batch differ in the last
    bits: the default fast paths' bf16 products, and without AVX-512 reference precision's f32
    products too (from 64 tokens on they go to OpenBLAS sgemm, LinearOrder::fastest). There the
    NLL agrees to 1e-5 (5e-5 without AVX-512, where the fast path's large products are sgemm's
    as well) and at most two argmax choices differ."""
    for det in ([], ["--deterministic"]):
        want = mono_evaluation(name, precision, rounding, mb, tuple(det))
        got = evaluate(name, "--precision", precision, "--topology", topology, "--microbatches", mb, *det)
        assert got["tokens"] == want["tokens"]
        split = topology.startswith("2A") or topology.startswith("EP")
        if split and not det and (precision == "fast" or not HAS_AVX512):
            assert abs(got["nll_mean"] / want["nll_mean"] - 1) <= (1e-5 if HAS_AVX512 else 5e-5), (got, want)
            assert abs(got["top1_accuracy"] - want["top1_accuracy"]) * want["tokens"] <= 2.5, (got, want)
        else:
            assert (got["nll_mean"], got["top1_accuracy"]) == (want["nll_mean"], want["top1_accuracy"]), (det, got, want)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_default_model_answers_in_english():
    """scripts/serve.sh's default model, asked what held-out words mean (greedy, 32 tokens):
    at least 90 % of the answer words are in Debian's wamerican list."""
    spec = json.load(open(model_dir("wordnet-dsv3") / "chat_eval.json"))
    english = {w.strip().lower() for w in open("/usr/share/dict/words", errors="ignore")}
    port = free_port()
    proc = subprocess.Popen([AFD, "--log-level", "error", "serve", "--model", model_dir("wordnet-dsv3"), "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + TIMEOUT
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "afd serve did not come up"
                time.sleep(0.2)
        words = ok = 0
        for w in spec["words"]:
            body = {"messages": [{"role": "user", "content": spec["question"].format(w=w)}], "max_tokens": 32,
                    "temperature": 0}
            req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            text = json.load(urllib.request.urlopen(req, timeout=TIMEOUT))["choices"][0]["message"]["content"]
            ws = re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)?", text)
            assert ws, f"no words in the answer about {w!r}: {text!r}"
            words += len(ws)
            ok += sum(x.lower() in english for x in ws)
        assert ok / words >= 0.9, f"{ok} of {words} answer words are English"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("name", MODELS)
def test_trainer_forward_matches_oracle(name):
    """The trainer's PyTorch forward (scripts/train/model.py), loaded with the shipped bf16 weights,
    gives the f64 reference's logits (and the MTP module's) on a held-out document: the model that
    was trained is the model afd serves."""
    import sys
    import numpy as np
    import torch
    sys.path[:0] = [str(ROOT / "scripts/train"), str(ROOT / "tests/reference")]
    import mla_mfa_ref as ref
    import model as trainer
    import safetensors_io as st
    import tokenizer as tk
    d = model_dir(name)
    oracle = ref.Model.from_dir(d, mla_form="absorbed", load_mtp=name == "wordnet-dsv3")
    m = trainer.Model(json.load(open(d / "config.json")), seed=0)
    weights = st.load_dir(d)

    def tensor(k):  # Step-3's experts are stacked [E, out, in] on disk, per expert in the trainer
        if k in weights:
            return weights[k].to_f64()
        stem, e, proj = k.rsplit(".", 3)[0].rsplit(".experts", 1)[0], k.split(".")[-3], k.split(".")[-2]
        return weights[f"{stem}.{proj}.weight"].to_f64()[int(e)]
    for k in m.P:
        m.P[k].data = torch.tensor(tensor(k), dtype=torch.float32)
    tok = tk.Tokenizer.read(d)
    doc = open(d / "eval-sample.txt").read().split("\n\n")[0]
    s = [tok.bos] + tok.encode(doc)
    with torch.no_grad():
        logits, h = m.forward(torch.tensor([s]))
    want, hidden = oracle.forward([(oracle.new_sequence(), s)], return_hidden=True)
    scale = float(np.max(np.abs(want[0])))
    assert float(np.max(np.abs(logits[0].numpy() - want[0]))) <= 1e-4 * scale
    if oracle.mtp is not None:
        with torch.no_grad():
            ml = m.mtp_forward(h[:, :-1], torch.tensor([s[1:]]))
        want_mtp = oracle.mtp_forward(oracle.new_mtp_sequence(), hidden[0][:-1], s[1:])
        assert float(np.max(np.abs(ml[0].numpy() - want_mtp))) <= 1e-4 * float(np.max(np.abs(want_mtp)))
