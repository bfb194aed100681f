"""AFD equivalence for DeepSeek MLA models through the CLI, one test per case: every
in-process topology gives exactly the greedy tokens of the monolithic engine with the wire's
rounding (--afd-rounding y), on the dsv3-tiny FP8 and V2-style bf16 goldens, in reference
precision (f32 latent cache) and fast precision (bf16 latent cache, the bf16 absorbed-decode
kernel).

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_afd_deepseek.py
"""
import functools

import pytest

from afd_cli import DATA, generate


def P(model, precision):
    return ["--model", DATA / model, "--precision", precision, "--max-tokens", "12", "--ignore-eos", "--threads", "1",
            "--prompt-ids", "3,14,15,92,65", "--prompt-ids", "35", "--prompt-ids",
            "89,79,32,38,46,26,43,17,18,19,20,21,22,23,24,25,26,27"]


@functools.lru_cache(maxsize=None)
def mono(model, precision, rounding):
    out = generate(*P(model, precision), "--afd-rounding", rounding)
    assert out.strip(), "mono produced no tokens"
    return out


@pytest.mark.parametrize("mb", [1, 3])
@pytest.mark.parametrize("topology", ["1A1F", "2A1F", "1A2F", "EP2"])
@pytest.mark.parametrize("precision", ["reference", "fast"])
@pytest.mark.parametrize("model", ["dsv3_tiny_fp8", "dsv2_style_bf16"])
def test_in_process_equals_mono(model, precision, topology, mb):
    want = mono(model, precision, "1" if topology == "1A1F" or topology == "2A1F" else "2")
    assert generate(*P(model, precision), "--topology", topology, "--microbatches", mb) == want
