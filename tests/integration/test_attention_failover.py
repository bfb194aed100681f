"""Chaos test of attention-worker failover (docs/FAILOVER.md, "Attention worker failover").

`afd serve --topology 2A1F` (a front end over two attention worker processes and one FFN
worker) serves concurrent streaming and non-streaming requests, greedy and seeded
(temperature 1), while one attention worker is SIGKILLed mid-load (the launcher restarts
it) and then the other is SIGSTOPped for longer than --upstream-idle-timeout-s and
continued. Every request must complete with exactly the answer of an unfaulted run of the
same requests on the same bundle (every chunk: its text, tokens, finish reason; the usage;
logprobs within 1e-3), with no error event; the front end's metrics and log must show that
requests were continued on the other worker after each fault.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_attention_failover.py
"""

import os
import re
import signal
import time

import pytest

from afd_bundle import (DETERMINISTIC_ARGS, DETERMINISTIC_ENV, TIMEOUT, Bundle, Client, first_difference, make_model,
                        mixed_requests, same, wait_until)

IDLE_S = 3  # --upstream-idle-timeout-s
STOP_S = IDLE_S + 3  # how long an attention worker stays stopped


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def bundle(model_dir, tmp_path):
    # DETERMINISTIC_*: a sequence's tokens do not depend on what else runs (afd_bundle.py), so
    # the unfaulted run is reproducible and failover is what is tested.
    b = Bundle(model_dir, tmp_path, ["--topology", "2A1F", *DETERMINISTIC_ARGS, "--upstream-idle-timeout-s",
                                     str(IDLE_S), "--failover-timeout-s", "60"], env=DETERMINISTIC_ENV)
    try:
        yield b
    finally:
        b.close()


def test_attention_worker_failover_under_kill_and_stop(bundle):
    waves = {1: mixed_requests(1), 2: mixed_requests(2)}
    client = Client(bundle.port)

    # The unfaulted answers, from the same bundle.
    ref = client.run_all(waves)

    got = {}
    # Wave 1; SIGKILL attention worker 0 once the wave is sent and tokens stream. Each worker
    # runs one sequence at a time, so the router has queued about half the wave on each, and
    # worker 0 holds requests (one running, others accepted and queued) for a while yet.
    a0 = bundle.attention_pid(0)
    assert a0, bundle.children()
    client.chunks = 0
    wave1 = client.start(waves[1], got, 1)
    wait_until(lambda: client.chunks >= 1, "wave 1 streaming")
    os.kill(a0, signal.SIGKILL)
    for t in wave1:
        t.join(TIMEOUT)
    assert bundle.metric("afd_frontend_failovers_total") >= 1, "the SIGKILL hit no request\n" + bundle.log_tail()
    # The launcher restarts it; the front end places on it again once its /health answers.
    wait_until(lambda: bundle.attention_pid(0) not in (None, a0) and bundle.workers_up() == 2,
               "attention worker 0 restarted and up")
    # Wave 2; SIGSTOP attention worker 1, for longer than the idle timeout, once the wave is
    # sent and tokens stream.
    a1 = bundle.attention_pid(1)
    assert a1, bundle.children()
    client.chunks = 0
    wave2 = client.start(waves[2], got, 2)
    wait_until(lambda: client.chunks >= 1, "wave 2 streaming")
    os.kill(a1, signal.SIGSTOP)
    try:
        time.sleep(STOP_S)
    finally:
        os.kill(a1, signal.SIGCONT)
    threads = wave1 + wave2
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "requests still running:\n" + bundle.log_tail()

    errors = {k: v for k, v in got.items() if isinstance(v, Exception)}
    assert not errors, f"{errors}\n{bundle.log_tail()}"
    assert len(got) == 16
    differ = [key for key, want in ref.items() if not same(got[key], want)]
    assert not differ, "differ from the unfaulted run: " + "; ".join(
        f"{k} {waves[k[0]][k[1]][1]} first at {first_difference(ref[k], got[k])}" for k in differ) + "\n" + bundle.log_tail()

    # The faults did hit requests in flight: each was continued elsewhere.
    failovers = bundle.metric("afd_frontend_failovers_total")
    stalls = bundle.metric("afd_frontend_upstream_stalls_total")
    assert failovers >= 2 and stalls >= 1, f"failovers {failovers}, stalls {stalls}\n{bundle.log_tail()}"
    log = bundle.err_path.read_text()
    assert "continues on attention worker 1" in log and "continues on attention worker 0" in log, bundle.log_tail()
    assert "sent a request nothing for" in log, bundle.log_tail()
    # Some request was cut in the middle of its output, not only while queued.
    resumed_after = [int(m) for m in re.findall(r"continues on attention worker \d at \S+ after (\d+) generated", log)]
    assert max(resumed_after) > 0, resumed_after
