#!/usr/bin/python3
"""Worker faults under load: what clients of `afd serve --topology 2A1F` see.

Starts the bundle, runs 4 closed-loop clients (plus, for *_open scenarios, a new request
every 100 ms), applies one fault to a worker process, and reports the non-200 answers, the
completions per second and, per fault, how long until the next request completed.

usage: bench/serve_faults.py AFD MODEL SCENARIO [extra `afd serve` flags...]
scenarios:
  ffn_kill, ffn_kill_open  SIGKILL of the FFN worker (restarted by the launcher)
  ffn_kill_every30         SIGKILL of the FFN worker 4 times, 30 s apart (restart back-off)
  ffn_stop10               SIGSTOP of the FFN worker for 10 s, then SIGCONT (stall hold)
  att_kill_nonstream       SIGKILL of attention worker 0 under non-streaming requests
  att_kill_stream          the same under streaming requests
The bundle's log goes to SCENARIO.err in the current directory. Example (docs/FAILOVER.md):
  bench/serve_faults.py build/apps/afd /tmp/tiny ffn_stop10 --precision reference --ffn-timeout-ms 8000
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

SCENARIOS = ("ffn_kill", "ffn_kill_open", "ffn_kill_every30", "ffn_stop10", "att_kill_nonstream", "att_kill_stream")


def main():
    if len(sys.argv) < 4 or sys.argv[3] not in SCENARIOS:
        sys.exit(__doc__)
    afd, model, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    log = open(f"{scenario}.err", "w")
    p = subprocess.Popen([afd, "serve", "--model", model, "--topology", "2A1F", "--port", "0", "--threads", "1"] +
                         sys.argv[4:], stdout=subprocess.PIPE, stderr=log, text=True)
    port = None
    deadline = time.time() + 120
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(r"front end on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "bundle complete" in line:
            break
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    if port is None:
        sys.exit(f"afd serve did not start; see {scenario}.err")

    def worker_pid(role, index=0):
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            with open(f"/proc/{p.pid}/task/{tid}/children") as f:
                for c in f.read().split():
                    try:
                        with open(f"/proc/{c}/cmdline") as g:
                            argv = g.read().split("\0")
                    except OSError:
                        continue
                    if "--role" in argv and argv[argv.index("--role") + 1] == role:
                        if role != "attention" or argv[argv.index("--attention-index") + 1] == str(index):
                            return int(c)
        sys.exit(f"no {role} worker {index}")

    stream = scenario == "att_kill_stream"
    max_tokens = 400 if scenario.startswith("att_kill") else 32
    results = []  # (start s, end s, status (-1: error event in a stream), note)
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.time()

    def request():
        body = json.dumps({"prompt": "hello world " * 4, "max_tokens": max_tokens, "temperature": 0,
                           "stream": stream, "ignore_eos": True})
        start = time.time() - t0
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read().decode(errors="replace")
            status, note = r.status, ("" if r.status == 200 else data[:300])
            if status == 200 and stream and '"error"' in data:
                status, note = -1, data[data.find('"error"'):][:300]
        except Exception as e:  # noqa: BLE001 - reported as status 0
            status, note = 0, repr(e)
        with lock:
            results.append((start, time.time() - t0, status, note))

    def client():
        while not stop.is_set():
            request()

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    arrivals = []

    def open_loop():
        while not stop.is_set():
            th = threading.Thread(target=request)
            th.start()
            arrivals.append(th)
            time.sleep(0.1)

    if scenario.endswith("_open"):
        threading.Thread(target=open_loop, daemon=True).start()
    time.sleep(3)
    events = []

    def fault(sig, role, what):
        pid = worker_pid(role)
        events.append((time.time() - t0, f"{what} {role} worker (process {pid})"))
        os.kill(pid, sig)
        return pid

    if scenario in ("ffn_kill", "ffn_kill_open"):
        fault(signal.SIGKILL, "ffn", "SIGKILL")
        time.sleep(15)
    elif scenario == "ffn_kill_every30":
        for _ in range(4):
            fault(signal.SIGKILL, "ffn", "SIGKILL")
            time.sleep(30)
    elif scenario == "ffn_stop10":
        pid = fault(signal.SIGSTOP, "ffn", "SIGSTOP")
        time.sleep(10)
        events.append((time.time() - t0, f"SIGCONT ffn worker (process {pid})"))
        os.kill(pid, signal.SIGCONT)
        time.sleep(20)
    else:
        fault(signal.SIGKILL, "attention", "SIGKILL")
        time.sleep(15)
    stop.set()
    for t in threads + arrivals:
        t.join()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)

    for at, what in events:
        print(f"{at:7.2f} s  {what}")
    bad = [r for r in results if r[2] != 200]
    print(f"requests {len(results)}, not 200: {len(bad)}")
    if bad:
        print(f"  first started {min(r[0] for r in bad):.2f} s, last ended {max(r[1] for r in bad):.2f} s")
        kinds = {}
        for r in bad:
            k = (r[2], re.sub(r"\d+", "N", r[3])[:160])
            kinds[k] = kinds.get(k, 0) + 1
        for (status, note), n in sorted(kinds.items(), key=lambda x: -x[1]):
            print(f"  {n} x {status}: {note}")
    per_s = {}
    for r in results:
        per_s.setdefault(int(r[1]), [0, 0])[0 if r[2] == 200 else 1] += 1
    print("answers by second (200/other):", " ".join(f"{s}:{v[0]}/{v[1]}" for s, v in sorted(per_s.items())))
    for at, what in events:
        after = [r[1] for r in results if r[1] > at + 0.05 and r[2] == 200]
        inflight = [r for r in results if r[0] < at < r[1]]
        print(f"after {what}: next completion {min(after) - at:.2f} s later" if after else f"after {what}: none",
              f"; {len(inflight)} in flight, answered {sorted(set(r[2] for r in inflight))}")


if __name__ == "__main__":
    main()
