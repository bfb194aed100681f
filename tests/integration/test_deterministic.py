"""--deterministic through the CLI (docs/ARCHITECTURE.md "Batch invariance"): in fast precision a
target prompt's logits rows (`afd generate --dump-logits`: every prompt position, then every
generated step) are bit-identical whether it is generated alone in mono on one thread or in a
batch with other prompts of other lengths, on other thread counts, in in-process bundles and
with FFN worker processes over UCX (`--spawn-ffn`), for the MLA (DeepSeek-V3), GQA (Qwen3-MoE)
and MFA (Step-3) families. AFD wirings are compared with mono at the same --afd-rounding.
Bad combinations are refused at start-up.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_deterministic.py
"""
import json

import numpy as np
import pytest

from afd_bundle import TIMEOUT, Bundle
from afd_cli import afd, made

MAX_TOKENS = 6
TARGET = [5, 17, 29, 3, 88, 41, 7, 7, 60, 12, 31, 99, 4, 18, 27, 33, 50, 61, 70, 21, 9, 14, 80]
OTHERS = [[11, 12, 13], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
                         63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75], [90]]
FAMILIES = {"deepseek_v3": [], "qwen3_moe": [], "step3_text": []}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("deterministic")


def model(tmp, arch):
    return made(tmp, arch, "--arch", arch, "--preset", "tiny", "--vocab", "128")


def target_rows(tmp, arch, prompts, tag, *args, timeout=TIMEOUT):
    """The target's logits rows [len(TARGET) + MAX_TOKENS - 1, vocab] from one `afd generate` run
    of `prompts` (TARGET among them)."""
    dump = tmp / f"{arch}-{tag}.bin"
    ids = []
    for p in prompts:
        ids += ["--prompt-ids", ",".join(map(str, p))]
    r = afd("--log-level", "error", "generate", "--model", model(tmp, arch), "--precision", "fast",
            "--deterministic", "--max-tokens", MAX_TOKENS, "--ignore-eos", *ids, "--dump-logits", dump, *args,
            timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = np.fromfile(dump, dtype=np.float32)
    per = [len(p) + MAX_TOKENS - 1 for p in prompts]
    rows = rows.reshape(sum(per), -1)
    at = sum(per[:prompts.index(TARGET)])
    return rows[at:at + per[prompts.index(TARGET)]]


def assert_same_bits(want, got):
    assert want.shape == got.shape
    same = want.view(np.uint32) == got.view(np.uint32)
    assert same.all(), f"rows differ first at {np.argwhere(~same)[0]}, max |diff| {np.abs(want - got).max()}"


@pytest.mark.parametrize("arch", FAMILIES)
def test_mono_batch_and_threads(tmp, arch):
    want = target_rows(tmp, arch, [TARGET], "alone", "--threads", "1")
    for threads in ("1", "2"):
        got = target_rows(tmp, arch, [OTHERS[0], TARGET, OTHERS[1], OTHERS[2]], f"batch{threads}", "--threads", threads)
        assert_same_bits(want, got)


@pytest.mark.parametrize("arch", FAMILIES)
def test_in_process_bundles(tmp, arch):
    want = target_rows(tmp, arch, [TARGET], "alone-r2", "--threads", "1", "--afd-rounding", "2")
    for topology, mb in (("1A2F", "3"), ("2A2F", "2"), ("EP2", "1")):
        got = target_rows(tmp, arch, [OTHERS[1], TARGET, OTHERS[0]], f"{topology}", "--topology", topology,
                          "--microbatches", mb)
        assert_same_bits(want, got)


@pytest.mark.parametrize("arch", ["deepseek_v3", "qwen3_moe"])
def test_ffn_worker_processes(tmp, arch):
    """Two FFN worker processes over UCX, with other prompts batched in, equal mono alone."""
    want = target_rows(tmp, arch, [TARGET], "alone-r2", "--threads", "1", "--afd-rounding", "2")
    got = target_rows(tmp, arch, [OTHERS[2], OTHERS[1], TARGET], "spawned", "--topology", "1A2F", "--microbatches",
                      "2", "--spawn-ffn", timeout=3 * TIMEOUT)
    assert_same_bits(want, got)


def test_serve_reports_the_mode_and_answers_alike(tmp):
    """`afd serve --deterministic`: /health and every response carry the mode and the
    system_fingerprint, and a greedy request's tokens and logprobs are the same when it is asked
    again with its prompt's whole blocks in the prefix cache. (Batching with other requests is
    covered without timing at the engine level: test_batch_invariance.)"""
    served = made(tmp, "qwen3_moe-served", "--arch", "qwen3_moe", "--preset", "tiny", "--vocab", "320")  # + tokenizer
    b = Bundle(served, tmp, ["--precision", "fast", "--deterministic", "--threads", "2", "--max-batch-tokens", "40"],
               name="serve-det", ready="on http://")
    try:
        body = {"prompt": TARGET * 2, "max_tokens": 8, "temperature": 0, "logprobs": 3}

        def ask(request):
            status, text = b.post("/v1/completions", request)
            assert status == 200, text
            return json.loads(text)

        first = ask(body)
        assert first["system_fingerprint"].startswith("fp_")
        health = json.loads(b.get("/health")[1])
        assert health["deterministic"] is True and health["system_fingerprint"] == first["system_fingerprint"]
        assert 'afd_numerics_info{system_fingerprint="' + first["system_fingerprint"] + '",deterministic="1"} 1' in \
            b.get("/metrics")[1]
        again = ask(body)
        assert again["choices"][0]["logprobs"] == first["choices"][0]["logprobs"]
        assert b.metric("afd_prefix_cache_hits_total") > 0
    finally:
        b.close()


def test_serve_in_reference_precision_reports_batch_invariance(tmp):
    """Reference precision is batch-invariant without --deterministic: /health and /metrics say
    so, and the fingerprint is the one the flag would give (the numbers are the same)."""
    served = made(tmp, "qwen3_moe-served", "--arch", "qwen3_moe", "--preset", "tiny", "--vocab", "320")
    fingerprints = []
    for flags in (["--precision", "reference"], ["--precision", "reference", "--deterministic"]):
        b = Bundle(served, tmp, flags + ["--threads", "2"], name="serve-ref", ready="on http://")
        try:
            health = json.loads(b.get("/health")[1])
            assert health["deterministic"] is True, health
            assert 'deterministic="1"} 1' in b.get("/metrics")[1]
            fingerprints.append(health["system_fingerprint"])
        finally:
            b.close()
    assert fingerprints[0] == fingerprints[1]


def test_cuda_ffn_refused(tmp):
    r = afd("generate", "--model", model(tmp, "qwen3_moe"), "--deterministic", "--ffn-device", "cuda",
            "--prompt-ids", "1,2,3", "--max-tokens", "1")
    assert r.returncode == 1
    assert "--deterministic needs the CPU FFN" in r.stderr, r.stderr
