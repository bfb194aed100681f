"""Chaos test of attention-worker failover (docs/DEPLOYMENT.md, "Attention worker failover").

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

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

AFD = os.environ.get("AFD_BIN", "build/apps/afd")
IDLE_S = 3  # --upstream-idle-timeout-s
STOP_S = IDLE_S + 3  # how long an attention worker stays stopped
TIMEOUT = 120  # generous: a loaded 2-core machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([AFD, "make-model", "--arch", "qwen3_moe", "--preset", "tiny", "--out", str(d)],
                   check=True, capture_output=True, timeout=TIMEOUT)
    return d


class Bundle:
    """An `afd serve --topology 2A1F` process tree, owned by the test (closed on teardown)."""

    def __init__(self, model, logdir):
        self.out_path, self.err_path = logdir / "serve.out", logdir / "serve.err"
        # Settings under which a sequence's tokens do not depend on what else runs: the
        # portable kernels (the vectorised ones take another path for one token than for
        # several, so a logit's last bits, and with them a near tie, depend on the batch and on
        # the other attention worker's rows in the FFN worker's batch), one sequence per
        # attention worker at a time, no prefix cache. Without them two unfaulted runs of these
        # requests already differ now and then; with them failover is what is tested.
        env = dict(os.environ, AFD_CPU_DISABLE="all")
        self.proc = subprocess.Popen(
            [AFD, "serve", "--model", str(model), "--topology", "2A1F", "--port", "0", "--precision", "reference",
             "--threads", "1", "--max-running", "1", "--no-prefix-cache", "--upstream-idle-timeout-s", str(IDLE_S),
             "--failover-timeout-s", "60"],
            stdout=open(self.out_path, "w"), stderr=open(self.err_path, "w"), start_new_session=True, env=env)
        self.port = None
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and self.proc.poll() is None:
            for line in self.out_path.read_text().splitlines():
                if "bundle complete" in line:
                    self.port = int(line.rsplit(":", 1)[1])
            if self.port:
                return
            time.sleep(0.1)
        raise RuntimeError("the bundle did not come up:\n" + self.log_tail())

    def log_tail(self, n=30):
        return "\n".join(self.err_path.read_text().splitlines()[-n:])

    def children(self):
        """(pid, argv) of the front end's child processes: the workers it started."""
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    out.append((int(p), f.read().decode(errors="replace").split("\0")))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def attention_pid(self, index):
        for pid, argv in self.children():
            if "--role" in argv and argv[argv.index("--role") + 1] == "attention" and \
                    argv[argv.index("--attention-index") + 1] == str(index):
                return pid
        return None

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name):
        """Sum of the front end's own samples of a series (prefix match on name{labels)."""
        _, text = self.get("/metrics")
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name))

    def workers_up(self):
        st, body = self.get("/health")
        return json.loads(body).get("workers_up", 0) if st == 200 else 0

    def close(self):
        for pid, _ in self.children():
            try:
                os.kill(pid, signal.SIGCONT)  # a stopped worker must be able to stop
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left of this process group
        except OSError:
            pass
        self.proc.wait()


@pytest.fixture
def bundle(model_dir, tmp_path):
    b = Bundle(model_dir, tmp_path)
    try:
        yield b
    finally:
        b.close()


def requests_of(wave):
    """Greedy and seeded requests, completions and chat, streaming and not, some with logprobs."""
    out = []
    for i in range(8):
        chat = i % 4 >= 2
        body = {"max_tokens": 2000 + 60 * i, "ignore_eos": i % 3 != 2, "stream": i % 2 == 0}
        if i in (3, 6):
            body.update(temperature=1.0, top_p=0.9, seed=1000 * wave + i)
        else:
            body["temperature"] = 0
        if i in (0, 3):
            body["logprobs"] = True if chat else 2
            if chat:
                body["top_logprobs"] = 2
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        text = f"wave {wave} request {i}: tell me about failover number {i * 7 + wave}"
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        out.append(("/v1/chat/completions" if chat else "/v1/completions", body))
    return out


def normalise(path, body, raw_chunks):
    """What must equal between an unfaulted and a faulted run: the chunk payloads (stream)
    or the body, without id / created (checked for consistency instead)."""
    if not body["stream"]:
        j = json.loads(raw_chunks[0])
        assert j["id"].startswith("chatcmpl-" if "chat" in path else "cmpl-")
        return {k: v for k, v in j.items() if k not in ("id", "created")}
    assert raw_chunks and raw_chunks[-1] == "[DONE]", raw_chunks[-3:]
    chunks = [json.loads(c) for c in raw_chunks[:-1]]
    for c in chunks:
        assert "error" not in c, c
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1, "one id per answer"
    return [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]


class Client:
    """Runs requests concurrently; counts streamed chunks so the test can time its faults."""

    def __init__(self, port):
        self.port = port
        self.chunks = 0
        self.lock = threading.Lock()

    def one(self, path, body, results, key):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                if not body["stream"]:
                    results[key] = normalise(path, body, [r.read().decode()])
                    return
                raw = []
                for line in r:
                    line = line.decode()
                    if line.startswith("data: "):
                        raw.append(line[6:].strip())
                        with self.lock:
                            self.chunks += 1
                results[key] = normalise(path, body, raw)
        except Exception as e:  # noqa: BLE001 - every failure is reported with its request
            results[key] = e

    def start(self, reqs, results, tag):
        ts = [threading.Thread(target=self.one, args=(p, b, results, (tag, i))) for i, (p, b) in enumerate(reqs)]
        for t in ts:
            t.start()
        return ts


def same(a, b):
    """Equal, but logprobs (the only floats) within 1e-3: their last bits depend on the batch a
    token was computed in and on prefix-cache reuse even without faults. Text, tokens, finish
    reasons and usage must be exactly equal."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-3
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def first_difference(a, b):
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if not same(x, y):
                return f"chunk {i}: {x} != {y}"
        return f"lengths {len(a)} != {len(b)}"
    return f"{a} != {b}"


def wait_until(cond, what, timeout=TIMEOUT):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError("timed out waiting for " + what)


def test_attention_worker_failover_under_kill_and_stop(bundle):
    waves = {1: requests_of(1), 2: requests_of(2)}
    client = Client(bundle.port)

    # The unfaulted answers, from the same bundle.
    ref = {}
    threads = [t for w, reqs in waves.items() for t in client.start(reqs, ref, w)]
    for t in threads:
        t.join(TIMEOUT)
    errors = {k: v for k, v in ref.items() if isinstance(v, Exception)}
    assert not errors and len(ref) == 16, errors

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
