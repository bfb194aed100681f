"""Bad input to the CLI, one test per case: a clear error naming the problem (stderr matches a
pattern, case-insensitive), a non-zero exit, never a crash (exit codes >= 128 are signals; 70 is
an internal error).

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_errors.py
"""
import os
import re
import shutil
import subprocess

import pytest

from afd_bundle import TIMEOUT, wait_until
from afd_cli import DATA, afd, processes_with

M = DATA / "qwen3_gqa2_top2_untied"


def expect_error(pattern, *args):
    r = afd(*args)
    assert 0 < r.returncode < 70, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert re.search(pattern, r.stderr, re.I), f"message {r.stderr!r} lacks /{pattern}/"


CASES = {
    "token outside vocab": ("outside the vocabulary", ["generate", "--model", M, "--prompt-ids", "1,2,99999"]),
    "negative token": ("not a valid token", ["generate", "--model", M, "--prompt-ids", "1,-5"]),
    "non-integer id": ("not an integer", ["generate", "--model", M, "--prompt-ids", "1,x"]),
    "context too long": ("max_position_embeddings", ["generate", "--model", M, "--prompt-ids", "1", "--max-tokens",
                                                     "600"]),
    "bad temperature": ("temperature", ["generate", "--model", M, "--prompt-ids", "1", "--temperature", "-1"]),
    "bad top_p": ("top_p", ["generate", "--model", M, "--prompt-ids", "1", "--temperature", "1", "--top-p", "0"]),
    "bad precision": ("precision", ["generate", "--model", M, "--prompt-ids", "1", "--precision", "fp4"]),
    "bad micro-batches": ("micro-batches", ["generate", "--model", M, "--prompt-ids", "1", "--microbatches", "9"]),
    "an FFN worker listed twice": ("listed twice", ["generate", "--model", M, "--prompt-ids", "1", "--ffn",
                                                    "127.0.0.1:5,127.0.0.1:5"]),
    "an attention worker listed twice": ("listed twice", ["serve", "--model", M, "--attention-workers",
                                                          "127.0.0.1:5,127.0.0.1:5"]),
    "no attention worker named": ("names no attention worker", ["serve", "--model", M, "--attention-workers", ""]),
    "bench --mode afd on mono": ("mono has no FFN workers", ["bench", "--model", M, "--mode", "afd", "--topology",
                                                             "mono", "--batch", "1", "--context", "8", "--steps", "1",
                                                             "--skip-limits"]),
    "bench without timed steps": ("steps", ["bench", "--model", M, "--batch", "1", "--context", "8", "--steps", "0",
                                            "--skip-limits"]),
    "unknown FFN device": ("ffn-device|cpu, cuda", ["generate", "--model", M, "--prompt-ids", "1", "--ffn-device",
                                                    "tpu"]),
    "plan eplb without counts file": ("cannot open expert counts file", ["plan", "eplb", "--counts", "/nonexistent",
                                                                         "--ffn-workers", "2"]),
    "plan eplb on a config.json": ('expected "layers"', ["plan", "eplb", "--counts", M / "config.json",
                                                          "--ffn-workers", "2"]),
    "plan eplb on a binary file": ("no afd_ffn_expert_tokens_total samples", ["plan", "eplb", "--counts",
                                                                              M / "model.safetensors",
                                                                              "--ffn-workers", "2"]),
    "sim autoscale bad phase": ("autoscale phase 'gpu\*2'", ["sim", "--ratio", "1:1", "--autoscale", "base,gpu*2"]),
    "sim autoscale two ratios": ("one --ratio", ["sim", "--ratio", "1:1,2:1", "--autoscale", "base"]),
    "sim autoscale start past a bound": ("starting 100A-1F is outside the bounds", ["sim", "--ratio", "100:1",
                                                                                    "--autoscale", "base:1"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_argument(case):
    pattern, args = CASES[case]
    expect_error(pattern, *args)


def test_missing_model_dir(tmp_path):
    expect_error("no such file", "generate", "--model", tmp_path / "none", "--prompt-ids", "1")


def test_topology_file_and_another_topology(tmp_path):
    (tmp_path / "topo.json").write_text("{}")
    expect_error("excludes", "serve", "--topology-file", tmp_path / "topo.json", "--topology", "2A1F")


def test_topology_file_without_role(tmp_path):
    (tmp_path / "topo.json").write_text("{}")
    expect_error("requires --role", "worker", "--topology-file", tmp_path / "topo.json", "--index", "0")


def broken_copy(tmp_path, name, edit):
    d = tmp_path / name
    shutil.copytree(M, d)
    edit(d)
    return d


def test_truncated_safetensors(tmp_path):
    def edit(d):
        os.truncate(d / "model.safetensors", 1000)
    expect_error("model.safetensors", "generate", "--model", broken_copy(tmp_path, "trunc", edit), "--prompt-ids", "1")


def test_missing_config(tmp_path):
    d = broken_copy(tmp_path, "noconf", lambda d: (d / "config.json").unlink())
    expect_error("config.json", "generate", "--model", d, "--prompt-ids", "1")


def sub_config(old, new):
    def edit(d):
        c = (d / "config.json").read_text()
        assert old in c
        (d / "config.json").write_text(c.replace(old, new))
    return edit


def test_unknown_architecture(tmp_path):
    d = broken_copy(tmp_path, "arch", sub_config('"qwen3_moe"', '"llama4_text"'))
    expect_error("llama4_text|model_type", "generate", "--model", d, "--prompt-ids", "1")


def test_shape_disagrees_with_config(tmp_path):
    d = broken_copy(tmp_path, "shape", sub_config('"hidden_size": 64', '"hidden_size": 96'))
    expect_error("shape|hidden", "generate", "--model", d, "--prompt-ids", "1")


def test_garbage_safetensors(tmp_path):
    d = broken_copy(tmp_path, "garbage", lambda d: (d / "model.safetensors").write_bytes(os.urandom(4096)))
    expect_error("model.safetensors", "generate", "--model", d, "--prompt-ids", "1")


def test_bundle_with_corrupt_model(tmp_path):
    """Workers that cannot load the model fail the bundle as a whole, with the worker's reason,
    instead of being restarted forever; none is left behind."""
    r = afd("--log-level", "error", "make-model", "--preset", "tiny", "--seed", "1", "--out", tmp_path / "bundle")
    assert r.returncode == 0, r
    for f in (tmp_path / "bundle").glob("*.safetensors"):
        os.truncate(f, 1000)
    try:
        expect_error("before the bundle came up", "serve", "--model", tmp_path / "bundle", "--topology", "1A1F",
                     "--threads", "1", "--port", "0")
    except subprocess.TimeoutExpired:
        pytest.fail(f"afd serve with a corrupt model still running after {TIMEOUT} s")
    wait_until(lambda: processes_with(f"--model\0{tmp_path / 'bundle'}") == [],
               "the workers of the failed bundle to stop", interval=0.1)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is present: cuda is available")
@pytest.mark.parametrize("cmd", [["generate", "--model", M, "--prompt-ids", "1", "--ffn-device", "cuda"],
                                 ["worker", "--role", "ffn", "--model", M, "--ffn-device", "cuda", "--listen",
                                  "127.0.0.1:0"]], ids=["generate", "worker"])
def test_cuda_without_gpu(cmd):
    expect_error("unavailable", *cmd)
