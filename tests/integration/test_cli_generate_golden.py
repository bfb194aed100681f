"""End to end through the CLI, one test per golden case: `afd generate --dump-logits` checked
by the independent reference's check_logits.py (which re-runs the f64 reference on the
engine's own tokens), and the printed tokens are the golden greedy continuations.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_cli_generate_golden.py
(AFD_GOLDEN_CASE=<case> runs one case: the ctest entries are one per case.)
"""
import json
import os
import subprocess

import pytest

from afd_bundle import TIMEOUT
from afd_cli import DATA, ROOT, afd

CASES = ["qwen3_gqa2_top2_untied", "qwen2moe_shared", "mixtral_top2", "qwen3_dense_sharded", "step3_tiny_fp8",
         "step3_normw_fp8", "dsv3_tiny_fp8", "dsv3_tiny_bf16", "dsv2_style_bf16", "k2_style_fp8"]
SELECTED = [os.environ["AFD_GOLDEN_CASE"]] if os.environ.get("AFD_GOLDEN_CASE") else CASES


@pytest.mark.parametrize("case", SELECTED)
def test_generate_matches_golden(case, tmp_path):
    d = DATA / case
    g = json.load(open(d / "golden.json"))
    prompts = [",".join(map(str, p)) for p in g["prompts"]]
    r = afd("generate", "--model", d, "--precision", "reference", "--max-tokens", g.get("max_new_tokens", 32),
            "--ignore-eos", *[a for p in prompts for a in ("--prompt-ids", p)], "--dump-logits",
            tmp_path / "logits.f32", timeout=3 * TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [list(map(int, l.split(","))) for l in r.stdout.split()]
    assert got == g["greedy_tokens"], "tokens differ from the golden greedy continuations"
    c = subprocess.run(["/usr/bin/python3", ROOT / "tests/reference/check_logits.py", d, tmp_path / "logits.f32",
                        *prompts, "--tol", "1e-4"], capture_output=True, text=True, timeout=3 * TIMEOUT)
    assert c.returncode == 0, (c.stdout + c.stderr)[-2000:]
