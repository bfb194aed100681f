"""Expert load balancing live in serving (docs/DEPLOYMENT.md "Expert load balancing"):
`afd serve --topology 1A2F --eplb` over FFN worker processes (UCX), --deterministic.

32 concurrent streaming greedy requests run on a bundle that keeps the contiguous placement
(--eplb-interval-s 0) and on one that plans a new placement (with 2 redundant replicas) every
0.2 s while they run (an emulated FFN cost of 50 µs per pair keeps them running for seconds): every answer must be the same text, no request may fail, and the second
bundle must have put several placements in effect meanwhile (afd_ffn_eplb_placements_total).
Then the same requests on a third such bundle whose FFN worker 1 is killed while they run
(the other takes over its experts): again the same text and no failure. Bad settings are
refused at start.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_eplb.py
"""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

from afd_bundle import AFD, TIMEOUT, Bundle, make_model

N_REQUESTS = 32


def requests():
    out = []
    for i in range(N_REQUESTS):
        words = ["cat", "the", "water", "run", "dog", "."][i % 6]
        out.append({"prompt": f"{words} " * (3 + i % 7) + str(i), "max_tokens": 120 + 4 * (i % 5), "ignore_eos": True,
                    "temperature": 0, "stream": True})
    return out


def run_all(port):
    """The streamed text of every request (run at once), and the failures."""
    texts, failures = [None] * N_REQUESTS, []

    def one(i, body):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            parts = []
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            failures.append((i, chunk))
                        for c in chunk.get("choices", []):
                            parts.append(c.get("text", ""))
            texts[i] = "".join(parts)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures.append((i, repr(e)))

    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(requests())]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    return texts, failures


def serve(model, tmp_path, name, interval, extra=()):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"ffn_us_per_row": 50}))
    return Bundle(model, tmp_path, ["--topology", "1A2F", "--threads", "1", "--deterministic", "--eplb",
                                    "--eplb-interval-s", str(interval), "--eplb-redundant", "2",
                                    "--emulate-stage-costs", str(costs), *extra], name=name)


def test_placements_change_no_token(tmp_path):
    model = make_model(tmp_path / "tiny")
    b = serve(model, tmp_path, "contiguous", 0)
    try:
        ref, failures = run_all(b.port)
        assert not failures, failures[:3]
        assert b.metric("afd_ffn_eplb_placements_total") == 0
    finally:
        b.close()
    b = serve(model, tmp_path, "eplb", 0.2)
    try:
        got, failures = run_all(b.port)
        placements = b.metric("afd_ffn_eplb_placements_total")
        log = b.log_tail(40)
    finally:
        b.close()
    assert not failures, failures[:3]
    assert placements >= 3, (placements, log)
    assert all(t for t in ref), ref
    diff = [i for i in range(N_REQUESTS) if got[i] != ref[i]]
    assert not diff, f"{len(diff)} answers changed, first {diff[0]}: {ref[diff[0]]!r} vs {got[diff[0]]!r}"

    # An FFN worker killed mid-run (not restarted): the passes that failed are held, the other
    # worker takes over every expert after the takeover time (a contiguous placement over it),
    # and every request finishes with the same text.
    b = serve(model, tmp_path, "killed", 0.2,
              ["--ffn-takeover-s", "1", "--worker-restarts", "0", "--step-retry-s", "30", "--ffn-timeout-ms", "3000"])
    try:
        result = {}
        runner = threading.Thread(target=lambda: result.update(zip(("texts", "failures"), run_all(b.port))))
        runner.start()
        time.sleep(0.7)
        os.kill(b.worker_pid("ffn", 1), signal.SIGKILL)
        runner.join(TIMEOUT)
        log = b.log_tail(40)
    finally:
        b.close()
    assert not result["failures"], (result["failures"][:3], log)
    diff = [i for i in range(N_REQUESTS) if result["texts"][i] != ref[i]]
    assert not diff, f"{len(diff)} answers changed after the FFN worker was lost, first {diff[0]}"


def test_bad_eplb_settings_are_refused(tmp_path):
    model = make_model(tmp_path / "tiny")
    for args, want in ((["--topology", "1A2F", "--eplb", "--eplb-interval-s", "-1"], "--eplb-interval-s"),
                       (["--topology", "mono", "--eplb"], "--eplb places experts"),
                       (["--topology", "1A2F", "--eplb", "--eplb-redundant", "70000"], "--eplb-redundant"),
                       (["--topology", "2A2F", "--ffn-tp", "2", "--eplb", "--in-process"], "--ffn-tp")):
        r = subprocess.run([AFD, "serve", "--model", str(model), "--port", "0", *args], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        assert want in r.stdout + r.stderr, (args, r.stdout[-2000:], r.stderr[-2000:])
