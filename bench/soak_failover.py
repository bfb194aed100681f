#!/usr/bin/python3
"""Soak of `afd serve --topology 2A2F` under many worker faults: are requests lost, and what
does each kind of fault cost the clients?

Starts the bundle (tiny model, made here unless --model is given; the experts cut into 4
parts so up to 4 FFN workers share them), runs CLIENTS closed-loop clients (greedy
completions, every other one streaming, prompts from a fixed set), measures an unfaulted
baseline, then applies faults one at a time, cycling through the kinds below, each followed
by a quiet gap, until --minutes have passed:

  att_kill      SIGKILL of an attention worker (alternating 0/1; the launcher restarts it)
  att_stop      SIGSTOP of an attention worker for --stop-s (> --upstream-idle-timeout-s), SIGCONT
  ffn_kill      SIGKILL of a launcher FFN worker (restarted by the launcher: it rejoins)
  ffn_stop      SIGSTOP of a launcher FFN worker for --stop-s, SIGCONT (the others take over its
                parts after --ffn-takeover-s; it rejoins when continued)
  ffn_join      an FFN worker started here joins through the front end's POST /admin/ffn
  ffn_loss      that FFN worker is SIGKILLed and not restarted (the others take over its parts);
                then removed through /admin/ffn

A client that gets 503 + Retry-After (no attention worker could take a new request: e.g. both
report an FFN worker lost until the takeover) waits and sends the same request again: that is
a refusal, not a loss. A request is lost when it was not answered in full: another status, an
error event or a stream without [DONE], a cut connection, fewer tokens than max_tokens (EOS is
ignored), or no answer within --request-timeout-s. An answer whose text differs from the first
answer to the same prompt is counted as such (batching can flip a near tie even without faults:
compare with the baseline's count).

Per fault kind: the requests it affected (in flight at the fault, or sent until it ended — the
SIGCONT of a stop — plus 1 s), their latency p50/p99 and what it adds to the baseline's, and
the time to recover: if the completions of a 1 s window fall below 75% of the baseline's rate
within 5 s of the fault's end, the time from the fault's start until a 1 s window reaches that
rate again (0 if they do not fall).

--report FILE prints the table again from a run's --json FILE.

usage: bench/soak_failover.py AFD [--minutes M] [--clients N] [--max-tokens T] [--model DIR]
                              [--json FILE] [--report FILE] [-- extra `afd serve` flags]
"""
import argparse
import http.client
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "integration"))
import afd_bundle  # noqa: E402  (the integration tests' bundle fixture: process tree, ports)

PROMPTS = [f"soak prompt {i}: the quick brown fox number {i * 13} jumps over" for i in range(16)]
# ffn_loss right after ffn_join: the added worker is there for one gap only (a fifth worker
# process on a small machine slows every step, which would blur the other faults' figures).
KINDS = ("att_kill", "att_stop", "ffn_kill", "ffn_stop", "ffn_join", "ffn_loss")


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Load:
    """Closed-loop clients; every request's (client start, end, outcome, tries, text ok)."""

    def __init__(self, port, clients, max_tokens, timeout_s):
        self.port, self.max_tokens, self.timeout_s = port, max_tokens, timeout_s
        self.records = []  # dicts: start, end, ok, why, refusals, prompt, text
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.first_text = {}
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(self.timeout_s + 10)

    def one(self, prompt, stream):
        """(ok, why, text, refused): one exchange."""
        body = {"prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status == 503 and r.getheader("Retry-After"):
                r.read()
                return False, "503", "", float(r.getheader("Retry-After"))
            if r.status != 200:
                return False, f"{r.status}: {r.read()[:200]!r}", "", None
            if not stream:
                j = json.loads(r.read())
                n = j["usage"]["completion_tokens"]
                return n == self.max_tokens, f"{n} tokens", j["choices"][0]["text"], None
            text, _, usage, done, error = afd_bundle.read_completion_stream(r)
            if error:
                return False, f"error event: {error[:200]}", text, None
            ok = done and usage == self.max_tokens
            return ok, "" if ok else f"stream ended: done={done} usage={usage}", text, None
        except Exception as e:  # noqa: BLE001 - a lost request, reported with why
            return False, repr(e)[:200], "", None
        finally:
            c.close()

    def client(self, i):
        k = i
        while not self.stop.is_set():
            prompt, stream = PROMPTS[k % len(PROMPTS)], k % 2 == 0
            k += 7
            start, refusals = time.time(), 0
            while True:
                ok, why, text, retry = self.one(prompt, stream)
                if retry is None or self.stop.is_set() or time.time() - start > self.timeout_s:
                    break
                refusals += 1
                time.sleep(min(retry, 1.0) / 4)
            end = time.time()
            with self.lock:
                same = None
                if ok:
                    same = self.first_text.setdefault(prompt, text) == text
                self.records.append({"start": start, "end": end, "ok": ok, "why": why, "refusals": refusals,
                                     "same": same})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("afd")
    ap.add_argument("--minutes", type=float, default=4)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--baseline-s", type=float, default=30)
    ap.add_argument("--gap-s", type=float, default=10, help="quiet time after each fault")
    ap.add_argument("--stop-s", type=float, default=6, help="SIGSTOP length (> the idle timeout 3 s, and > the "
                    "FFN probe timeout 3 s + takeover 2 s)")
    ap.add_argument("--precision", default="fast", help="of every worker (the bundle's and those added here)")
    ap.add_argument("--request-timeout-s", type=float, default=120)
    ap.add_argument("--model", help="model directory (default: a tiny one made here)")
    ap.add_argument("--json", help="write every request and fault here")
    ap.add_argument("--report", help="only print the table of a run's --json file")
    argv, serve_args = sys.argv[1:], []
    if "--" in argv:  # extra `afd serve` flags follow
        argv, serve_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    a = ap.parse_args(argv)
    a.serve_args = serve_args
    if a.report:
        with open(a.report) as f:
            d = json.load(f)
        return report(d["records"], d["faults"], d["baseline_end"], d.get("clients", a.clients),
                      d.get("max_tokens", a.max_tokens), d.get("metrics", ""))
    afd_bundle.AFD = a.afd
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="afd_soak_"))
    model = a.model or afd_bundle.make_model(tmp / "tiny")
    idle_s, takeover_s = 3, 2
    b = afd_bundle.Bundle(model, tmp, ["--topology", "2A2F", "--ffn-parts", "4", "--threads", "1",
                                       "--precision", a.precision,
                                       "--upstream-idle-timeout-s", str(idle_s), "--ffn-takeover-s", str(takeover_s),
                                       "--ffn-timeout-ms", "3000", "--step-retry-s", "60", *a.serve_args])
    print(f"bundle up on port {b.port}; log {b.err_path}", flush=True)
    added = []  # FFN worker processes started here
    faults = []  # kind, start, end, note
    load = Load(b.port, a.clients, a.max_tokens, a.request_timeout_s)
    try:
        load.start()
        time.sleep(a.baseline_s)
        t_base_end = time.time()
        deadline = time.time() + a.minutes * 60 - a.baseline_s
        n, next_shard, joined = 0, 2, None
        while time.time() < deadline:
            kind = KINDS[n % len(KINDS)]
            who = n // len(KINDS) % 2  # alternate the targets round by round
            n += 1
            t = time.time()
            note = ""
            if kind == "att_kill":
                pid = b.worker_pid("attention", who)
                os.kill(pid, signal.SIGKILL)
                note = f"attention worker {who} (process {pid})"
            elif kind in ("att_stop", "ffn_stop"):
                role = "attention" if kind == "att_stop" else "ffn"
                pid = b.worker_pid(role, who)
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(a.stop_s)
                finally:
                    os.kill(pid, signal.SIGCONT)
                note = f"{role} worker {who} (process {pid}) for {a.stop_s} s"
            elif kind == "ffn_kill":
                pid = b.worker_pid("ffn", who)
                os.kill(pid, signal.SIGKILL)
                note = f"FFN worker {who} (process {pid})"
            elif kind == "ffn_join":
                port = afd_bundle.free_port()
                shard = f"{next_shard}/{next_shard + 1}"
                next_shard += 1
                p = afd_bundle.start_ffn_worker(model, port, shard, 2, tmp / f"ffn{shard.split('/')[0]}.log",
                                                precision=a.precision)
                added.append(p)
                st, body = b.post("/admin/ffn", {"add": f"127.0.0.1:{port}"})
                joined = (p, f"127.0.0.1:{port}") if st == 200 else None
                note = f"FFN worker {shard} at 127.0.0.1:{port}: {st}"
            elif kind == "ffn_loss":
                if joined is None:
                    continue
                p, addr = joined
                os.kill(p.pid, signal.SIGKILL)
                note = f"added FFN worker at {addr} (process {p.pid})"
            t_end = time.time()
            faults.append({"kind": kind, "start": t, "end": t_end, "note": note})
            print(f"{t - t_base_end:8.1f} s  {kind:9s} {note}", flush=True)
            time.sleep(a.gap_s)
            if kind == "ffn_loss":  # tidy: the dead worker leaves the membership
                afd_bundle.wait_until(lambda: b.post("/admin/ffn", {"remove": joined[1]})[0] == 200,
                                      "the lost FFN worker's removal", timeout=30, interval=0.5)
                joined = None
        load.finish()
    finally:
        load.stop.set()
        for p in added:
            if p.poll() is None:
                p.kill()
            p.wait()
        metrics = b.get("/metrics")[1] if b.proc.poll() is None else ""
        b.close()
    report(load.records, faults, t_base_end, a.clients, a.max_tokens, metrics)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"records": load.records, "faults": faults, "baseline_end": t_base_end, "clients": a.clients,
                       "max_tokens": a.max_tokens, "metrics": metrics}, f)


def recovery(ends, f, rate):
    """Seconds from fault f's start until completions are back to `rate` per 1 s window, if they
    fell below it within 5 s of its end; 0 if they did not; inf if not within 60 s."""
    def window(t):
        return sum(1 for e in ends if t <= e < t + 1)
    t = f["start"]
    while t < f["end"] + 5 and window(t) >= rate:
        t += 0.1
    if t >= f["end"] + 5:
        return 0.0
    while t < f["end"] + 60:
        if window(t) >= rate:
            return t - f["start"]
        t += 0.1
    return float("inf")


def report(records, faults, t_base_end, clients, max_tokens, metrics):
    t0 = min(r["start"] for r in records)
    base = [r for r in records if r["end"] <= t_base_end and r["start"] >= t0 + 5 and r["ok"]]  # warmed up
    base_lat = [r["end"] - r["start"] for r in base]
    base_rate = len(base) / max(1e-9, t_base_end - t0 - 5)
    lost = [r for r in records if not r["ok"]]
    print(f"\nrequests sent {len(records)}, completed {len(records) - len(lost)}, lost {len(lost)}; "
          f"refusals (503 + Retry-After, sent again) {sum(r['refusals'] for r in records)}; "
          f"answers differing from the first of their prompt: {sum(1 for r in records if r['same'] is False)} "
          f"(baseline {sum(1 for r in base if r['same'] is False)})")
    for r in lost[:20]:
        print(f"  lost at {r['start'] - t0:.1f}-{r['end'] - t0:.1f} s: {r['why']}")
    print(f"baseline: {len(base)} requests, {base_rate:.1f}/s, latency p50 {percentile(base_lat, 0.5) * 1e3:.0f} ms, "
          f"p99 {percentile(base_lat, 0.99) * 1e3:.0f} ms ({clients} clients, max_tokens {max_tokens})")
    print(f"\n| fault | n | requests affected | lost | p50 ms (added) | p99 ms (added) | recover s (max) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ends = sorted(r["end"] for r in records if r["ok"])
    for kind in KINDS:
        fs = [f for f in faults if f["kind"] == kind]
        if not fs:
            continue
        hit, recover = [], []
        for f in fs:
            hit += [r for r in records if r["start"] <= f["end"] + 1 and r["end"] >= f["start"]]
            recover.append(recovery(ends, f, 0.75 * base_rate))
        lat = [r["end"] - r["start"] for r in hit if r["ok"]]
        p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        print(f"| {kind} | {len(fs)} | {len(hit)} | {sum(1 for r in hit if not r['ok'])} | "
              f"{p50 * 1e3:.0f} ({(p50 - percentile(base_lat, 0.5)) * 1e3:+.0f}) | "
              f"{p99 * 1e3:.0f} ({(p99 - percentile(base_lat, 0.99)) * 1e3:+.0f}) | "
              f"{statistics.median(recover):.1f} ({max(recover):.1f}) |")
    for line in metrics.splitlines():
        if line.startswith(("afd_frontend_failovers_total", "afd_frontend_upstream_stalls_total",
                            "afd_frontend_unavailable_total", "afd_frontend_ffn_membership_changes_total",
                            "afd_frontend_process_restarts_total")):
            print(line)


if __name__ == "__main__":
    main()
