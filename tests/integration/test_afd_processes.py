"""Multi-process serving end to end, each check its own test.

- A 2A1F bundle started from one topology file as four separate processes (front end first,
  FFN worker last: any start order): greedy completions (JSON and SSE) equal an in-process
  `afd serve` with the same wire rounding (--afd-rounding 1); requests spread over both
  attention workers; /metrics federation; client hang-ups cancel; a rolling restart under
  load loses nothing; a killed attention worker leaves the other serving; a third attention
  worker added to the file (and started from it) joins on SIGHUP and leaves on the next.
- An FFN worker stalled (SIGSTOP, under a request and while idle) and lost (SIGKILL): /health
  and requests say so, naming it; it heals when the worker is back.
- `afd serve --topology 2A1F` (worker children, from a copy of the binary): serves, restarts a
  killed or stopped FFN worker (also after the binary was replaced on disk), drains on SIGTERM
  under load, merges the workers' --trace parts; --topology-file --spawn-workers; the worker
  ports stay reserved by the front end; --in-process.

Tests of one class share one bundle and are steps of one scenario: each checks the state the
tests before it left. Each test still runs alone (`-k name`): @step runs the earlier tests of
its class first, once (see `step`). Timeouts are afd_bundle.TIMEOUT (120 s) or longer: a
loaded 2-core machine.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_afd_processes.py
"""
import functools
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.client import RemoteDisconnected

import pytest

from afd_bundle import AFD, TIMEOUT, Bundle, Proc, free_port, free_ports, health, http, make_model, metric, wait_until
from afd_cli import afd

PROMPTS = [[3, 14, 15, 92, 65], [35], [89, 79, 32, 38, 46, 26, 43]]
WAITING_S = 60  # a process logging what it waits for: well under a second when idle


# ---- HTTP client -----------------------------------------------------------------------------

class NotAnswered(Exception):
    """The connection was refused or closed before any byte of an answer (a connection that
    sat in the listen backlog when the server closed its listener is reset)."""


def _post(port, body, timeout=TIMEOUT):
    """The response once its status line and headers came; NotAnswered if none came."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError:
        raise
    except urllib.error.URLError as e:  # failed while connecting or sending (a closed socket: EPIPE)
        if isinstance(e.reason, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)):
            raise NotAnswered(repr(e)) from e
        raise
    except (ConnectionResetError, BrokenPipeError, RemoteDisconnected) as e:  # before the status line
        raise NotAnswered(repr(e)) from e


def complete(port, p, n=12):
    with _post(port, {"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}) as r:
        c = json.load(r)["choices"][0]
        return c["text"] + "#" + c["finish_reason"]


def stream(port, p, n=12):
    text, fin, done = "", None, False
    with _post(port, {"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers["content-type"]
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            c = json.loads(line[6:])["choices"][0]
            text += c["text"]
            fin = c["finish_reason"] or fin
    assert done, "stream ended without [DONE]"
    return text + "#" + str(fin)


def compare(port):
    """Per prompt: (non-streaming answer, streaming answer)."""
    return [(complete(port, p), stream(port, p)) for p in PROMPTS]


def parallel(port):
    """How many of 6 concurrent requests succeeded."""
    res = []

    def one(i):
        try:
            res.append(complete(port, PROMPTS[i % 3], 24))
        except Exception:  # noqa: BLE001 - counted as not succeeded
            pass

    ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(res)


def tiny_request(port):
    """(status, Retry-After, error message) of a 2-token request, and its seconds."""
    t = time.time()
    try:
        with _post(port, {"prompt": [1], "max_tokens": 2}, timeout=30):
            return 200, None, None, time.time() - t
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Retry-After"), json.load(e)["error"]["message"], time.time() - t


class Load:
    """8 clients x 4 requests (JSON and SSE, 1500 tokens each) in the background. start()
    returns once the server has generated 200 more tokens (requests are in flight)."""

    def __init__(self, port):
        self.port = port
        self.ok, self.refused, self.errs, self.texts = [], [], [], {}
        self.lock = threading.Lock()
        base = metric(port, "afd_generation_tokens_total")
        self.threads = [threading.Thread(target=self._one, args=(i,)) for i in range(8)]
        for t in self.threads:
            t.start()
        wait_until(lambda: metric(port, "afd_generation_tokens_total") >= base + 200, "the load to start",
                   interval=0.1)

    def _one(self, i):
        for k in range(4):
            try:
                out = (complete if (i + k) % 2 else stream)(self.port, PROMPTS[(i + k) % 3], 1500)
                with self.lock:
                    (self.ok if out.endswith("#length") else self.errs).append(out)
                    self.texts.setdefault((i + k) % 3, set()).add(out)
            except urllib.error.HTTPError as e:  # refused before any work: 503 "draining", or
                # "shutting down" for one that came after the drain ended, before the listener closed
                m = e.read().decode()
                with self.lock:
                    (self.refused if e.code == 503 and ("draining" in m or "shutting down" in m)
                     else self.errs).append(m)
            except NotAnswered as e:  # the server has gone before answering: refused too; an
                # answer cut after its headers is an error (below)
                with self.lock:
                    self.refused.append(str(e))
            except Exception as e:  # noqa: BLE001 - cut mid-answer, error event, ...
                with self.lock:
                    self.errs.append(repr(e))

    def join(self):
        """(answered in full, refused, errors); a prompt with two different answers is an error."""
        for t in self.threads:
            t.join(3 * TIMEOUT)
        assert not any(t.is_alive() for t in self.threads), "load clients still running"
        errs = list(self.errs) + [f"prompt {p} got {len(v)} different answers" for p, v in self.texts.items()
                                  if len(v) > 1]
        return len(self.ok), len(self.refused), errs


def disconnect_stream(port):
    """Reads 3 events of a long stream, then hangs up."""
    r = _post(port, {"prompt": [5, 6, 7], "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True})
    n = 0
    for line in r:
        if line.startswith(b"data: "):
            n += 1
        if n == 3:
            break
    r.close()


def disconnect_json(port):
    """A long non-streaming request (4000 tokens: the tiny model's context is 4096) whose
    client hangs up after 0.3 s, well before the answer."""
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 4000, "temperature": 0, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.3)
    s.close()


def exposition_errors(port):
    """Why /metrics is not one valid exposition (a family's TYPE twice, a series twice)."""
    _, body = http(port, "/metrics", timeout=10)
    types, series, errors = set(), set(), []
    for l in body.splitlines():
        if l.startswith("# TYPE "):
            name = l.split()[2]
            if name in types:
                errors.append("TYPE twice: " + name)
            types.add(name)
        elif l and not l.startswith("#"):
            key = l.rsplit(" ", 1)[0]
            if key in series:
                errors.append("series twice: " + key)
            series.add(key)
    return errors


def trace_counts(path, *pids):
    """Complete-event counts by pid of a trace file, which must have events of one of each
    alternative of pids ((1, 2): attention worker 0 or 1, whichever the router placed on)."""
    ev = json.load(open(path))["traceEvents"]
    c = {}
    for e in ev:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0, e
            c[e["pid"]] = c.get(e["pid"], 0) + 1
    assert all(any(c.get(p, 0) > 0 for p in alt) for alt in pids), c
    return c


def workers_up(port):
    st, body = http(port, "/health", timeout=10)
    return json.loads(body).get("workers_up") if st == 200 else None


# ---- scenario steps --------------------------------------------------------------------------

_STEPS = {}  # class name -> its @step tests, in file order


@pytest.fixture(scope="class")
def ran():
    """The tests of this class already run on its bundle (as tests or as prerequisites)."""
    return set()


def step(test):
    """A test of a class whose tests are steps of one scenario on one class-scoped bundle.
    Before the test runs, the earlier tests of its class that have not run on this bundle yet
    run first, in file order, as its prerequisites (their fixtures looked up by name); a failing
    prerequisite fails the test, naming it. In a whole-file run every test finds the earlier
    ones done, so nothing runs twice and the suite takes as long as before; alone (-k) a test
    builds the state it checks."""
    steps = _STEPS.setdefault(test.__qualname__.rsplit(".", 1)[0], [])
    steps.append(test)
    sig = inspect.signature(test)

    @functools.wraps(test)
    def run(self, request, **fixtures):
        done = request.getfixturevalue("ran")
        mine = steps.index(test)
        later = [t.__name__ for t in steps[mine + 1:] if t.__name__ in done]
        assert not later, f"{test.__name__} runs after {later[0]} changed the bundle: run the class in file order"
        for t in steps[:mine]:
            if t.__name__ in done:
                continue
            done.add(t.__name__)
            args = {name: request.getfixturevalue(name) for name in list(inspect.signature(t).parameters)[1:]}
            try:
                t(self, **args)
            except (Exception, pytest.fail.Exception) as e:
                pytest.fail(f"prerequisite {t.__name__} failed: {type(e).__name__}: {e}")
        done.add(test.__name__)
        test(self, **fixtures)
    run.__signature__ = sig.replace(parameters=[*sig.parameters.values(),
                                                inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY)])
    return run


# ---- module fixtures -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("afd_processes")


@pytest.fixture(scope="module")
def model(tmp):
    return make_model(tmp / "model")


@pytest.fixture(scope="module")
def want(model, tmp):
    """The reference: in-process monolithic serving with the 1-FFN-worker wire rounding."""
    p = Proc(["serve", "--model", model, "--precision", "reference", "--afd-rounding", "1", "--threads", "1",
              "--port", "0"], tmp, "ref")
    try:
        return compare(p.port())
    finally:
        p.close()


# ---- bad invocations -------------------------------------------------------------------------

def test_attention_worker_without_ffn(model):
    r = afd("worker", "--role", "attention", "--model", model, "--listen", "127.0.0.1:1")
    assert r.returncode == 1 and "needs --ffn" in r.stderr, r


def test_bad_topology_file(tmp):
    bad = tmp / "bad.json"
    bad.write_text('{"model": "model", "attention": [{"address": "nohost"}], "ffn": [{"address": "127.0.0.1:2"}]}')
    r = afd("worker", "--topology-file", bad, "--role", "ffn", "--index", "0")
    assert r.returncode == 1 and "attention[0].address" in r.stderr, r


# ---- a 2A1F bundle from a topology file, four processes ----------------------------------------

@pytest.fixture(scope="class")
def tf(model, tmp):
    """The bundle's processes (started by the tests, in order) and its ports."""
    pf, pa0, pa1, pffn, pm = free_ports(5)
    topo = tmp / "topology.json"
    topo.write_text(json.dumps({
        "model": "model", "precision": "reference", "threads": 1, "microbatches": 2,
        "peer_timeout_ms": 2000, "ffn_connect_timeout_ms": 60000,
        "frontend": {"listen": f"127.0.0.1:{pf}"},
        "attention": [{"address": f"127.0.0.1:{pa0}"}, {"address": f"127.0.0.1:{pa1}", "microbatches": 1}],
        "ffn": [{"address": f"127.0.0.1:{pffn}", "metrics": f"127.0.0.1:{pm}"}]}))
    s = {"topo": topo, "pf": pf, "pa": [pa0, pa1], "pffn": pffn, "pm": pm, "procs": []}

    def start(name, args):
        p = Proc(["serve" if name == "fe" else "worker", "--topology-file", topo, *args], tmp, name)
        s["procs"].append(p)
        s[name] = p
        return p
    s["start"] = start
    yield s
    for p in s["procs"]:
        p.close()


class TestTopologyFileBundle:
    @step
    def test_front_end_logs_what_it_waits_for(self, tf):
        tf["start"]("fe", [])
        tf["start"]("a0", ["--role", "attention", "--index", "0"])
        tf["start"]("a1", ["--role", "attention", "--index", "1"])
        assert tf["fe"].wait_for("waiting for attention worker", timeout=WAITING_S), tf["fe"].text()

    @step
    def test_attention_worker_logs_what_it_waits_for(self, tf):
        assert tf["a0"].wait_for("waiting for FFN worker", timeout=WAITING_S), tf["a0"].text()

    @step
    def test_bundle_complete(self, tf):
        tf["start"]("f0", ["--role", "ffn", "--index", "0"])
        assert tf["fe"].wait_for("bundle complete: 2 attention workers \\+ 1 FFN worker up", "out"), \
            "\n".join(p.text()[-1000:] for p in tf["procs"])

    @step
    def test_completions_equal_in_process_serve(self, tf, want):
        assert compare(tf["pf"]) == want

    @step
    def test_concurrent_requests(self, tf):
        assert parallel(tf["pf"]) == 6

    @step
    def test_requests_placed_on_both_attention_workers(self, tf):
        r = [metric(tf["pf"], f'afd_frontend_worker_requests_total{{worker="{i}"') for i in (0, 1)]
        assert r[0] > 0 and r[1] > 0, r

    @step
    def test_ffn_worker_metrics(self, tf):
        """The FFN worker's own /metrics ("metrics" in the topology file): both attention
        workers served, tokens computed, every batch in the size histogram."""
        pm = tf["pm"]
        serving = metric(pm, 'afd_ffn_attention_workers{ffn="0",state="serving"')
        tokens, batches = metric(pm, "afd_ffn_tokens_total"), metric(pm, "afd_ffn_batches_total")
        hist = metric(pm, 'afd_ffn_batch_tokens_bucket{ffn="0",le="+Inf"')
        assert serving == 2 and tokens > 0 and batches > 0 and hist >= batches, (serving, tokens, batches, hist)
        tf["ffn_tokens"] = tokens

    @step
    def test_front_end_federates_the_bundle(self, tf):
        """Each attention worker's series (attention="i"), the FFN worker's (ffn="0"), one
        valid exposition."""
        pf = tf["pf"]
        a = [metric(pf, f'afd_generation_tokens_total{{attention="{i}"') for i in (0, 1)]
        ff = metric(pf, 'afd_ffn_tokens_total{ffn="0"')
        up = metric(pf, "afd_federation_target_up")
        assert a[0] > 0 and a[1] > 0 and ff >= tf.get("ffn_tokens", 1) and up == 3, (a, ff, up)
        assert exposition_errors(pf) == []

    @step
    def test_expert_counts_plan_a_placement(self, tf, tmp):
        """The FFN worker's per-(layer, expert) token counts, scraped from the front end's
        /metrics, add up to its (token, expert) pairs and are what `afd plan eplb` reads."""
        _, text = http(tf["pf"], "/metrics", timeout=10)
        counts = [l for l in text.splitlines() if l.startswith("afd_ffn_expert_tokens_total{")]
        pairs = sum(float(l.rsplit(" ", 1)[1]) for l in counts)
        assert counts and pairs == metric(tf["pf"], 'afd_ffn_expert_rows_total{ffn="0"'), (len(counts), pairs)
        f = tmp / "scraped_metrics.txt"
        f.write_text(text)
        r = afd("plan", "eplb", "--counts", f, "--ffn-workers", 2, "--redundant", 2, "--json")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert plan["replicas_per_worker"] == (plan["n_experts"] + 2) // 2 and plan["layers"], plan
        assert plan["eplb"]["max_max_over_mean"] <= plan["contiguous"]["max_max_over_mean"] + 1e-9, plan

    def cancelled(self, tf):
        return sum(metric(p, "afd_requests_cancelled_total") for p in tf["pa"])

    @step
    def test_stream_disconnect_cancels_the_sequence(self, tf):
        disconnect_stream(tf["pf"])
        wait_until(lambda: self.cancelled(tf) >= 1, "a cancelled sequence on an attention worker", interval=0.1)

    @step
    def test_json_disconnect_cancels_the_sequence(self, tf):
        """The front end notices the hang-up, closes the upstream exchange, the worker cancels."""
        before = self.cancelled(tf)
        disconnect_json(tf["pf"])
        wait_until(lambda: self.cancelled(tf) > before, "a cancelled sequence on an attention worker",
                   interval=0.1)

    @step
    def test_rolling_restart_under_load(self, tf):
        """SIGTERM to attention worker 0 under load: it drains, finishes what it accepted and
        exits; the front end places (and retries) on worker 1: no client sees an error."""
        load = Load(tf["pf"])
        tf["a0"].signal(signal.SIGTERM)
        ok, refused, errs = load.join()
        assert tf["a0"].stopped(), "attention worker 0 did not exit"
        dt = re.search(r"drained in [0-9.]+ s", tf["a0"].text())
        assert (ok, refused, errs) == (32, 0, []) and dt and dt.group(0) != "drained in 0.0 s", \
            (ok, refused, errs[:2], dt)

    @step
    def test_attention_worker_rejoins(self, tf):
        tf["start"]("a0b", ["--role", "attention", "--index", "0"])
        wait_until(lambda: workers_up(tf["pf"]) == 2, "workers_up 2", interval=0.1)

    @step
    def test_killed_attention_worker_other_answers(self, tf, want):
        tf["a0b"].signal(signal.SIGKILL)
        tf["a0b"].stopped()
        assert compare(tf["pf"]) == want, tf["fe"].text()[-2000:]

    @step
    def test_concurrent_requests_after_kill(self, tf):
        assert parallel(tf["pf"]) == 6

    @step
    def test_metrics_one_worker_up(self, tf):
        assert metric(tf["pf"], "afd_frontend_worker_up") == 1

    @step
    def test_metrics_after_kill_two_of_three_scraped(self, tf):
        assert metric(tf["pf"], "afd_federation_target_up") == 2
        assert exposition_errors(tf["pf"]) == []

    @step
    def test_topology_reload_on_sighup_adds_and_removes_an_attention_worker(self, tf):
        # A third attention worker in the file (index 2 of 3A1F; the FFN worker was started for
        # two): started from the new file, added by the front end on SIGHUP, removed again when
        # the old file comes back.
        old = tf["topo"].read_text()
        t = json.loads(old)
        pa2 = free_port()
        t["attention"].append({"address": f"127.0.0.1:{pa2}"})
        tf["topo"].write_text(json.dumps(t))
        tf["start"]("a2", ["--role", "attention", "--index", "2"])
        wait_until(lambda: health(pa2)[0] == 200, "attention worker 2 serving", interval=0.1)
        tf["fe"].signal(signal.SIGHUP)
        wait_until(lambda: workers_up(tf["pf"]) == 2, "attention workers 1 and 2 up", interval=0.1)
        assert metric(tf["pf"], 'afd_frontend_attention_membership_changes_total{change="join"}') == 1
        assert re.search(r"attention worker 2 at \S+ joins \(added; through topology file reload \(SIGHUP\)\)",
                         tf["fe"].text()), tf["fe"].text()[-2000:]
        assert tiny_request(tf["pf"])[0] == 200
        tf["topo"].write_text(old)
        tf["fe"].signal(signal.SIGHUP)
        wait_until(lambda: metric(tf["pf"], 'afd_frontend_attention_workers{state="removed"}') == 1,
                   "attention worker 2 removed", interval=0.1)
        assert tf["fe"].proc.poll() is None  # SIGHUP does not stop it
        tf["a2"].signal(signal.SIGTERM)
        assert tf["a2"].stopped()

    @step
    def test_no_attention_worker_503_retry_after(self, tf):
        tf["a1"].signal(signal.SIGTERM)
        assert tf["a1"].stopped()

        def refused():
            code, retry, _, _ = tiny_request(tf["pf"])
            return (code, retry) == (503, "1")
        wait_until(refused, "503 + Retry-After: 1 without attention workers", interval=0.2)

    @step
    def test_front_end_and_ffn_worker_stop_on_sigterm(self, tf):
        tf["fe"].signal(signal.SIGTERM)
        tf["f0"].signal(signal.SIGTERM)
        assert tf["fe"].stopped() and tf["f0"].stopped()


# ---- an FFN worker stalled and lost ------------------------------------------------------------

@pytest.fixture(scope="class")
def q(model, tmp):
    """A hand-started 1A1F bundle: FFN worker, attention worker (--ffn-timeout-ms 2000, no step
    retry) and front end."""
    qf, qa, qffn = free_ports(3)
    s = {"qf": qf, "qa": qa, "qffn": qffn, "procs": []}

    def ffn(name):
        p = Proc(["worker", "--role", "ffn", "--model", model, "--listen", f"127.0.0.1:{qffn}", "--precision",
                  "reference", "--threads", "1"], tmp, name)
        s["procs"].append(p)
        s["ffn"] = p
    s["start_ffn"] = ffn
    ffn("q_f")
    s["att"] = Proc(["worker", "--role", "attention", "--model", model, "--ffn", f"127.0.0.1:{qffn}", "--listen",
                     f"127.0.0.1:{qa}", "--precision", "reference", "--threads", "1", "--ffn-timeout-ms", "2000",
                     "--step-retry-s", "0"], tmp, "q_a")
    s["fe"] = Proc(["serve", "--model", model, "--attention-workers", f"127.0.0.1:{qa}", "--port", qf], tmp, "q_fe")
    s["procs"] += [s["att"], s["fe"]]
    s["complete"] = s["fe"].wait_for("bundle complete", "out")
    yield s
    for p in s["procs"]:
        p.close()


def wait_health(port, pred, what, timeout=TIMEOUT):
    """The /health (status, message) once pred holds for it."""
    got = []

    def cond():
        got[:] = [health(port)]
        return pred(*got[0])
    wait_until(cond, f"{what} (last: {got})", timeout=timeout, interval=0.1)
    return got[0]


class TestFfnWorkerStallAndLoss:
    @step
    def test_bundle_complete(self, q):
        assert q["complete"], q["fe"].text()[-2000:]

    @step
    def test_stalled_ffn_worker_503_then_at_once(self, q):
        """SIGSTOP: the request in flight fails after --ffn-timeout-ms; the attention worker then
        reports the stall on /health, so once the front end polled it, requests fail at once."""
        q["ffn"].signal(signal.SIGSTOP)
        c1 = tiny_request(q["qf"])
        wait_health(q["qf"], lambda st, m: st == 503 and m and "ffn0" in m, "front end /health naming ffn0")
        c2 = tiny_request(q["qf"])
        assert c1[0] == 503 and "no reply within" in c1[2], c1
        assert c2[0] == 503 and "ffn0" in c2[2], c2
        assert c2[3] < c1[3], f"the second request did not fail at once: {c1[3]:.1f} s then {c2[3]:.1f} s"

    @step
    def test_after_sigcont_same_answers(self, q, want):
        q["ffn"].signal(signal.SIGCONT)
        wait_health(q["qf"], lambda st, m: st == 200, "front end healthy")
        assert compare(q["qf"]) == want

    @step
    def test_idle_stall_seen_without_traffic(self, q):
        """The attention worker pings its FFN worker after a second without traffic
        (--ffn-probe-ms 1000); a pong overdue past --ffn-timeout-ms (2 s) turns /health 503.
        Not before the timeout; the upper bound is 3x the idle duration and more."""
        q["ffn"].signal(signal.SIGSTOP)
        t0 = time.time()
        st, m = wait_health(q["qa"], lambda st, m: st == 503, "attention worker /health 503")
        idle_s = time.time() - t0
        assert m.startswith("FFN worker 'ffn0' has not answered a liveness probe for "), m
        assert 1.5 <= idle_s <= 30, idle_s

    @step
    def test_front_end_health_names_idle_stall(self, q):
        wait_health(q["qf"], lambda st, m: st == 503 and m and
                    "worker 0: FFN worker 'ffn0' has not answered a liveness probe" in m,
                    "front end /health naming the idle stall")

    @step
    def test_after_sigcont_healthy_again(self, q):
        q["ffn"].signal(signal.SIGCONT)
        wait_health(q["qa"], lambda st, m: st == 200, "attention worker healthy")
        wait_health(q["qf"], lambda st, m: st == 200, "front end healthy")

    @step
    def test_idle_stall_logged(self, q):
        log = q["att"].text()
        assert "FFN worker 'ffn0' has not answered a liveness probe within 2000 ms" in log, log[-2000:]
        assert "FFN worker 'ffn0' answered its liveness probe again after" in log, log[-2000:]

    @step
    def test_attention_health_after_ffn_loss(self, q):
        q["ffn"].signal(signal.SIGKILL)
        q["ffn"].stopped()
        wait_health(q["qa"], lambda st, m: (st, m) == (503, "FFN worker 'ffn0' is not connected"),
                    "attention worker /health: FFN worker not connected")

    @step
    def test_front_end_health_names_lost_ffn_worker(self, q):
        wait_health(q["qf"], lambda st, m: st == 503 and m and "worker 0: FFN worker 'ffn0' is not connected" in m,
                    "front end /health naming the lost FFN worker")

    @step
    def test_request_while_ffn_worker_down(self, q):
        code, retry, msg, _ = tiny_request(q["qf"])
        assert (code, retry) == (503, "1") and "ffn0" in msg, (code, retry, msg)

    @step
    def test_ffn_worker_back(self, q, want):
        q["start_ffn"]("q_f2")
        wait_health(q["qf"], lambda st, m: st == 200, "front end healthy")
        assert compare(q["qf"]) == want


# ---- afd serve --topology 2A1F: worker children ------------------------------------------------

@pytest.fixture(scope="class")
def sp(model, tmp):
    """From a copy of the binary, which a test replaces on disk (as a rebuild would)."""
    (tmp / "bin").mkdir()
    binary = tmp / "bin" / "afd"
    shutil.copy(AFD, binary)
    s = {"binary": binary, "trace": tmp / "sp_trace.json"}
    try:
        s["b"] = Bundle(model, tmp, ["--topology", "2A1F", "--precision", "reference", "--threads", "1", "--trace",
                                     str(s["trace"])], binary=str(binary), name="sp")
    except RuntimeError as e:
        s["error"] = str(e)
    yield s
    if "b" in s:
        s["b"].close()


def restarts_logged(b):
    return b.err_path.read_text().count("restarted FFN worker 0/1 as process")


class TestSpawnWorkers:
    @step
    def test_bundle_complete_line(self, sp):
        assert "b" in sp, sp.get("error")
        assert "bundle complete: 2 attention workers + 1 FFN worker up" in sp["b"].out_path.read_text()

    @step
    def test_completions_equal_in_process_serve(self, sp, want):
        assert compare(sp["b"].port) == want

    @step
    def test_metrics_federate_ffn_worker(self, sp):
        """The spawned FFN worker gets a metrics port; the front end's /metrics carries it."""
        p = sp["b"].port
        assert metric(p, 'afd_ffn_tokens_total{ffn="0"') > 0
        assert metric(p, "afd_federation_target_up") == 3

    @step
    def test_killed_ffn_worker_under_load(self, sp):
        """SIGKILL of the FFN worker under load: the failed forward passes are retried once the
        restarted worker is back (--step-retry-s 30), every request completes, same answers."""
        b = sp["b"]
        load = Load(b.port)
        pid = b.worker_pid("ffn", 0)
        assert pid, b.children()
        os.kill(pid, signal.SIGKILL)
        ok, refused, errs = load.join()
        retries = metric(b.port, "afd_step_retries_total")
        assert (ok, errs) == (32, []) and retries >= 1, (ok, refused, errs[:2], retries)

    @step
    def test_killed_ffn_worker_restarted(self, sp, want):
        b = sp["b"]
        wait_until(lambda: restarts_logged(b) >= 1 and b.workers_up() == 2, "the FFN worker restarted",
                   interval=0.1)
        assert compare(b.port) == want

    @step
    def test_process_metrics(self, sp):
        p = sp["b"].port
        assert metric(p, 'afd_frontend_process_exits_total{process="FFN worker 0/1"') == 1
        assert metric(p, 'afd_frontend_process_restarts_total{process="FFN worker 0/1"') == 1
        assert metric(p, "afd_frontend_process_up") == 3

    @step
    def test_sigterm_restart_after_binary_replaced(self, sp, want):
        """Its second life ends with SIGTERM after the binary was replaced on disk: restarted
        from the running version (logged), same answers."""
        b, binary = sp["b"], sp["binary"]
        old = binary.with_name("afd.old")
        os.rename(binary, old)
        shutil.copy(old, binary)
        os.unlink(old)
        os.kill(b.worker_pid("ffn", 0), signal.SIGTERM)
        wait_until(lambda: restarts_logged(b) == 2 and b.workers_up() == 2, "the FFN worker restarted again",
                   interval=0.1)
        assert compare(b.port) == want
        assert "was replaced on disk: workers are restarted from the running version" in b.err_path.read_text()

    @step
    def test_sigterm_drains_under_load(self, sp):
        """The front end drains first (in-flight requests finish; new ones get 503 "draining"),
        then stops the workers."""
        b = sp["b"]
        load = Load(b.port)
        sp["workers"] = [pid for pid, _ in b.children()]
        b.proc.terminate()
        time.sleep(0.1)
        code, _, msg, _ = tiny_request(b.port)
        ok, refused, errs = load.join()
        try:
            b.proc.wait(timeout=3 * TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail("the front end did not stop")
        dt = re.search(r"drained in [0-9.]+ s", b.err_path.read_text())
        assert code == 503 and msg.startswith("the server is draining"), (code, msg)
        assert ok >= 8 and refused >= 1 and errs == [], (ok, refused, errs[:2])
        assert dt and dt.group(0) != "drained in 0.0 s", dt

    @step
    def test_spawned_workers_stopped(self, sp):
        assert len(sp.get("workers", [])) == 3

        def gone(pid):
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                return True
        wait_until(lambda: all(gone(p) for p in sp["workers"]), "the workers to stop", interval=0.1)

    @step
    def test_trace_merged(self, sp, tmp):
        """Each worker streamed its part and the front end merged them (attention workers pid 1
        and 2, the FFN worker pid 100) and removed them; the SIGKILLed life's part is cut short
        but merged up to its last flush (5 parts in all)."""
        err = sp["b"].err_path.read_text()
        cut = re.search(r"trace part merged: \S*ffn0\.life0\.json: cut short[^;]*; merged its (\d+) complete events",
                        err)
        trace_counts(sp["trace"], (1, 2), (100,))
        assert not list(tmp.glob("sp_trace.*.json"))
        # How many events the killed life flushed before its SIGKILL depends on scheduling (it
        # flushes every 200 ms); at least one shows that its cut-short part was merged.
        assert "merged 5 worker process traces" in err and cut and int(cut.group(1)) >= 1, \
            [l for l in err.splitlines() if "trace" in l][-5:]


# ---- --topology-file --spawn-workers -----------------------------------------------------------

@pytest.fixture(scope="module")
def topology2(model, tmp):
    tf_, ta0, ta1, tffn = free_ports(4)
    topo = tmp / "topology2.json"
    topo.write_text(json.dumps({
        "model": "model", "precision": "reference", "threads": 1, "microbatches": 2,
        "peer_timeout_ms": 2000, "ffn_connect_timeout_ms": 60000,
        "frontend": {"listen": f"127.0.0.1:{tf_}"},
        "attention": [{"address": f"127.0.0.1:{ta0}"}, {"address": f"127.0.0.1:{ta1}", "microbatches": 1}],
        "ffn": [{"address": f"127.0.0.1:{tffn}"}]}))
    return topo


def test_topology_file_trace_needs_spawn_workers(topology2, tmp):
    """Without --spawn-workers the front end has no engine to trace: a clear error."""
    r = afd("serve", "--topology-file", topology2, "--trace", tmp / "x.json")
    assert r.returncode != 0 and "needs --spawn-workers" in r.stderr, r


class TestTopologyFileSpawnWorkers:
    @step
    def test_completions_equal_in_process_serve(self, topology2, tmp, want):
        b = Bundle(None, tmp, ["--topology-file", str(topology2), "--spawn-workers", "--trace",
                               str(tmp / "tf_trace.json")], name="tf")
        try:
            assert "bundle complete: 2 attention workers + 1 FFN worker up" in b.out_path.read_text()
            assert compare(b.port) == want
        finally:
            b.proc.terminate()
            stopped = b.proc.wait(timeout=TIMEOUT) is not None
            b.close()
        assert stopped

    @step
    def test_trace_merged(self, tmp):
        trace_counts(tmp / "tf_trace.json", (1, 2), (100,))
        assert not list(tmp.glob("tf_trace.*.json"))


# ---- ports reserved ----------------------------------------------------------------------------

def test_killed_worker_port_stays_reserved(model, tmp):
    """The ports a bundle gives its workers stay reserved by the front end (bound, never
    listening): a worker down for a moment gets its port back. Checked on the FFN worker's
    metrics port: nothing connected to it, so no TIME_WAIT connection holds it."""
    b = Bundle(model, tmp, ["--topology", "1A1F", "--precision", "reference", "--threads", "1",
                            "--worker-restarts", "0"], name="rp")
    try:
        m = re.search(r"started FFN worker 0/1 as process (\d+) on 127\.0\.0\.1:\d+, metrics on 127\.0\.0\.1:(\d+)",
                      b.err_path.read_text())
        assert m, b.log_tail()
        pid, port = int(m.group(1)), int(m.group(2))
        assert pid in dict(b.children())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid not in dict(b.children()), "the FFN worker to be gone", interval=0.05)
        s = socket.socket()
        try:
            with pytest.raises(OSError) as e:
                s.bind(("127.0.0.1", port))
            assert e.value.errno == 98, e.value
        finally:
            s.close()
    finally:
        b.close()


# ---- --in-process ------------------------------------------------------------------------------

@pytest.fixture(scope="class")
def ip(model, tmp):
    b = Bundle(model, tmp, ["--topology", "2A1F", "--in-process", "--precision", "reference", "--threads", "1",
                            "--trace", str(tmp / "ip_trace.json")], name="ip", ready="on http://")
    yield b
    b.close()


class TestInProcess:
    @step
    def test_completions_equal_in_process_mono_serve(self, ip, want):
        assert compare(ip.port) == want

    @step
    def test_no_worker_process(self, ip):
        assert [argv for _, argv in ip.children() if "worker" in argv] == []

    @step
    def test_metrics_have_ffn_tokens(self, ip):
        assert metric(ip.port, 'afd_ffn_tokens_total{ffn="0.0"') > 0

    @step
    def test_trace_written_when_it_stops(self, ip, tmp):
        ip.proc.terminate()
        ip.proc.wait(timeout=TIMEOUT)
        trace_counts(tmp / "ip_trace.json", (1, 2), (100,))
