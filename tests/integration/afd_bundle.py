"""Shared helpers of the pytest integration tests that run `afd serve` bundles and worker
processes (test_afd_processes.py, test_attention_failover.py, test_ffn_failover.py,
test_chaos_2a2f.py, test_afd_cli.py).

- Bundle: one `afd serve` process tree owned by the test (its own session; close() stops it
  and whatever is left of its process group). Tests signal only the processes it started
  (Bundle.worker_pid) or that they started themselves.
- Proc: any one afd process the test starts (serve, worker, generate) in its own session,
  with wait_for(log line) and close() (its own process group only).
- free_port, free_ports, start_ffn_worker: an FFN worker the test starts by hand (to add it to
  a bundle); metric, health: one /metrics series, /health's status and message.
- mixed_requests, Client, normalise, same, first_difference: concurrent greedy and seeded
  requests (completions and chat, streaming and not, some with logprobs) whose answers are
  compared with an unfaulted run's.

AFD_BIN names the afd executable (default build/apps/afd).
"""

import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

AFD = os.environ.get("AFD_BIN", "build/apps/afd")
TIMEOUT = 120  # generous: a loaded 2-core machine

# Settings under which a sequence's tokens do not depend on what else runs, so that an
# unfaulted run is reproducible to the bit and a failover is what a comparison tests:
# - AFD_CPU_DISABLE=all: the portable kernels. The vectorised ones take another path for one
#   token than for several, so a logit's last bits (and with them a near tie) depend on the
#   batch, and on the other attention workers' rows in an FFN worker's batch.
# - --max-running 1: one sequence per attention worker at a time (the same batches whatever
#   else was sent).
# - --no-prefix-cache: a reused block holds the KV of whichever request computed it.
# Without them two unfaulted concurrent runs of the same requests already differ now and then
# (docs/FAILOVER.md, "Limits").
DETERMINISTIC_ENV = {"AFD_CPU_DISABLE": "all"}
DETERMINISTIC_ARGS = ["--precision", "reference", "--threads", "1", "--max-running", "1", "--no-prefix-cache"]


def free_ports(n):
    """n distinct free ports (see free_port)."""
    got = set()
    while len(got) < n:
        got.add(free_port())
    return list(got)


def metric(port, name):
    """Sum of the samples of a series on 127.0.0.1:port/metrics (prefix match on name{labels)."""
    _, text = http(port, "/metrics", timeout=10)
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name))


def health(port):
    """(status, error message or None) of GET /health; (None, error) when nothing answers."""
    try:
        st, body = http(port, "/health", timeout=10)
    except OSError as e:
        return None, str(e)
    if st == 200:
        return 200, None
    try:
        return st, json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return st, body


class Proc:
    """One afd process the test starts (`argv` after the executable) in its own session, its
    output in logdir/name.out and .err; close() stops it and whatever is left of its process
    group."""

    def __init__(self, argv, logdir, name, env=None, binary=None):
        self.out_path, self.err_path = logdir / f"{name}.out", logdir / f"{name}.err"
        self.proc = subprocess.Popen([binary or AFD, *map(str, argv)], stdout=open(self.out_path, "w"),
                                     stderr=open(self.err_path, "w"), start_new_session=True,
                                     env=dict(os.environ, **(env or {})))
        self.pid = self.proc.pid

    def text(self, which="err"):
        return (self.err_path if which == "err" else self.out_path).read_text()

    def wait_for(self, pattern, which="err", timeout=TIMEOUT):
        """The first match of the regex in its stdout ("out") or stderr ("err"), waiting up to
        timeout; None if it did not come (or the process exited without it)."""
        deadline = time.time() + timeout
        while True:
            exited = self.proc.poll() is not None
            m = re.search(pattern, self.text(which))
            if m or exited or time.time() > deadline:
                return m
            time.sleep(0.1)

    def port(self):
        m = self.wait_for(r"on http://[^\s/]+:(\d+)", "out")
        assert m, "no listening line:\n" + self.text()[-2000:]
        return int(m.group(1))

    def signal(self, sig):
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def stopped(self, timeout=TIMEOUT):
        """Whether it exits within timeout."""
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def close(self):
        try:
            os.killpg(self.pid, signal.SIGCONT)  # a stopped process must be able to stop
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            self.stopped(30)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()


def make_model(out):
    subprocess.run([AFD, "--log-level", "error", "make-model", "--arch", "qwen3_moe", "--preset", "tiny", "--seed", "1",
                    "--out", str(out)], check=True, capture_output=True, timeout=TIMEOUT)
    return out


def free_port():
    """A free 127.0.0.1 port below the kernel's ephemeral range (no outgoing connection takes
    it meanwhile)."""
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    pool = range(10000, lo) if lo - 10000 >= 1000 else range(1024, 65536)
    for port in random.sample(pool, 200):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            pass
        finally:
            s.close()
    raise RuntimeError("no free port")


def start_ffn_worker(model, port, shard, n_attention, log_path, precision="reference", env=None):
    """`afd worker --role ffn` on 127.0.0.1:port (shard "i/y": its name on the wire is ffn<i>).
    precision must be the bundle's: the handshake refuses another one."""
    return subprocess.Popen(
        [AFD, "worker", "--role", "ffn", "--model", str(model), "--listen", f"127.0.0.1:{port}", "--shard", shard,
         "--attention", str(n_attention), "--precision", precision, "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=open(log_path, "w"), env=dict(os.environ, **(env or {})))


def wait_until(cond, what, timeout=TIMEOUT, interval=0.005):
    """Polls cond() until it is true; connection errors and missing keys count as not yet."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            pass
        time.sleep(interval)
    raise AssertionError("timed out waiting for " + what)


def http(port, path, body=None, timeout=60, method=None):
    """(status, text) of one exchange; an error status is returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Bundle:
    """An `afd serve` process tree started with `args` (after --model and --port 0), owned by
    the test: close() stops it. Waits for the "bundle complete" line."""

    def __init__(self, model, logdir, args, env=None, binary=None, name="serve", ready="bundle complete"):
        """model None: args are the whole `afd serve` command line (e.g. --topology-file F).
        binary: the afd executable (default AFD); name: the log files' stem (logdir/name.out,
        .err); ready: the stdout text that says it serves (its line names the port)."""
        self.out_path, self.err_path = logdir / f"{name}.out", logdir / f"{name}.err"
        argv = ["serve", *args] if model is None else ["serve", "--model", str(model), "--port", "0", *args]
        self.proc = subprocess.Popen([binary or AFD, *argv],
                                     stdout=open(self.out_path, "w"), stderr=open(self.err_path, "w"),
                                     start_new_session=True, env=dict(os.environ, **(env or {})))
        self.port = None
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and self.proc.poll() is None:
            for line in self.out_path.read_text().splitlines():
                m = re.search(r"on http://[^\s/]+:(\d+)", line)
                if ready in line and m:
                    self.port = int(m.group(1))
            if self.port:
                return
            time.sleep(0.1)
        self.close()
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

    def worker_pid(self, role, index):
        """The running child of that role: attention worker `index`, or FFN worker of shard `index`."""
        flag = "--attention-index" if role == "attention" else "--shard"
        for pid, argv in self.children():
            if "--role" in argv and argv[argv.index("--role") + 1] == role and flag in argv and \
                    argv[argv.index(flag) + 1].split("/")[0] == str(index):
                return pid
        return None

    def worker_listen(self, role, index):
        """The --listen address of that child (see worker_pid)."""
        pid = self.worker_pid(role, index)
        argv = dict(self.children())[pid]
        return argv[argv.index("--listen") + 1]

    def attention_pid(self, index):
        return self.worker_pid("attention", index)

    def get(self, path):
        return http(self.port, path, timeout=10)

    def post(self, path, body):
        return http(self.port, path, body)

    def metric(self, name):
        """Sum of the samples of a series (prefix match on name{labels)."""
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


def mixed_requests(wave, n=8, base_tokens=2000, step_tokens=60):
    """n requests: greedy and seeded (temperature 1), completions and chat, streaming and not,
    some with logprobs; most ignore EOS (max_tokens base_tokens + step_tokens * i)."""
    out = []
    for i in range(n):
        chat = i % 4 >= 2
        body = {"max_tokens": base_tokens + step_tokens * i, "ignore_eos": i % 3 != 2, "stream": i % 2 == 0}
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


def read_completion_stream(lines, on_first=None):
    """A /v1/completions SSE answer (an iterable of its lines, bytes): (text, finish_reason,
    completion_tokens or None, whether [DONE] came, the error event's line or None). on_first()
    runs when the first text arrives."""
    text, fin, usage = "", None, None
    for line in lines:
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return text, fin, usage, True, None
        j = json.loads(line[6:])
        if "error" in j:
            return text, fin, usage, False, line
        if j.get("usage"):
            usage = j["usage"]["completion_tokens"]
        for c in j.get("choices", []):
            if on_first and not text and c["text"]:
                on_first()
            text += c["text"]
            fin = c["finish_reason"] or fin
    return text, fin, usage, False, None


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


def usage_of(answer):
    """The usage of a normalised answer (the last chunk's, for a stream)."""
    if isinstance(answer, list):
        return next(c["usage"] for c in reversed(answer) if c.get("usage"))
    return answer["usage"]


class Client:
    """Runs requests concurrently; counts streamed chunks so a test can time its faults."""

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

    def run_all(self, waves):
        """Runs every request of waves ({tag: [(path, body)]}) at once; their answers by (tag, i).
        Fails the test if one failed."""
        results = {}
        threads = [t for tag, reqs in waves.items() for t in self.start(reqs, results, tag)]
        for t in threads:
            t.join(TIMEOUT)
        errors = {k: v for k, v in results.items() if isinstance(v, Exception)}
        assert not errors and len(results) == sum(len(r) for r in waves.values()), errors
        return results

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


def check_answers(got, ref, waves, wave_names, log_tail):
    """Every request of `waves` answered (no exception), each answer the unfaulted run's `ref`
    (same()), and its usage the unfaulted one's, consistent, and max_tokens where EOS was ignored.
    got / ref: {(wave, i): answer}; waves[wave][i] = (path, body); wave_names[wave] names it in
    a failure; log_tail(): the bundle's log for the message."""
    errors = {k: v for k, v in got.items() if isinstance(v, Exception)}
    assert not errors, f"{errors}\n{log_tail()}"
    assert len(got) == len(ref)
    differ = [key for key, want in ref.items() if not same(got[key], want)]
    assert not differ, "differ from the unfaulted run: " + "; ".join(
        f"wave {wave_names[k[0]]} request {k[1]} first at {first_difference(ref[k], got[k])}" for k in differ) + \
        "\n" + log_tail()
    for (k, i), answer in got.items():
        body = waves[k][i][1]
        u = usage_of(answer)
        assert u == usage_of(ref[(k, i)]) and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
        if body["ignore_eos"]:
            assert u["completion_tokens"] == body["max_tokens"], (body, u)
