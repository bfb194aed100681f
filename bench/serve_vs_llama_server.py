#!/usr/bin/python3
"""Serving load generator: `afd serve` against `llama-server` on the same weights (issue 30).

N concurrent streaming clients send POST /v1/completions with fixed prompt token ids (distinct
per client, so neither server shares a prefix between them), temperature 0, ignore_eos and a
fixed max_tokens, stream_options.include_usage. Per server and client count it prints output
tokens/s (completion tokens of every request / the span from the first request sent to the
last stream finished), TTFT p50/p99 and inter-token latency p50/p99 (gaps between successive
token events of one stream), plus the load average read before each run.

  prepare  copies a checkpoint (weights, config, tokenizer) and zeroes the LM-head rows of every
           token whose text is not printable ASCII, and of the special tokens. Their logits
           are then exactly 0 while the others are random with a positive maximum, so greedy
           decoding never picks them: every generated token is one printable piece on both
           servers. (llama-server refuses, or sends no event for, pieces that are not valid
           UTF-8 text; without this step the two servers' event counts would differ.)
  run      runs the comparison; each (client count, server) is a fresh server process; the
           server order alternates between rounds.

  /usr/bin/python3 bench/serve_vs_llama_server.py prepare --model models/small --out models/small-printable
  /usr/bin/python3 bench/gguf_convert.py --model models/small-printable --out /tmp/small-printable.gguf \
      --llama-cpp /work/llama.cpp
  /usr/bin/python3 bench/serve_vs_llama_server.py run --afd build/apps/afd --model models/small-printable \
      --gguf /tmp/small-printable.gguf --llama-bin /work/llama.cpp/build/bin --clients 16,64

Standard library + numpy (prepare only). Every process it starts is its own child, stopped
by pid.
"""

import argparse
import asyncio
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


class HarnessError(Exception):
    pass


def loadavg():
    with open("/proc/loadavg") as f:
        return tuple(float(x) for x in f.read().split()[:3])


# ---------------------------------------------------------------- prepare

def byte_level_decoder():
    """The GPT-2 byte-level alphabet: unicode char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def cmd_prepare(a):
    import numpy as np
    src, dst = a.model, a.out
    if os.path.exists(dst):
        raise HarnessError(f"{dst} exists; give a new directory")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("tie_word_embeddings"):
        raise HarnessError("tied embeddings: zeroing LM-head rows would change the input embedding too")
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    dec = byte_level_decoder()
    V = int(cfg["vocab_size"])
    bad = set(range(V))
    for text, i in tj["model"]["vocab"].items():
        try:
            raw = bytes(dec[c] for c in text)
        except KeyError:
            continue
        if raw and all(0x20 <= b <= 0x7E for b in raw):
            bad.discard(i)
    for t in tj.get("added_tokens", []):
        bad.add(int(t["id"]))
    os.makedirs(dst)
    for name in os.listdir(src):
        shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    found = False
    for name in sorted(os.listdir(dst)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(dst, name)
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
        info = header.get("lm_head.weight")
        if info is None:
            continue
        found = True
        dt = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}.get(info["dtype"])
        if dt is None:
            raise HarnessError(f"lm_head.weight dtype {info['dtype']} is not supported")
        rows, cols = info["shape"]
        m = np.memmap(path, dtype=dt, mode="r+", offset=8 + hlen + info["data_offsets"][0], shape=(rows, cols))
        m[sorted(bad), :] = 0
        m.flush()
        del m
    if not found:
        raise HarnessError(f"{src}: no lm_head.weight")
    print(f"wrote {dst}: LM-head rows of {len(bad)} of {V} tokens zeroed (not printable ASCII, or special); "
          f"{V - len(bad)} printable tokens remain")
    return 0


# ---------------------------------------------------------------- servers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name, cmd, port=None, port_re=None):
        self.name, self.port, self.port_re = name, port, port_re
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=600):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            if self.port is None:
                m = re.search(self.port_re, self.output())
                if m:
                    self.port = int(m.group(1))
            if self.port is not None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                        if r.status == 200:
                            return
                except (urllib.error.URLError, ConnectionError, socket.timeout):
                    pass
            time.sleep(0.5)
        raise HarnessError(f"{self.name} not healthy within {timeout} s:\n{self.output()[-2000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def start_afd(a, clients):
    cmd = [a.afd, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", "0", "--threads", str(a.threads),
           "--max-running", str(clients), *a.afd_arg]
    return Server("afd-serve", cmd, port_re=r"on http://127\.0\.0\.1:(\d+)")


def start_llama(a, clients):
    port = free_port()
    ctx = clients * (a.prompt_len + a.max_tokens + 16)
    path = os.path.join(a.llama_bin, "llama-server")
    if not os.access(path, os.X_OK):
        raise HarnessError(f"{path} not found (build llama.cpp's llama-server target)")
    cmd = [path, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads), "-tb",
           str(a.threads), "-c", str(ctx), "-np", str(clients), "-cb", "--no-webui", *a.llama_arg]
    return Server("llama-server", cmd, port=port)


# ---------------------------------------------------------------- client

async def stream_request(port, body, t_origin):
    """One streaming request; returns (send time, token event times, usage tokens) relative to t_origin."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t_send = time.perf_counter() - t_origin
    writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        rest = await reader.read(2000)
        writer.close()
        raise HarnessError(f"HTTP status {status.decode(errors='replace').strip()}: {rest.decode(errors='replace')}")
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
            chunked = True
    times, usage, buf = [], None, b""

    async def pieces():
        if not chunked:
            while True:
                part = await reader.read(65536)
                if not part:
                    return
                yield part
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            part = await reader.readexactly(size)
            await reader.readexactly(2)
            yield part

    async for part in pieces():
        now = time.perf_counter() - t_origin
        buf += part
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            ev = ev.strip()
            if not ev.startswith(b"data: "):
                continue
            payload = ev[6:]
            if payload == b"[DONE]":
                continue
            j = json.loads(payload)
            if "error" in j:
                raise HarnessError(f"stream error: {j['error']}")
            if j.get("usage"):
                usage = j["usage"].get("completion_tokens")
            for c in j.get("choices") or []:
                if c.get("text"):
                    times.append(now)
    writer.close()
    return t_send, times, usage


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def run_clients(port, model_id, a, clients):
    V = a.vocab_lo, a.vocab_hi
    t0 = time.perf_counter()

    async def client(cid):
        out = []
        for r in range(a.requests):
            prompt = [V[0] + (cid * 7919 + r * 31 + j * 104729 + 13) % (V[1] - V[0]) for j in range(a.prompt_len)]
            body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            if model_id:
                body["model"] = model_id
            out.append(await stream_request(port, body, t0))
        return out

    res = await asyncio.gather(*(client(c) for c in range(clients)))
    reqs = [x for r in res for x in r]
    end = max(t[-1] for _, t, _ in reqs if t)
    start = min(s for s, _, _ in reqs)
    tokens = sum(u if u is not None else len(t) for _, t, u in reqs)
    ttft = [t[0] - s for s, t, _ in reqs if t]
    itl = [b - a_ for _, t, _ in reqs for a_, b in zip(t, t[1:])]
    short = sum(1 for _, t, u in reqs if len(t) != a.max_tokens or (u is not None and u != a.max_tokens))
    return {"requests": len(reqs), "tokens": tokens, "seconds": end - start, "tok_s": tokens / (end - start),
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99),
            "streams_not_max_tokens": short}


def served_model_id(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            data = json.loads(r.read()).get("data") or []
            return data[0]["id"] if data else None
    except (urllib.error.URLError, KeyError, ValueError):
        return None


def measure(a, which, clients):
    srv = start_afd(a, clients) if which == "afd" else start_llama(a, clients)
    try:
        srv.wait_ready()
        model_id = served_model_id(srv.port)
        load = loadavg()[0]
        r = asyncio.run(run_clients(srv.port, model_id, a, clients))
        r["load1_before"] = load
        return r
    finally:
        srv.stop()


def cmd_run(a):
    with open(os.path.join(a.model, "config.json")) as f:
        V = int(json.load(f)["vocab_size"])
    a.vocab_lo, a.vocab_hi = 256, V - 3  # prompt ids: merged tokens, no byte or special tokens
    counts = [int(c) for c in a.clients.split(",")]
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {started:%Y-%m-%d %H:%M} UTC; prompt {a.prompt_len} ids, {a.max_tokens} output tokens, "
          f"{a.requests} request(s) per client, {a.threads} threads per server; {a.rounds} round(s)")
    hdr = (f"{'round':>5} {'clients':>7} {'server':>12} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
           f"{'ITL50 ms':>8} {'ITL99 ms':>8} {'short':>5} {'load1':>6}")
    print(hdr)
    results = []
    for rnd in range(a.rounds):
        for c in counts:
            order = [w for w in (["afd", "llama"] if rnd % 2 == 0 else ["llama", "afd"]) if w in a.servers.split(",")]
            for which in order:
                r = measure(a, which, c)
                r.update({"round": rnd, "clients": c, "server": "afd serve" if which == "afd" else "llama-server"})
                results.append(r)
                print(f"{rnd:>5} {c:>7} {r['server']:>12} {r['tok_s']:>10.1f} {r['ttft_p50']:>9.3f} "
                      f"{r['ttft_p99']:>9.3f} {r['itl_p50'] * 1e3:>8.1f} {r['itl_p99'] * 1e3:>8.1f} "
                      f"{r['streams_not_max_tokens']:>5} {r['load1_before']:>6.1f}", flush=True)
    print()
    print("| clients | server | output tok/s (median) | TTFT p50 / p99 s | ITL p50 / p99 ms | afd / llama tok/s | load avg |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    names = [n for w, n in (("afd", "afd serve"), ("llama", "llama-server")) if w in a.servers.split(",")]
    for c in counts:
        med = {}
        for s in names:
            rs = [r for r in results if r["clients"] == c and r["server"] == s]
            med[s] = statistics.median(r["tok_s"] for r in rs)
        for s in names:
            rs = [r for r in results if r["clients"] == c and r["server"] == s]
            ratio = f"**{med['afd serve'] / med['llama-server']:.2f}**" if s == "afd serve" and len(med) == 2 else ""
            print(f"| {c} | {s} | {med[s]:.1f} | {statistics.median(r['ttft_p50'] for r in rs):.3f} / "
                  f"{statistics.median(r['ttft_p99'] for r in rs):.3f} | "
                  f"{statistics.median(r['itl_p50'] for r in rs) * 1e3:.1f} / "
                  f"{statistics.median(r['itl_p99'] for r in rs) * 1e3:.1f} | {ratio} | "
                  f"{min(r['load1_before'] for r in rs):.1f}-{max(r['load1_before'] for r in rs):.1f} |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"started_utc": started.isoformat(), "args": {k: v for k, v in vars(a).items()},
                       "results": results}, f, indent=2, default=str)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--afd", default="build/apps/afd")
    r.add_argument("--model", required=True, help="checkpoint directory (from prepare)")
    r.add_argument("--gguf", required=True, help="the same checkpoint as GGUF (bench/gguf_convert.py)")
    r.add_argument("--llama-bin", default=os.path.join(os.environ.get("LLAMA_CPP", ""), "build", "bin"))
    r.add_argument("--clients", default="16,64", help="comma-separated concurrent client counts")
    r.add_argument("--prompt-len", type=int, default=128)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--requests", type=int, default=1, help="sequential requests per client")
    r.add_argument("--rounds", type=int, default=1, help="rounds; the server order alternates")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--afd-arg", action="append", default=[], help="extra afd serve argument, e.g. --afd-arg=--precision=fast")
    r.add_argument("--llama-arg", action="append", default=[], help="extra llama-server argument")
    r.add_argument("--servers", default="afd,llama", help="which servers to run: afd, llama or both")
    r.add_argument("--json-out")
    a = ap.parse_args()
    try:
        return cmd_prepare(a) if a.cmd == "prepare" else cmd_run(a)
    except HarnessError as e:
        print(f"serve_vs_llama_server: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
