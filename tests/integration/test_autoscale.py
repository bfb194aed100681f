"""The serving autoscaler (docs/DEPLOYMENT.md "Autoscaling"): `afd serve --topology 1A1F
--autoscale` under a steady load of concurrent streaming requests, with the stage costs of a
larger deployment emulated (--emulate-stage-costs: sleeps inside each stage, re-read from a file
the test rewrites between phases).

Under an attention cost of a µs per token and an FFN cost of f µs per (token, routed expert)
pair, the ratio theory's optimum is r* = a / (f k) (k = 2 routed experts per token for the tiny
model; docs/PLANNING.md). With --max-attention 2 --max-ffn 2 and hysteresis 0.15:

A. attention slow (a = 2000, f = 250: r* = 4): the autoscaler adds an attention worker, 1A1F ->
   2A1F (x' = round(r* y) = 4, bounded to 2), then holds;
B. FFN slow (a = 2000, f = 4000: r* = 0.25): it adds an FFN worker (y' = round(x / r*) = 8,
   bounded to 2: 2A2F), then removes an attention worker (x' = round(r* y) = 0.5 -> 1: 1A2F),
   then holds.

Each phase converges within 3 changes and then makes none over the next windows (no
oscillation), no request fails, and every decision is logged with its r* and exported in the
front end's /metrics.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_autoscale.py
"""

import json
import threading
import time
import urllib.request

import pytest

from afd_bundle import TIMEOUT, Bundle, make_model, wait_until

INTERVAL_S = 1.5


def write_costs(path, attention_us, ffn_us):
    path.write_text(json.dumps({"attention_us_per_token": attention_us, "ffn_us_per_row": ffn_us}))


class Load:
    """n threads each sending streaming greedy completions back to back until stop()."""

    def __init__(self, port, n=8):
        self.port, self.done, self.failures, self.stopping = port, 0, [], threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i):
        while not self.stopping.is_set():
            body = {"prompt": f"the autoscaler test {i}", "max_tokens": 24, "ignore_eos": True, "temperature": 0,
                    "stream": True}
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                    text = r.read().decode()
                ok = r.status == 200 and "data: [DONE]" in text and '"error"' not in text
                with self.lock:
                    if ok:
                        self.done += 1
                    else:
                        self.failures.append(text[-500:])
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with self.lock:
                    self.failures.append(repr(e))

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(TIMEOUT)


def metrics(b):
    st, text = b.get("/metrics")
    assert st == 200
    out = {}
    for line in text.splitlines():
        if line.startswith("afd_autoscale_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def counts(m):
    return (int(m['afd_autoscale_workers{role="attention"}']), int(m['afd_autoscale_workers{role="ffn"}']))


def converge(b, target, phase):
    """Waits for the worker counts `target`, then for 3 more windows in which nothing changes.
    Returns the changes the phase made."""
    start = metrics(b)["afd_autoscale_changes_total"]
    wait_until(lambda: (lambda m: counts(m) == target and m["afd_autoscale_changing"] == 0)(metrics(b)),
               f"phase {phase}: {target[0]}A{target[1]}F", timeout=180, interval=0.2)
    m = metrics(b)
    changes = m["afd_autoscale_changes_total"] - start
    windows = m["afd_autoscale_windows_total"]
    wait_until(lambda: metrics(b)["afd_autoscale_windows_total"] >= windows + 3,
               f"phase {phase}: 3 windows after reaching {target}", timeout=120, interval=0.2)
    m2 = metrics(b)
    assert counts(m2) == target, (phase, m2, b.log_tail())
    assert m2["afd_autoscale_changes_total"] == m["afd_autoscale_changes_total"], \
        f"phase {phase}: changed again after converging (oscillation)\n{b.log_tail()}"
    return changes


@pytest.fixture
def bundle(tmp_path):
    model = make_model(tmp_path / "tiny")
    costs = tmp_path / "costs.json"
    write_costs(costs, 2000, 250)
    b = Bundle(model, tmp_path,
               ["--topology", "1A1F", "--threads", "1", "--autoscale", "--autoscale-interval-s", str(INTERVAL_S),
                "--max-attention", "2", "--max-ffn", "2", "--emulate-stage-costs", str(costs), "--ucx-spin-us", "0",
                "--worker-restarts", "0"])
    b.costs = costs
    try:
        yield b
    finally:
        b.close()


def test_autoscaler_follows_the_stage_costs(bundle):
    b = bundle
    m = metrics(b)
    assert counts(m) == (1, 1)
    assert m['afd_autoscale_bounds{role="ffn",bound="max"}'] == 2
    load = Load(b.port)
    try:
        changes_a = converge(b, (2, 1), "A (attention slow)")
        write_costs(b.costs, 2000, 4000)
        changes_b = converge(b, (1, 2), "B (FFN slow)")
    finally:
        load.stop()
    assert not load.failures, load.failures[:3]
    assert load.done > 0
    assert 1 <= changes_a <= 3, changes_a
    assert 2 <= changes_b <= 3, changes_b
    m = metrics(b)
    assert m["afd_autoscale_errors_total"] == 0, b.log_tail()
    assert 0 < m["afd_autoscale_r_star"] < 0.7, m  # phase B's optimum (0.25 nominally)
    log = b.err_path.read_text()
    assert "autoscaler: 1A1F, window" in log and "-> 2A1F" in log, log[-3000:]
    assert "-> 2A2F" in log and "-> 1A2F" in log, log[-3000:]
    assert "r* = " in log
    # The front end's health is whole again: every worker it runs is up.
    st, body = b.get("/health")
    assert st == 200 and json.loads(body)["workers_up"] == 1, body


def test_autoscale_refuses_bounds_that_the_start_breaks(tmp_path):
    model = make_model(tmp_path / "tiny")
    import subprocess
    from afd_bundle import AFD
    for args, want in ((["--topology", "2A1F", "--max-attention", "1"], "outside --min-attention 1 .. --max-attention 1"),
                       (["--topology", "1A2F", "--min-ffn", "3", "--max-ffn", "4"], "outside --min-ffn 3"),
                       (["--topology", "1A1F", "--max-ffn", "9"], "lower --max-ffn to 8"),
                       (["--topology", "1A1F", "--in-process"], "--autoscale starts and stops worker processes")):
        r = subprocess.run([AFD, "serve", "--model", str(model), "--port", "0", "--autoscale", *args],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        assert want in r.stdout + r.stderr, (args, r.stdout, r.stderr)
