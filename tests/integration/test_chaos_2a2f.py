"""Chaos test of a whole disaggregated bundle (issue "No request lost"; docs/FAILOVER.md,
"Attention worker failover", "FFN failover"; docs/MEMBERSHIP.md, "FFN membership through the
front end").

`afd serve --topology 2A2F --ffn-parts 4` (a front end over two attention worker processes and
two FFN workers; the experts cut into 4 parts, so up to 4 FFN workers can share them) serves
waves of 8 concurrent requests — completions and chat, streaming and not, greedy and seeded at
temperature 1, some with logprobs — and during each wave one fault hits it:

1. an FFN worker joins: the test starts one and adds it through the front end's
   POST /admin/ffn, which gives it to both attention workers (it takes a part);
2. that FFN worker is SIGKILLed and not restarted: after --ffn-takeover-s the others take over
   its part (the requests in flight are held and retried); it is then removed through the front
   end and another FFN worker is added the same way;
3. attention worker 0 is SIGKILLed: its requests continue on worker 1; the launcher restarts it
   and the front end gives it the membership set through /admin/ffn before placing on it;
4. attention worker 1 is SIGSTOPped for longer than --upstream-idle-timeout-s: its requests
   continue on worker 0.

Every request must complete with exactly the answer of an unfaulted run of the same requests
on the same bundle (each chunk's text, tokens and finish reason; usage; logprobs within 1e-3),
with no error event. Determinism (afd_bundle.DETERMINISTIC_*): portable kernels
(AFD_CPU_DISABLE=all), one sequence per attention worker at a time (--max-running 1), no prefix
cache — so a sequence's tokens do not depend on what else runs or on who computes it; a part of
the experts is rounded on its own whoever holds it, so moving parts changes no bit either.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_chaos_2a2f.py
"""

import json
import os
import re
import signal
import time

import pytest

from afd_bundle import (DETERMINISTIC_ARGS, DETERMINISTIC_ENV, TIMEOUT, Bundle, Client, check_answers, free_port,
                        make_model, mixed_requests, start_ffn_worker, wait_until)

IDLE_S = 3  # --upstream-idle-timeout-s
STOP_S = IDLE_S * 2  # how long attention worker 1 stays stopped
TAKEOVER_S = 1  # --ffn-takeover-s
WAVES = ("join", "ffn_kill", "attention_kill", "attention_stop")


@pytest.fixture
def bundle(tmp_path):
    model = make_model(tmp_path / "tiny")
    b = Bundle(model, tmp_path, ["--topology", "2A2F", "--ffn-parts", "4", *DETERMINISTIC_ARGS,
                                 "--upstream-idle-timeout-s", str(IDLE_S), "--failover-timeout-s", "60",
                                 "--ffn-takeover-s", str(TAKEOVER_S), "--step-retry-s", "60"], env=DETERMINISTIC_ENV)
    b.model, b.tmp, b.extra = model, tmp_path, []
    try:
        yield b
    finally:
        for p in b.extra:  # the FFN workers the test started
            if p.poll() is None:
                p.kill()
            p.wait()
        b.close()


def memberships(b):
    """Each attention worker's FFN membership, through the front end's GET /admin/ffn."""
    st, body = b.get("/admin/ffn")
    assert st == 200, body
    return [w.get("membership") for w in json.loads(body)["workers"]]


def assigned(b, address):
    """Whether every attention worker has the FFN worker at `address` holding parts."""
    ms = memberships(b)
    return all(m and any(x["address"] == address and x["assigned"] for x in m["members"]) for m in ms)


def add_ffn_worker(b, shard):
    """Starts an FFN worker (shard "i/y": name ffn<i>) and adds it through the front end."""
    port = free_port()
    p = start_ffn_worker(b.model, port, shard, 2, b.tmp / f"ffn{shard.split('/')[0]}.log", env=DETERMINISTIC_ENV)
    b.extra.append(p)
    address = f"127.0.0.1:{port}"
    # It listens once its model is loaded: until then the attention workers keep dialling it.
    st, body = b.post("/admin/ffn", {"add": address})
    assert st == 200, body
    assert [w["result"] for w in json.loads(body)["workers"]] == ["applied", "applied"], body
    return p, address


def test_no_request_lost_in_2a2f(bundle):
    b = bundle
    waves = {k: mixed_requests(k, base_tokens=800, step_tokens=30) for k in range(len(WAVES))}
    client = Client(b.port)

    # The unfaulted answers, from the same bundle.
    ref = client.run_all(waves)

    got = {}
    state = {}

    def wave(k, fault):
        """Sends wave k; runs fault() once tokens stream (some way into the first answers, so
        that a fault cuts a request in the middle of its output); waits for the wave."""
        client.chunks = 0
        ts = client.start(waves[k], got, k)
        wait_until(lambda: client.chunks >= 40, f"wave {WAVES[k]} streaming")
        fault()
        for t in ts:
            t.join(TIMEOUT)
        assert not any(t.is_alive() for t in ts), f"wave {WAVES[k]}: requests still running\n" + b.log_tail()

    # 1. An FFN worker joins under load.
    wave(0, lambda: state.update(x=add_ffn_worker(b, "2/3")))
    x_proc, x_addr = state["x"]
    wait_until(lambda: assigned(b, x_addr), "the added FFN worker holding parts on both attention workers")

    # 2. It dies under load and is not restarted: the others take over its part.
    wave(1, lambda: os.kill(x_proc.pid, signal.SIGKILL))
    wait_until(lambda: all(m and m["takeovers"] >= 1 and m["live"] == 2 for m in memberships(b)),
               "the takeover of the killed FFN worker's part on both attention workers")
    st, body = b.post("/admin/ffn", {"remove": x_addr})
    assert st == 200, body
    _, y_addr = add_ffn_worker(b, "3/4")
    wait_until(lambda: assigned(b, y_addr), "the second added FFN worker holding parts")

    # 3. Attention worker 0 is killed under load; the launcher restarts it, and the front end
    # gives the new process the membership set through /admin/ffn before placing on it.
    a0 = b.worker_pid("attention", 0)
    assert a0, b.children()
    wave(2, lambda: os.kill(a0, signal.SIGKILL))
    wait_until(lambda: b.worker_pid("attention", 0) not in (None, a0) and b.workers_up() == 2,
               "attention worker 0 restarted and up")
    m0 = memberships(b)[0]
    assert [x["address"] for x in m0["members"] if not x["removed"]][-1] == y_addr, m0
    assert b.metric('afd_frontend_ffn_membership_pushes_total{worker="0"') >= 1

    # 4. Attention worker 1 is stopped under load for longer than the idle timeout.
    a1 = b.worker_pid("attention", 1)
    assert a1, b.children()

    def stop():
        os.kill(a1, signal.SIGSTOP)
        try:
            time.sleep(STOP_S)
        finally:
            os.kill(a1, signal.SIGCONT)

    wave(3, stop)

    check_answers(got, ref, waves, WAVES, b.log_tail)

    # The faults hit requests in flight, and /metrics and the log say what happened.
    assert b.metric("afd_frontend_failovers_total") >= 2, b.log_tail()
    assert b.metric("afd_frontend_upstream_stalls_total") >= 1, b.log_tail()
    assert b.metric('afd_frontend_ffn_membership_changes_total{result="applied"}') == 3
    assert b.metric("afd_frontend_ffn_members ") == 3
    assert b.metric("afd_ffn_takeovers_total") >= 1  # federated (attention worker 0's counted since its restart)
    log = b.err_path.read_text()
    assert "continues on attention worker 1" in log and "continues on attention worker 0" in log, b.log_tail()
    assert "retrying the forward pass" in log  # the requests held over the FFN loss were retried
    assert len(re.findall(r"front end: admin: FFN membership change .* applied by attention worker\(s\) 0, 1", log)) == 3
    # Some request was cut in the middle of its output, not only while queued.
    resumed_after = [int(m) for m in re.findall(r"continues on attention worker \d at \S+ after (\d+) generated", log)]
    assert max(resumed_after) > 0, resumed_after
    assert re.search(r"front end: attention worker 0 at \S+ is a new process \(restarted\): gave it the FFN "
                     r"membership of change 3 \(3 member\(s\)\)", log), b.log_tail()
