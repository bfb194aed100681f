"""The DeepSeek and Step-3 families through the CLI, each check its own test: make-model ->
quantize -> generate for step3_text (bf16 and fp8); make-model'd checkpoints against the
float64 oracle (check_logits.py); every AFD wiring of the Step-3 golden checkpoint (in-process
xAyF and EP, FFN tensor parallelism, FFN worker processes over UCX) gives exactly the greedy
tokens of mono with the same wire rounding; DeepSeek V3 / V2 and Kimi-K2 checkpoints (FP8, and bf16 ->
quantize --fp8) written, generated, checked against the oracle, FFN TP and worker processes.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_families.py
"""
import functools
import subprocess

import pytest

from afd_bundle import TIMEOUT
from afd_cli import DATA, PROMPTS, ROOT, afd, generate, made


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def step3(tmp, dtype):
    return made(tmp, f"s3_{dtype}", "--arch", "step3_text", "--preset", "tiny", "--dtype", dtype, "--seed", "3")


def n_tokens(out):
    return len([t for t in out.replace(",", "\n").split() if t])


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_step3_text_generates(tmp, dtype):
    out = generate("--model", step3(tmp, dtype), "--precision", "reference", "--max-tokens", "12", "--ignore-eos",
                   "--prompt-ids", "5,17,300,2")
    assert n_tokens(out) == 12, out


@functools.lru_cache(maxsize=None)
def quantized(tmp, name, source):
    """`afd quantize --fp8` of checkpoint source into tmp/name (once per module)."""
    r = afd("--log-level", "error", "quantize", "--fp8", "--model", source, "--out", tmp / name)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp / name


def test_step3_text_quantized_generates(tmp):
    out = generate("--model", quantized(tmp, "s3_q", step3(tmp, "bf16")), "--precision", "reference", "--max-tokens", "12", "--ignore-eos",
                   "--prompt-ids", "5,17,300,2")
    assert n_tokens(out) == 12, out


def oracle(tmp, name, model):
    """afd generate --dump-logits, checked by the independent float64 reference."""
    generate("--model", model, "--precision", "reference", "--max-tokens", "6", "--ignore-eos", "--prompt-ids",
             "5,17,300,2", "--prompt-ids", "7", "--dump-logits", tmp / f"{name}.f32")
    r = subprocess.run(["/usr/bin/python3", ROOT / "tests/reference/check_logits.py", model, tmp / f"{name}.f32",
                        "5,17,300,2", "7", "--max-new-tokens", "6", "--tol", "1e-4"], capture_output=True, text=True,
                       timeout=3 * TIMEOUT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]


def test_step3_bf16_matches_oracle(tmp):
    oracle(tmp, "step3_bf16", step3(tmp, "bf16"))


def test_step3_quantized_matches_oracle(tmp):
    """make-model bf16 -> quantize --fp8 -> the oracle."""
    oracle(tmp, "step3_quantized", quantized(tmp, "s3_q", step3(tmp, "bf16")))


def test_step3_fp8_head256_matches_oracle(tmp):
    """head_dim 256: the real model's head."""
    m = made(tmp, "s3_hd256", "--arch", "step3_text", "--preset", "tiny", "--head-dim", "256", "--dtype", "fp8",
             "--seed", "5")
    oracle(tmp, "step3_fp8_head256", m)


# ---- AFD wirings of the Step-3 golden checkpoint (FP8, one K/V head, low-rank query) ----------

STEP3 = ["--model", DATA / "step3_tiny_fp8", "--precision", "reference", "--max-tokens", "16", "--ignore-eos",
         "--threads", "1", *PROMPTS]


@functools.lru_cache(maxsize=None)
def step3_mono(*args):
    return generate(*STEP3, *args)


@pytest.mark.parametrize("mb", [1, 3])
@pytest.mark.parametrize("topology", ["1A1F", "2A1F", "1A2F", "2A2F", "EP2"])
def test_step3_in_process_equals_mono(topology, mb):
    rounding = "2" if topology.endswith("2F") or topology == "EP2" else "1"
    want = step3_mono("--afd-rounding", rounding)
    assert want and generate(*STEP3, "--topology", topology, "--microbatches", mb) == want


def test_step3_ffn_tp_equals_mono():
    want = step3_mono("--afd-rounding", "2", "--ffn-tp", "2")
    assert want and generate(*STEP3, "--topology", "1A2F", "--ffn-tp", "2") == want


def test_step3_fp8_partial_blocks_ffn_tp_equals_mono(tmp):
    """FFN TP over FP8 experts whose halves (80 of 160 rows) do not start on a 128-block."""
    q = ["--model", step3(tmp, "fp8"), "--precision", "reference", "--max-tokens", "12", "--ignore-eos", "--threads",
         "1", "--prompt-ids", "5,17,300,2", "--prompt-ids", "9"]
    want = generate(*q, "--afd-rounding", "2", "--ffn-tp", "2")
    assert want and generate(*q, "--topology", "1A2F", "--ffn-tp", "2") == want


def test_step3_spawned_ffn_workers_equal_mono():
    """FFN workers as processes (UCX): they load the checkpoint and pass the fingerprint handshake."""
    want = step3_mono("--afd-rounding", "2")
    assert want and generate(*STEP3, "--topology", "1A2F", "--spawn-ffn", timeout=3 * TIMEOUT) == want


# ---- DeepSeek V3 / V2 and Kimi-K2 (MLA) -------------------------------------------------------------------

ARCHS = ["deepseek_v3", "deepseek_v2", "kimi_k2"]


def deepseek(tmp, arch):
    return made(tmp, arch, "--arch", arch, "--preset", "tiny", "--dtype", "fp8", "--seed", "3")


@pytest.mark.parametrize("arch", ARCHS)
def test_deepseek_generates(tmp, arch):
    out = generate("--model", deepseek(tmp, arch), "--precision", "reference", "--max-tokens", "8", "--ignore-eos",
                   "--prompt-ids", "5,17,300,2")
    assert n_tokens(out) == 8, out


@pytest.mark.parametrize("arch", ARCHS)
def test_deepseek_matches_oracle(tmp, arch):
    oracle(tmp, arch, deepseek(tmp, arch))


@pytest.mark.parametrize("arch", ARCHS)
def test_deepseek_quantized_matches_oracle(tmp, arch):
    """make-model bf16 -> quantize --fp8 -> the oracle (it dequantizes the stored blocks itself)."""
    m = made(tmp, f"{arch}_bf16", "--arch", arch, "--preset", "tiny", "--seed", "4")
    oracle(tmp, f"{arch}_quantized", quantized(tmp, f"{arch}_q", m))


def deepseek_args(tmp, arch):
    return ["--model", deepseek(tmp, arch), "--precision", "reference", "--max-tokens", "8", "--ignore-eos",
            "--threads", "1", "--prompt-ids", "5,17,300,2", "--prompt-ids", "9"]


@pytest.mark.parametrize("arch", ARCHS)
def test_deepseek_ffn_tp_equals_mono(tmp, arch):
    """FFN TP over FP8 experts with partial blocks (the in-process wirings of the DeepSeek
    goldens: test_cli_afd_deepseek.py)."""
    d = deepseek_args(tmp, arch)
    want = generate(*d, "--afd-rounding", "2", "--ffn-tp", "2")
    assert want and generate(*d, "--topology", "1A2F", "--ffn-tp", "2") == want


@pytest.mark.parametrize("arch", ARCHS)
def test_deepseek_spawned_ffn_workers_equal_mono(tmp, arch):
    d = deepseek_args(tmp, arch)
    want = generate(*d, "--afd-rounding", "2")
    assert want and generate(*d, "--topology", "1A2F", "--spawn-ffn", timeout=3 * TIMEOUT) == want
