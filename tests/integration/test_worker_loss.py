"""Worker processes of `afd serve` that are lost for good (restarts exhausted or off).

A bundle whose worker cannot be restarted any more says so on /health (503 naming the
worker and that its restarts are exhausted), counts it in /metrics and logs it once; with
--exit-on-worker-loss `afd serve` drains and exits with status 1 so that a supervisor
restarts the whole bundle. Covers the FFN and attention worker children of
`--topology xAyF` and the FFN children of in-process `--spawn-ffn`.

Run: AFD_BIN=build/apps/afd /usr/bin/python3 -m pytest -q tests/integration/test_worker_loss.py
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
# Generous: CI is a loaded 2-core machine.
START_S = 90
EVENT_S = 60


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([AFD, "make-model", "--arch", "qwen3_moe", "--preset", "tiny", "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return str(out)


class Bundle:
    """One `afd serve` process and the worker processes it started; stopped by close()."""

    def __init__(self, args, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([AFD, "serve", "--port", "0", "--threads", "1", "--precision", "reference"] + args,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.port = int(self.wait_line(r"on http://127\.0\.0\.1:(\d+)").group(1))

    def _read(self):
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(line)
                self.cv.notify_all()

    def wait_line(self, pattern, timeout=START_S):
        deadline = time.time() + timeout
        with self.cv:
            while True:
                for line in self.lines:
                    m = re.search(pattern, line)
                    if m:
                        return m
                left = deadline - time.time()
                if left <= 0 or self.proc.poll() is not None:
                    pytest.fail(f"no line matching {pattern!r} from afd serve (exit {self.proc.poll()}): "
                                f"{self.lines} {self.stderr()[-2000:]}")
                self.cv.wait(min(left, 0.2))

    def stderr(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def children(self):
        pids = []
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                    pids += [int(p) for p in f.read().split()]
            except OSError:
                pass
        return pids

    def worker_pid(self, role, index=0):
        """The running worker process of that role and index (attention index / FFN shard)."""
        for pid in self.children():
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    argv = f.read().split("\0")
            except OSError:
                continue
            if "--role" not in argv or argv[argv.index("--role") + 1] != role:
                continue
            flag = "--attention-index" if role == "attention" else "--shard"
            if flag in argv and argv[argv.index(flag) + 1].split("/")[0] == str(index):
                return pid
        return None

    def kill_worker(self, role, index=0):
        """SIGKILLs the worker; returns its pid once it is gone."""
        pid = self.worker_pid(role, index)
        assert pid, f"no {role} worker {index} among {self.children()}"
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + EVENT_S
        while pid in self.children() and time.time() < deadline:
            time.sleep(0.05)
        return pid

    def wait_restarted(self, role, old_pid, index=0):
        deadline = time.time() + EVENT_S
        while time.time() < deadline:
            pid = self.worker_pid(role, index)
            if pid and pid != old_pid:
                return pid
            time.sleep(0.05)
        pytest.fail(f"{role} worker {index} was not restarted: {self.stderr()[-2000:]}")

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_health(self, predicate, timeout=EVENT_S):
        deadline = time.time() + timeout
        got = None
        while time.time() < deadline:
            got = self.get("/health")
            if predicate(*got):
                return got
            time.sleep(0.1)
        pytest.fail(f"/health never matched; last {got}; {self.stderr()[-2000:]}")

    def wait_exit(self, timeout=EVENT_S):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"afd serve did not exit within {timeout} s: {self.stderr()[-2000:]}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def bundle(tmp_path):
    """Starts bundles with bundle(args); stops every one of them after the test."""
    started = []

    def start(args):
        b = Bundle(args, str(tmp_path / f"serve{len(started)}.err"))
        started.append(b)
        return b

    yield start
    for b in started:
        b.close()


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def lose_ffn_worker(b):
    """With --worker-restarts 1: kills FFN worker 0 twice; the second exit exhausts its restarts."""
    b.wait_line("bundle complete")
    first = b.kill_worker("ffn")
    b.wait_restarted("ffn", first)
    b.kill_worker("ffn")


def test_exhausted_restarts_are_reported(model, bundle):
    b = bundle(["--model", model, "--topology", "1A1F", "--worker-restarts", "1"])
    lose_ffn_worker(b)
    status, body = b.wait_health(lambda st, body: st == 503 and "restarts exhausted" in body)
    msg = json.loads(body)["error"]["message"]
    assert msg.startswith("worker process lost for good"), msg
    assert "FFN worker 0/1" in msg and "restarts exhausted" in msg, msg
    _, metrics = b.get("/metrics")
    assert metric(metrics, 'afd_frontend_process_lost_total{process="FFN worker 0/1"}') == 1, metrics
    assert metric(metrics, 'afd_frontend_process_lost_total{process="attention worker 0"}') == 0, metrics
    assert metric(metrics, 'afd_frontend_process_restarts_total{process="FFN worker 0/1"}') == 1, metrics
    # Requests get 503 naming it first.
    status, body = b.post("/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 503, body
    assert "lost for good: FFN worker 0/1" in json.loads(body)["error"]["message"], body
    # Logged once, and the front end keeps serving /health and /metrics (no supervisor asked).
    time.sleep(1)
    assert b.stderr().count("is not restarted: restarts exhausted") == 1, b.stderr()[-3000:]
    assert b.proc.poll() is None


def test_exit_on_worker_loss_stops_the_bundle(model, bundle):
    b = bundle(["--model", model, "--topology", "1A1F", "--worker-restarts", "1", "--exit-on-worker-loss",
                "--drain-timeout-s", "5"])
    lose_ffn_worker(b)
    workers = b.children()
    assert b.wait_exit() == 1
    err = b.stderr()
    assert "stopped because a worker process is lost (--exit-on-worker-loss): FFN worker 0/1" in err, err[-3000:]
    assert "restarts exhausted" in err
    for pid in workers:  # the other workers went with it (gone, or a zombie not yet reaped by init)
        try:
            with open(f"/proc/{pid}/stat") as f:
                assert f.read().split()[2] == "Z", pid
        except FileNotFoundError:
            pass


def test_attention_worker_with_restarts_off_is_lost_at_its_first_exit(model, bundle):
    b = bundle(["--model", model, "--topology", "2A1F", "--worker-restarts", "0", "--exit-on-worker-loss",
                "--drain-timeout-s", "5"])
    b.wait_line("bundle complete")
    b.kill_worker("attention", 1)
    assert b.wait_exit() == 1
    err = b.stderr()
    assert re.search(r"lost \(--exit-on-worker-loss\): attention worker 1 \(process \d+\) exited \(signal 9\) and is "
                     r"not restarted: restarts are off", err), err[-3000:]


def test_spawn_ffn_child_lost(model, bundle):
    b = bundle(["--model", model, "--topology", "1A1F", "--spawn-ffn", "--worker-restarts", "0"])
    b.kill_worker("ffn")
    status, body = b.wait_health(lambda st, body: st == 503 and "lost for good" in body)
    assert "FFN worker 0/1" in body and "restarts are off" in body, body
    _, metrics = b.get("/metrics")
    assert metric(metrics, 'afd_frontend_process_lost_total{process="FFN worker 0/1"}') == 1, metrics

    c = bundle(["--model", model, "--topology", "1A1F", "--spawn-ffn", "--worker-restarts", "0",
                "--exit-on-worker-loss", "--drain-timeout-s", "5"])
    c.kill_worker("ffn")
    assert c.wait_exit() == 1
    assert "stopped because a worker process is lost (--exit-on-worker-loss): FFN worker 0/1" in c.stderr()


def test_exit_on_worker_loss_needs_worker_processes(model):
    r = subprocess.run([AFD, "serve", "--model", model, "--attention-workers", "127.0.0.1:1", "--exit-on-worker-loss"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--exit-on-worker-loss: --attention-workers starts no worker process" in r.stderr, r.stderr
