"""`afd make-model` from a config.json, given weights and a tokenizer, and with DeepSeek MTP
modules: a checkpoint rebuilt with --config/--weights/--tokenizer from a random checkpoint's own
files is that checkpoint byte for byte (bf16 and FP8), the float64 oracle reads the MTP layout
make-model writes (Model.from_dir(load_mtp=True)), and bad input exits 1 naming the problem.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_make_model.py
"""
import filecmp
import json
import re
import sys

import numpy as np
import pytest

from afd_cli import ROOT, afd, generate, made

sys.path.insert(0, str(ROOT / "tests/reference"))
import mla_mfa_ref  # noqa: E402
import safetensors_io as st  # noqa: E402


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("make_model")


ARCHS = {"deepseek_v3": ["--mtp", "1"], "step3_text": [], "qwen3_moe": []}


def source(tmp, arch, dtype):
    return made(tmp, f"src_{arch}_{dtype}", "--arch", arch, "--preset", "tiny", "--seed", "4", "--dtype", dtype,
                *ARCHS[arch])


def weights_file(src, path, dtype="F32", drop=(), reshape=None):
    """The logical tensors of checkpoint src (Step-3's stacked experts split per expert) as one
    safetensors file of `dtype` (F32 tensors stay F32); without the names in `drop`; `reshape`
    {name: shape} gives a tensor another shape (zeros)."""
    out = {}
    for name, t in st.load_dir(src).items():
        v = t.to_f64().astype(np.float32)
        dt = "F32" if t.dtype == "F32" else dtype
        m = re.fullmatch(r"(model\.layers\.\d+\.moe\.)(gate|up|down)_proj\.weight", name)
        if m:
            for e in range(v.shape[0]):
                out[f"{m[1]}experts.{e}.{m[2]}_proj.weight"] = st.Tensor.from_float(v[e], dt)
        else:
            out[name] = st.Tensor.from_float(v, dt)
    for name in drop:
        del out[name]
    for name, shape in (reshape or {}).items():
        out[name] = st.Tensor.from_float(np.zeros(shape, np.float32), "F32")
    st.write_file(path, out)
    return path


def tensors_equal(a, b):
    ta, tb = st.load_dir(a), st.load_dir(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype, name
        assert np.array_equal(ta[name].raw, tb[name].raw), name


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_rebuilt_from_config_weights_and_tokenizer_is_the_same_checkpoint(tmp, arch, dtype):
    src = source(tmp, arch, "f32")
    w = weights_file(src, tmp / f"w_{arch}.safetensors")
    out = tmp / f"rebuilt_{arch}_{dtype}"
    r = afd("--log-level", "error", "make-model", "--config", src / "config.json", "--weights", w, "--tokenizer", src,
            "--dtype", dtype, "--seed", "99", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    # Seed 4's checkpoint in `dtype`: the same f32 values rounded / quantized the same way.
    tensors_equal(source(tmp, arch, dtype), out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert filecmp.cmp(src / f, out / f, shallow=False), f
    want = json.load(open(source(tmp, arch, dtype) / "config.json"))
    got = json.load(open(out / "config.json"))
    assert got == want
    tokens = generate("--model", out, "--precision", "reference", "--max-tokens", "4", "--ignore-eos", "--prompt-ids",
                      "5,17,300,2")
    assert tokens == generate("--model", source(tmp, arch, dtype), "--precision", "reference", "--max-tokens", "4",
                              "--ignore-eos", "--prompt-ids", "5,17,300,2")


def test_bf16_weights_file_and_config_directory(tmp):
    src = source(tmp, "step3_text", "bf16")
    w = weights_file(src, tmp / "w_step3_bf16.safetensors", "BF16")
    out = tmp / "rebuilt_from_dir"
    r = afd("--log-level", "error", "make-model", "--config", src, "--weights", w, "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    tensors_equal(src, out)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_oracle_reads_the_mtp_layout(tmp, dtype):
    m = mla_mfa_ref.Model.from_dir(str(source(tmp, "deepseek_v3", dtype)), load_mtp=True)
    H, V = m.cfg.hidden_size, m.cfg.vocab_size
    assert m.mtp["eh_proj"].shape == (H, 2 * H)
    assert m.mtp["head"].shape == (V, H)
    assert m.mtp["moe"]


def test_quantized_mtp_checkpoint_loads_in_oracle_and_engine(tmp):
    out = tmp / "ds_quantized"
    r = afd("--log-level", "error", "quantize", "--fp8", "--model", source(tmp, "deepseek_v3", "bf16"), "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    mla_mfa_ref.Model.from_dir(str(out), load_mtp=True)
    generate("--model", out, "--max-tokens", "3", "--prompt-ids", "5,17")


def error(tmp, *args):
    r = afd("make-model", *args, "--out", tmp / "bad")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    return r.stderr


def test_bad_input_exits_1_naming_it(tmp):
    src = source(tmp, "step3_text", "f32")
    cfg = src / "config.json"
    assert "--preset: not with --config" in error(tmp, "--config", cfg, "--preset", "tiny")
    assert "--mtp: not with --config" in error(tmp, "--config", cfg, "--mtp", "1")
    assert "--hidden: not with --config" in error(tmp, "--config", cfg, "--hidden", "64")
    assert "--mtp: MTP modules are DeepSeek's" in error(tmp, "--arch", "qwen3_moe", "--mtp", "1")
    assert "no-such.json: cannot open" in error(tmp, "--config", tmp / "no-such.json")
    e = error(tmp, "--config", cfg, "--weights",
              weights_file(src, tmp / "w_drop.safetensors", drop=["model.layers.2.moe.experts.7.down_proj.weight"]))
    assert "no tensor 'model.layers.2.moe.experts.7.down_proj.weight' (the model needs one of shape [256, 160])" in e
    e = error(tmp, "--config", cfg, "--weights",
              weights_file(src, tmp / "w_shape.safetensors", reshape={"model.norm.weight": [255]}))
    assert "tensor 'model.norm.weight' has shape [255], the model needs [256]" in e
    e = error(tmp, "--config", cfg, "--weights",
              weights_file(src, tmp / "w_extra.safetensors", reshape={"model.layers.0.extra.weight": [4]}))
    assert "tensor 'model.layers.0.extra.weight' [4] is not a tensor of this model" in e
    (tmp / "no_tok").mkdir(exist_ok=True)
    assert "tokenizer.json" in error(tmp, "--config", cfg, "--tokenizer", tmp / "no_tok")
    assert "absent.safetensors" in error(tmp, "--config", cfg, "--weights", tmp / "absent.safetensors")
