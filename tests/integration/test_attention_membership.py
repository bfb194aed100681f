"""Attention workers joining and leaving a running deployment (docs/MEMBERSHIP.md, "Attention
workers joining and leaving").

`afd serve --topology 1A1F` (a front end over one attention worker process and one FFN worker)
serves three waves of concurrent requests — completions and chat, streaming and not, greedy
and seeded at temperature 1, some with logprobs:

A. during it, a second attention worker the test started (`afd worker --role attention`, index
   1 of 2A1F, dialling the same FFN worker, which was started for one attention worker) is
   added through the front end's POST /admin/attention;
B. requests are placed on both; during it attention worker 0 is removed: it drains (its
   requests in flight finish there, no new one goes there) and then leaves;
C. every request goes to the added worker;
D. worker 0 is added back; during the wave worker 1 is removed with "migrate": its requests
   in flight continue on worker 0 (the failover continuation) instead of finishing there.

Every request must complete with exactly the answer of an unfaulted run of the same requests
on the same bundle (afd_bundle.DETERMINISTIC_*), with correct usage and no error event.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_attention_membership.py
"""

import json
import re

import pytest

from afd_bundle import (DETERMINISTIC_ARGS, DETERMINISTIC_ENV, TIMEOUT, Bundle, Client, check_answers, Proc, free_port,
                        health, make_model, mixed_requests, wait_until)

WAVES = ("A", "B", "C", "D")


@pytest.fixture
def bundle(tmp_path):
    model = make_model(tmp_path / "tiny")
    b = Bundle(model, tmp_path, ["--topology", "1A1F", *DETERMINISTIC_ARGS, "--upstream-idle-timeout-s", "10",
                                 "--failover-timeout-s", "60"], env=DETERMINISTIC_ENV)
    b.tmp, b.extra = tmp_path, []
    try:
        yield b
    finally:
        for p in b.extra:  # the attention worker the test started
            p.close()
        b.close()


def start_second_attention_worker(b):
    """`afd worker --role attention` as attention worker 0's command line (same model, FFN
    workers and settings), but index 1 of 2A1F on a free port of its own."""
    argv = dict(b.children())[b.worker_pid("attention", 0)]
    args = argv[argv.index("worker"):]
    if args and args[-1] == "":  # /proc/<pid>/cmdline ends with a NUL
        args.pop()
    port = free_port()
    for flag, value in (("--listen", f"127.0.0.1:{port}"), ("--topology", "2A1F"), ("--attention-index", "1")):
        args[args.index(flag) + 1] = value
    p = Proc(args, b.tmp, "attention1", env=DETERMINISTIC_ENV)
    b.extra.append(p)
    return p, port


def admin(b):
    st, body = b.get("/admin/attention")
    assert st == 200, body
    return json.loads(body)


def test_attention_worker_joins_and_leaves_under_load(bundle):
    b = bundle
    waves = {k: mixed_requests(k, n=6, base_tokens=200, step_tokens=20) for k in range(len(WAVES))}
    client = Client(b.port)
    ref = client.run_all(waves)  # the unfaulted answers, from the same bundle

    # The FFN worker (started for one attention worker) serves a second one: its /health is
    # 200 only once its FFN worker accepted it.
    w1, w1_port = start_second_attention_worker(b)
    wait_until(lambda: health(w1_port)[0] == 200, "the second attention worker serving", interval=0.1)
    w1_addr = f"127.0.0.1:{w1_port}"
    w0_addr = b.worker_listen("attention", 0)

    got = {}

    def wave(k, during):
        client.chunks = 0
        ts = client.start(waves[k], got, k)
        if during:
            wait_until(lambda: client.chunks >= 5, f"wave {WAVES[k]} streaming")
            during()
        for t in ts:
            t.join(TIMEOUT)
        assert not any(t.is_alive() for t in ts), f"wave {WAVES[k]}: requests still running\n" + b.log_tail()

    # A. The second worker joins under load.
    def join():
        st, body = b.post("/admin/attention", {"add": w1_addr})
        assert st == 200 and json.loads(body) == {"worker": 1, "address": w1_addr, "result": "added"}, body
        st, body = b.post("/admin/attention", {"add": w1_addr})
        assert st == 409, body

    wave(0, join)
    wait_until(lambda: b.workers_up() == 2, "both attention workers up", interval=0.1)
    _, text = b.get("/metrics")
    assert 'attention="0"' in text and 'attention="1"' in text  # federated from both

    # B. Requests go to both; worker 0 leaves while it holds some.
    def leave():
        wait_until(lambda: b.metric('afd_frontend_worker_requests_total{worker="1"') >= 1, "a request on worker 1")
        st, body = b.post("/admin/attention", {"remove": w0_addr})
        # Each worker runs one sequence at a time and got about half the wave: worker 0 still
        # holds some, which finish there.
        assert st == 200 and json.loads(body)["result"] == "draining", body
        assert json.loads(body)["inflight_requests"] >= 1, body
        assert [w["state"] for w in admin(b)["workers"]][0] == "draining"
        st, body = b.post("/admin/attention", {"remove": 1})
        assert st == 409, body  # the last active worker stays

    wave(1, leave)
    wait_until(lambda: [w["worker"] for w in admin(b)["workers"]] == [1], "worker 0 drained and removed")
    assert b.metric('afd_frontend_worker_requests_total{worker="1"') >= 1

    # C. Everything goes to the added worker.
    before = b.metric('afd_frontend_worker_requests_total{worker="1"')
    wave(2, None)
    assert b.metric('afd_frontend_worker_requests_total{worker="1"') == before + len(waves[2])
    assert b.metric("afd_frontend_failovers_total") == 0  # nothing was cut: the drain let them finish
    _, text = b.get("/metrics")
    assert 'attention="1"' in text and 'attention="0"' not in text  # federated: members only

    # D. Worker 0 back (its old slot); worker 1 leaves with its requests moved to worker 0.
    st, body = b.post("/admin/attention", {"add": w0_addr})
    assert st == 200 and json.loads(body) == {"worker": 0, "address": w0_addr, "result": "active again"}, body
    wait_until(lambda: b.workers_up() == 2, "worker 0 up again", interval=0.1)

    def migrate():
        wait_until(lambda: b.metric('afd_frontend_worker_inflight_requests{worker="1"') >= 2,
                   "requests on worker 1")
        st, body = b.post("/admin/attention", {"remove": 1, "migrate": True})
        assert st == 200 and json.loads(body)["result"] == "draining", body
        assert json.loads(body)["moved"] >= 1, body

    wave(3, migrate)
    wait_until(lambda: [w["worker"] for w in admin(b)["workers"]] == [0], "worker 1 removed")

    check_answers(got, ref, waves, WAVES, b.log_tail)

    # /metrics and the log say what changed.
    assert b.metric('afd_frontend_attention_membership_changes_total{change="join"}') == 2
    assert b.metric('afd_frontend_attention_membership_changes_total{change="leave"}') == 2
    assert b.metric('afd_frontend_attention_workers{state="up"}') == 1
    assert b.metric('afd_frontend_attention_workers{state="removed"}') == 1
    assert b.metric('afd_frontend_worker_up{worker="1"') == 0  # not listed any more
    assert b.metric("afd_frontend_failovers_total") >= 1  # the moved requests
    assert b.metric("afd_frontend_worker_failures_total") == 0  # a move is no failure
    log = b.err_path.read_text()
    assert re.search(r"attention worker 1 at \S+ is leaving: moving the request elsewhere", log), b.log_tail()
    assert re.search(r"front end: admin: attention worker 1 at \S+ joins \(added; through /admin/attention\)", log), \
        b.log_tail()
    assert re.search(r"front end: admin: attention worker 0 at \S+ leaves \(through /admin/attention\)", log)
    assert re.search(r"front end: attention worker 0 at \S+ removed: drained", log)
