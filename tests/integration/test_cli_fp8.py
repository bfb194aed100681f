"""FP8 block-quantized weights through the CLI, each check its own test: `afd make-model
--dtype fp8` and `afd quantize --fp8` write checkpoints that load and run; every AFD wiring
(in-process xAyF, EP, FFN tensor parallelism with slices on and off the 128 block grid, FFN
worker processes over UCX) gives exactly the greedy tokens of mono with the same
--afd-rounding; `afd quantize --dequantize` gives a checkpoint with the same greedy tokens in
reference precision; bad input is a clear error (exit 1).

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_fp8.py
"""
import functools
import json
import shutil

import pytest

from afd_bundle import TIMEOUT
from afd_cli import PROMPTS, afd, generate, made


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fp8")


def model(tmp, name):
    """m: qwen2_moe (shared expert), hidden 192 and experts of 136 rows span two blocks with a
    partial last one; tiny: the qwen3_moe tiny preset (every block partial)."""
    if name == "m":
        return made(tmp, "m", "--arch", "qwen2_moe", "--preset", "tiny", "--hidden", "192", "--head-dim", "48",
                    "--moe-inter", "136", "--shared-inter", "160", "--vocab", "300", "--dtype", "fp8")
    return made(tmp, "tiny", "--arch", "qwen3_moe", "--preset", "tiny", "--dtype", "fp8")


def P(tmp, name):
    return ["--model", model(tmp, name), "--precision", "reference", "--max-tokens", "16", "--ignore-eos", "--threads",
            "1", *PROMPTS]


@functools.lru_cache(maxsize=None)
def mono(tmp, name, *args):
    return generate(*P(tmp, name), *args)


def test_config_has_quantization_config(tmp):
    assert json.load(open(model(tmp, "m") / "config.json"))["quantization_config"]["quant_method"] == "fp8"


@pytest.mark.parametrize("topology", ["1A1F", "2A2F", "EP2"])
@pytest.mark.parametrize("name", ["m", "tiny"])
def test_in_process_equals_mono(tmp, name, topology):
    want = mono(tmp, name, "--afd-rounding", "1" if topology == "1A1F" else "2")
    assert generate(*P(tmp, name), "--topology", topology, "--microbatches", "1") == want


@pytest.mark.parametrize("name", ["m", "tiny"])
def test_ffn_tp_equals_mono(tmp, name):
    """I = 136 (or 32) split in two: rank 1 starts off the block grid (a block-aligned superset)."""
    want = mono(tmp, name, "--afd-rounding", "2", "--ffn-tp", "2")
    assert generate(*P(tmp, name), "--topology", "1A2F", "--ffn-tp", "2", "--microbatches", "1") == want


def test_spawned_ffn_workers_equal_mono(tmp):
    """FFN worker processes over UCX, each loading the FP8 weights."""
    want = mono(tmp, "m", "--afd-rounding", "2", "--microbatches", "3")
    assert generate(*P(tmp, "m"), "--topology", "2A2F", "--microbatches", "3", "--spawn-ffn",
                    timeout=3 * TIMEOUT) == want


@pytest.fixture(scope="module")
def quantized(tmp):
    """A bf16 checkpoint (b), quantize --fp8 of it (q), and the output of quantize."""
    made(tmp, "b", "--arch", "qwen3_moe", "--preset", "tiny", "--hidden", "192", "--head-dim", "48", "--moe-inter",
         "136", "--vocab", "300")
    r = afd("--log-level", "error", "quantize", "--fp8", "--model", tmp / "b", "--out", tmp / "q")
    return r


def test_quantize_fp8(quantized):
    assert quantized.returncode == 0 and "quantized to FP8 blocks" in quantized.stdout, quantized


def test_quantized_vs_dequantized_greedy_tokens(tmp, quantized):
    r = afd("--log-level", "error", "quantize", "--dequantize", "--dtype", "f32", "--model", tmp / "q", "--out",
            tmp / "d")
    assert r.returncode == 0, r
    q = ["--precision", "reference", "--max-tokens", "24", "--ignore-eos", "--threads", "1", "--prompt-ids",
         "3,14,15,92,65", "--prompt-ids", "35"]
    want = generate("--model", tmp / "q", *q)
    assert want and generate("--model", tmp / "d", *q) == want


def test_quantize_copies_tokenizer(tmp, quantized):
    assert (tmp / "q" / "tokenizer.json").is_file()


def test_quantize_fp8_again_refused(tmp, quantized):
    r = afd("quantize", "--fp8", "--model", tmp / "q", "--out", tmp / "x")
    assert r.returncode == 1 and "already FP8" in r.stdout + r.stderr, r


def test_quantize_into_own_directory_refused(tmp, quantized):
    r = afd("quantize", "--fp8", "--model", tmp / "b", "--out", tmp / "b")
    assert r.returncode == 1 and "must differ" in r.stdout + r.stderr, r


def test_quantize_without_mode_refused(tmp, quantized):
    r = afd("quantize", "--model", tmp / "b", "--out", tmp / "x")
    assert r.returncode == 1 and "exactly one of" in r.stdout + r.stderr, r


def test_make_model_bad_dtype_refused(tmp):
    r = afd("make-model", "--dtype", "fp4", "--out", tmp / "x")
    assert r.returncode == 1 and "expected bf16, f16, f32 or fp8" in r.stdout + r.stderr, r


def test_fp8_tensors_without_quantization_config_refused(tmp, quantized):
    shutil.copytree(tmp / "q", tmp / "noqc")
    c = json.load(open(tmp / "noqc" / "config.json"))
    del c["quantization_config"]
    json.dump(c, open(tmp / "noqc" / "config.json", "w"))
    r = afd("generate", "--model", tmp / "noqc", "--prompt-ids", "1", "--max-tokens", "1")
    assert r.returncode == 1 and "is F8_E4M3 but config.json has no quantization_config" in r.stdout + r.stderr, r
