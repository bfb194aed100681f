#!/usr/bin/python3
"""afd against llama.cpp on the same weights (issue 30).

The weights: an afd qwen3_moe checkpoint and its GGUF twin from bench/gguf_convert.py.
llama.cpp is built by hand from a source snapshot outside this repository (never by CI or
the tests); --llama-bin names the directory holding its llama-* programs.

  check  greedy tokens and top-k log-probabilities of afd and llama.cpp for one prompt:
         `afd generate --dump-logits` against llama-server's /completion (token ids in,
         n_probs out), EOS ignored. Prints both token lists, the first divergence, and per
         step the largest |logprob difference| over llama.cpp's top-k ids and afd's margin
         between its two best tokens (a divergence where that margin is below the numeric
         difference is a near tie, not a model mismatch). llama-server answers HTTP 500 when
         the generated text is not printable ("Failed to parse input"), so check a checkpoint
         from `bench/serve_vs_llama_server.py prepare` (LM-head rows of non-printable and
         special tokens zeroed, the same weights in both engines).

  bench  decode tokens/s of `afd bench --e2e` (the real generate loop: prefill, then
         greedy decode of --tokens tokens per sequence, EOS ignored) against
         llama-batched-bench (same prompt length, same tokens, B sequences decoded together;
         S_TG t/s), both with --threads threads, in interleaved pairs whose order alternates.
         Prints every pair with the 1-minute load average read before it, then per batch the
         medians and the ratio afd / llama.cpp (median and range over pairs).
         llama-batched-bench feeds random next tokens (no sampling; logits for every
         sequence are still computed) where afd samples greedily from its logits.

  prefill  prompt-processing tokens/s of one --prompt-len-token prompt: `afd bench --e2e
         --batch 1 --tokens 2 --warmup 1 --rounds R` (each round's engine first answers one
         untimed request with other prompt ids, as llama-bench runs a warm-up on its context
         before its timed repetitions; prefill tok/s = prompt tokens / the engine.forward
         time of the whole prompt; --afd-warmup 0, for afd builds without --warmup: --rounds
         R+1 and the first round dropped, each round then on a fresh engine) against
         `llama-bench -p N -n 0 -r R`, both
         with --threads threads, in interleaved pairs whose order alternates. Each side's value
         for a pair is the median over its R repetitions (prompt tokens / median time). Prints
         every pair with the 1-minute load average read before it, then the medians, ranges
         and the ratio afd / llama.cpp (median and range over pairs).

  /usr/bin/python3 bench/serve_vs_llama_server.py prepare --model models/tiny --out models/tiny-printable
  /usr/bin/python3 bench/gguf_convert.py --model models/tiny-printable --out /tmp/tiny-printable.gguf
  /usr/bin/python3 bench/vs_llama_cpp.py check --afd build/apps/afd --model models/tiny-printable \
      --gguf /tmp/tiny-printable.gguf --llama-bin /work/llama.cpp/build/bin
  /usr/bin/python3 bench/vs_llama_cpp.py bench --afd build/apps/afd --model models/bench \
      --gguf /tmp/bench.gguf --llama-bin /work/llama.cpp/build/bin --batch 1,16,64 --pairs 5
  /usr/bin/python3 bench/vs_llama_cpp.py prefill --afd build/apps/afd --model models/small \
      --gguf /tmp/small.gguf --llama-bin /work/llama.cpp/build/bin --prompt-len 512 --pairs 5

Standard library only. Every process it starts is its own child and is stopped by pid.
"""

import argparse
import datetime
import json
import math
import os
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


def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"timed out after {timeout} s: {' '.join(cmd)}")
    except OSError as e:
        raise HarnessError(f"cannot run {cmd[0]}: {e}")
    if p.returncode != 0:
        raise HarnessError(f"exit {p.returncode}: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def tool(bin_dir, name):
    path = os.path.join(bin_dir, name)
    if not os.access(path, os.X_OK):
        raise HarnessError(f"{path} not found or not executable (build llama.cpp's {name} target)")
    return path


def model_config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- llama-server (check)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on a free loopback port; stopped (by its pid) on exit."""

    def __init__(self, bin_dir, gguf, threads, ctx, parallel=1, extra=()):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        cmd = [tool(bin_dir, "llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", str(parallel), "--no-webui",
               *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"llama-server exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            time.sleep(0.5)
        raise HarnessError("llama-server did not become healthy within 300 s")

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def post(self, path, body, timeout=600):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise HarnessError(f"llama-server {path}: HTTP {e.code}: {e.read()[:2000].decode(errors='replace')}")


def log_softmax(row):
    m = max(row)
    s = math.log(sum(math.exp(x - m) for x in row))
    return [x - m - s for x in row]


def cmd_check(a):
    cfg = model_config(a.model)
    V = int(cfg["vocab_size"])
    ids = [int(x) for x in a.prompt_ids.split(",")]
    for t in ids:
        if not 0 <= t < V:
            raise HarnessError(f"--prompt-ids: {t} is outside the vocabulary (0..{V - 1})")
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.f32")
        p = run([a.afd, "generate", "--model", a.model, "--prompt-ids", a.prompt_ids, "--max-tokens", str(a.tokens),
                 "--ignore-eos", "--threads", str(a.threads), "--precision", a.precision, "--dump-logits", dump],
                timeout=a.timeout)
        afd_tokens = [int(x) for x in p.stdout.strip().splitlines()[0].split(",")]
        with open(dump, "rb") as f:
            raw = f.read()
    n_rows = len(raw) // (4 * V)
    if n_rows != len(ids) + len(afd_tokens) - 1:
        raise HarnessError(f"afd --dump-logits: {n_rows} rows, expected {len(ids) + len(afd_tokens) - 1}")
    rows = [struct.unpack_from(f"<{V}f", raw, 4 * V * r) for r in range(n_rows)]
    afd_lp = [log_softmax(rows[len(ids) - 1 + k]) for k in range(len(afd_tokens))]

    with LlamaServer(a.llama_bin, a.gguf, a.threads, ctx=max(512, len(ids) + a.tokens + 16)) as srv:
        res = srv.post("/completion", {"prompt": ids, "n_predict": a.tokens, "temperature": 0.0, "top_k": 1,
                                       "n_probs": a.top, "ignore_eos": True, "cache_prompt": False,
                                       "return_tokens": True, "samplers": ["top_k"]})
    probs = res.get("completion_probabilities") or []
    llama_tokens = [int(s["id"]) for s in probs] if probs else [int(t) for t in res.get("tokens", [])]
    print(f"prompt ids      {ids}")
    print(f"afd tokens      {afd_tokens}")
    print(f"llama.cpp tokens {llama_tokens}")
    first = next((k for k, (x, y) in enumerate(zip(afd_tokens, llama_tokens)) if x != y), None)
    n_same = first if first is not None else min(len(afd_tokens), len(llama_tokens))
    print(f"identical prefix: {n_same} of {min(len(afd_tokens), len(llama_tokens))} tokens")
    print(f"{'step':>4} {'afd':>6} {'llama':>6} {'max|dlogprob| top-' + str(a.top):>20} {'afd top1-top2 margin':>21}")
    worst = 0.0
    for k, step in enumerate(probs):
        if k >= len(afd_lp):
            break
        lp = afd_lp[k]
        top = step.get("top_logprobs") or []
        d = max((abs(lp[int(t["id"])] - float(t["logprob"])) for t in top), default=float("nan"))
        two = sorted(lp, reverse=True)[:2]
        print(f"{k:>4} {afd_tokens[k]:>6} {llama_tokens[k]:>6} {d:>20.4f} {two[0] - two[1]:>21.4f}")
        if first is None or k <= first:
            worst = max(worst, d)
        if first is not None and k == first:
            print("     (sequences differ from here; later steps see different contexts)")
            break
    print(f"largest |dlogprob| up to the first divergence: {worst:.4f}")
    return 0 if first is None else 2


# ---------------------------------------------------------------- bench

def afd_decode_tps(a, batch):
    p = run([a.afd, "bench", "--model", a.model, "--e2e", "--json", "--batch", str(batch), "--tokens", str(a.tokens),
             "--prompt-len", str(a.prompt_len), "--threads", str(a.threads), *a.afd_arg], timeout=a.timeout)
    out = p.stdout
    j = json.loads(out[out.index("{"):])
    rows = [r for r in j["rows"] if int(r["batch"]) == batch]
    if not rows:
        raise HarnessError(f"afd bench --e2e printed no row for batch {batch}")
    return float(rows[0]["decode_tokens_per_s"]), float(rows[0]["step_ms"])


def llama_decode_tps(a, batch):
    ctx = batch * (a.prompt_len + a.tokens) + 256
    cmd = [tool(a.llama_bin, "llama-batched-bench"), "-m", a.gguf, "-t", str(a.threads), "-tb", str(a.threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(a.prompt_len), "-ntg", f"{a.tokens},1",
           "-npl", str(batch), "-pps", "--output-format", "jsonl", *a.llama_arg]
    # llama.cpp's logger is asynchronous and is not flushed at exit: the last result line of a
    # run is often lost. So a cheap second configuration (1 new token) follows the measured
    # one, with the prompt shared (-pps: one prefill, copied to every sequence; the decode
    # steps still attend to batch x (prompt + i) cached tokens), and a run whose measured line
    # is still missing is repeated.
    for attempt in range(3):
        p = run(cmd, timeout=a.timeout)
        for line in (p.stdout + "\n" + p.stderr).splitlines():
            line = line.strip()
            if line.startswith("{") and "speed_tg" in line:
                j = json.loads(line)
                if int(j["pl"]) == batch and int(j["tg"]) == a.tokens:
                    return float(j["speed_tg"]), 1e3 * float(j["t_tg"]) / a.tokens
        print(f"  (llama-batched-bench printed no result line for batch {batch}; run again)", file=sys.stderr)
    raise HarnessError(f"llama-batched-bench printed no jsonl row for batch {batch} in 3 runs:\n{p.stdout[-2000:]}")


def rng(xs):
    return f"{min(xs):.1f}-{max(xs):.1f}"


def cmd_bench(a):
    batches = [int(b) for b in a.batch.split(",")]
    tool(a.llama_bin, "llama-batched-bench")
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {started:%Y-%m-%d %H:%M} UTC; {a.pairs} pairs; prompt {a.prompt_len}, {a.tokens} new tokens; "
          f"{a.threads} threads each; afd {a.model}, llama.cpp {a.gguf}")
    print(f"{'pair':>4} {'batch':>5} {'first':>6} {'llama t/s':>10} {'afd t/s':>9} {'afd/llama':>9} "
          f"{'llama mean ms':>13} {'afd mean ms':>11} {'afd median ms':>13} {'load1 before':>12}")
    results = {b: [] for b in batches}
    for i in range(a.pairs):
        for b in batches:
            first = "afd" if (i % 2 == 0) != a.llama_first else "llama"
            load = loadavg()[0]
            if first == "afd":
                afd = afd_decode_tps(a, b)
                lla = llama_decode_tps(a, b)
            else:
                lla = llama_decode_tps(a, b)
                afd = afd_decode_tps(a, b)
            ratio = afd[0] / lla[0]
            results[b].append({"pair": i, "first": first, "llama_tps": lla[0], "afd_tps": afd[0], "ratio": ratio,
                               "llama_step_ms": lla[1], "afd_step_ms_median": afd[1], "load1_before": load})
            print(f"{i:>4} {b:>5} {first:>6} {lla[0]:>10.1f} {afd[0]:>9.1f} {ratio:>9.3f} {lla[1]:>13.2f} "
                  f"{1e3 * b / afd[0]:>11.2f} {afd[1]:>13.2f} {load:>12.2f}", flush=True)
    print()
    print("| batch | llama.cpp tok/s (median, range) | afd tok/s (median, range) | afd / llama.cpp, "
          "median [min, max] | pairs | load avg (1 min) range |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in batches:
        r = results[b]
        ll = [x["llama_tps"] for x in r]
        af = [x["afd_tps"] for x in r]
        ra = [x["ratio"] for x in r]
        lo = [x["load1_before"] for x in r]
        print(f"| {b} | {statistics.median(ll):.1f} ({rng(ll)}) | {statistics.median(af):.1f} ({rng(af)}) | "
              f"**{statistics.median(ra):.2f}** [{min(ra):.2f}, {max(ra):.2f}] | {len(r)} | {min(lo):.1f}-{max(lo):.1f} |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"started_utc": started.isoformat(), "model": a.model, "gguf": a.gguf, "threads": a.threads,
                       "prompt_len": a.prompt_len, "tokens": a.tokens, "pairs": results}, f, indent=2)
    return 0


# ---------------------------------------------------------------- prefill

def afd_prefill_tps(a):
    warm = ["--warmup", str(a.afd_warmup), "--rounds", str(a.reps)] if a.afd_warmup > 0 else ["--rounds", str(a.reps + 1)]
    p = run([a.afd, "bench", "--model", a.model, "--e2e", "--json", "--batch", "1", "--tokens", "2",
             "--prompt-len", str(a.prompt_len), *warm, "--threads", str(a.threads), "--skip-limits", *a.afd_arg],
            timeout=a.timeout)
    out = p.stdout
    j = json.loads(out[out.index("{"):])
    first = 0 if a.afd_warmup > 0 else 1
    secs = [float(r["prefill_s"]) for r in j["rows"] if int(r["round"]) >= first]
    if len(secs) != a.reps:
        raise HarnessError(f"afd bench --e2e printed {len(secs)} measured rounds, expected {a.reps}")
    return a.prompt_len / statistics.median(secs)


def llama_prefill_tps(a):
    cmd = [tool(a.llama_bin, "llama-bench"), "-m", a.gguf, "-p", str(a.prompt_len), "-n", "0", "-t", str(a.threads),
           "-r", str(a.reps), "-o", "json", *a.llama_arg]
    p = run(cmd, timeout=a.timeout)
    j = json.loads(p.stdout[p.stdout.index("["):])
    rows = [r for r in j if int(r["n_prompt"]) == a.prompt_len and int(r["n_gen"]) == 0]
    if not rows or len(rows[0]["samples_ns"]) != a.reps:
        raise HarnessError(f"llama-bench printed no pp{a.prompt_len} row with {a.reps} samples:\n{p.stdout[-2000:]}")
    return a.prompt_len / (statistics.median(float(x) for x in rows[0]["samples_ns"]) * 1e-9)


def cmd_prefill(a):
    tool(a.llama_bin, "llama-bench")
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"# {started:%Y-%m-%d %H:%M} UTC; {a.pairs} pairs; one {a.prompt_len}-token prompt; {a.reps} timed "
          f"repetitions per run (median); afd warm-up {a.afd_warmup}; {a.threads} threads each; "
          f"afd {a.afd} {a.model}, llama.cpp {a.gguf}")
    print(f"{'pair':>4} {'first':>6} {'llama t/s':>10} {'afd t/s':>9} {'afd/llama':>9} {'load1 before':>12}")
    res = []
    for i in range(a.pairs):
        first = "afd" if (i % 2 == 0) != a.llama_first else "llama"
        load = loadavg()[0]
        if first == "afd":
            af = afd_prefill_tps(a)
            ll = llama_prefill_tps(a)
        else:
            ll = llama_prefill_tps(a)
            af = afd_prefill_tps(a)
        res.append({"pair": i, "first": first, "llama_tps": ll, "afd_tps": af, "ratio": af / ll, "load1_before": load})
        print(f"{i:>4} {first:>6} {ll:>10.1f} {af:>9.1f} {af / ll:>9.3f} {load:>12.2f}", flush=True)
    ll = [x["llama_tps"] for x in res]
    af = [x["afd_tps"] for x in res]
    ra = [x["ratio"] for x in res]
    lo = [x["load1_before"] for x in res]
    print()
    print("| prompt | llama.cpp pp tok/s (median, range) | afd prefill tok/s (median, range) | "
          "afd / llama.cpp, median [min, max] | pairs | load avg (1 min) range |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {a.prompt_len} | {statistics.median(ll):.1f} ({rng(ll)}) | {statistics.median(af):.1f} ({rng(af)}) | "
          f"**{statistics.median(ra):.2f}** [{min(ra):.2f}, {max(ra):.2f}] | {len(res)} | {min(lo):.1f}-{max(lo):.1f} |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"started_utc": started.isoformat(), "model": a.model, "gguf": a.gguf, "threads": a.threads,
                       "prompt_len": a.prompt_len, "reps": a.reps, "afd_warmup": a.afd_warmup, "pairs": res}, f,
                      indent=2)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "bench", "prefill"):
        s = sub.add_parser(name)
        s.add_argument("--afd", default="build/apps/afd", help="afd binary")
        s.add_argument("--model", required=True, help="afd checkpoint directory")
        s.add_argument("--gguf", required=True, help="the same weights as GGUF (bench/gguf_convert.py)")
        s.add_argument("--llama-bin", default=os.path.join(os.environ.get("LLAMA_CPP", ""), "build", "bin"),
                       help="directory with llama.cpp's programs (default $LLAMA_CPP/build/bin)")
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--timeout", type=int, default=1800, help="seconds per program run")
    c = sub.choices["check"]
    c.add_argument("--prompt-ids", default="10,200,33,47,300,5,71,128", help="comma-separated token ids")
    c.add_argument("--tokens", type=int, default=8, help="greedy tokens to compare")
    c.add_argument("--top", type=int, default=5, help="log-probabilities compared per step")
    c.add_argument("--precision", default="reference", help="afd --precision (reference: f32 activations)")
    b = sub.choices["bench"]
    b.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes")
    b.add_argument("--pairs", type=int, default=5, help="interleaved (afd, llama.cpp) pairs per batch")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--tokens", type=int, default=64, help="new tokens per sequence")
    b.add_argument("--llama-first", action="store_true", help="start each batch's first pair with llama.cpp")
    b.add_argument("--afd-arg", action="append", default=[], help="extra afd bench argument (repeatable)")
    b.add_argument("--llama-arg", action="append", default=[], help="extra llama-batched-bench argument (repeatable)")
    b.add_argument("--json-out", help="write every pair as JSON here")
    f = sub.choices["prefill"]
    f.add_argument("--pairs", type=int, default=5, help="interleaved (afd, llama.cpp) pairs")
    f.add_argument("--prompt-len", type=int, default=512)
    f.add_argument("--reps", type=int, default=3, help="timed repetitions per program run (median)")
    f.add_argument("--afd-warmup", type=int, default=1,
                   help="afd bench --warmup per round (0: builds without it; the first of R+1 rounds is dropped)")
    f.add_argument("--llama-first", action="store_true", help="start the first pair with llama.cpp")
    f.add_argument("--afd-arg", action="append", default=[], help="extra afd bench argument (repeatable)")
    f.add_argument("--llama-arg", action="append", default=[], help="extra llama-bench argument (repeatable)")
    f.add_argument("--json-out", help="write every pair as JSON here")
    a = ap.parse_args()
    try:
        return {"check": cmd_check, "bench": cmd_bench, "prefill": cmd_prefill}[a.cmd](a)
    except HarnessError as e:
        print(f"vs_llama_cpp: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
