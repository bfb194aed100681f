#!/usr/bin/python3
"""afd against llama.cpp on the same weights (issues 30, 43).

The weights: an afd qwen3_moe or DeepSeek-V3-layout checkpoint and its GGUF twin from
bench/gguf_convert.py (llama.cpp's qwen3moe / deepseek2).
llama.cpp is built by hand from a source snapshot outside this repository (never by CI or
the tests); --llama-bin names the directory holding its llama-* programs.

  check  greedy tokens and top-k log-probabilities of afd and llama.cpp for one prompt:
         `afd generate --dump-logits --ignore-eos` against llama-server's /completion (token
         ids in, n_probs out). By default llama.cpp is asked one step at a time on afd's
         context (prompt + afd's first k tokens, cached prefix, one greedy token, EOS not
         suppressed), so every step compares the two engines on the same context and a
         token equal at every step means equal greedy continuations; --free-running asks
         once for llama.cpp's own continuation instead (ignore_eos, whose EOS logit bias can
         change a choice). Prints the token lists, the identical count and prefix, and per
         step the largest |logprob difference| over llama.cpp's top-k ids and afd's margin
         between its two best tokens (a divergence where that margin is below the numeric
         difference is a near tie, not a model mismatch). --oracle adds the float64
         reference of tests/reference (its own greedy tokens, and its log-probabilities on
         afd's tokens against both engines). llama-server answers HTTP 500 when the
         generated text is not printable ("Failed to parse input"), so check a random-weight
         checkpoint from `bench/serve_vs_llama_server.py prepare` (LM-head rows of
         non-printable and special tokens zeroed, the same weights in both engines).
         --llama-arg passes llama-server options: `--llama-arg=-fa --llama-arg=off
         --llama-arg=-ctk --llama-arg=f32 --llama-arg=-ctv --llama-arg=f32` takes llama.cpp's
         f16 KV cache and flash attention out of the comparison.

  bench  decode tokens/s of `afd bench --e2e` (the real generate loop: prefill, then
         greedy decode of --tokens tokens per sequence, EOS ignored) against
         llama-batched-bench (same prompt length, same tokens, B sequences decoded together;
         S_TG t/s), both with --threads threads, in interleaved pairs whose order alternates.
         Prints every pair with the 1-minute load average read before it, then per batch the
         medians and the ratio afd / llama.cpp (median and range over pairs).
         llama-batched-bench feeds random next tokens (no sampling; logits for every
         sequence are still computed) where afd samples greedily from its logits.
         --depth N: decode at long context. Each sequence first holds an N-token prompt
         (afd: B distinct prompts, prefilled untimed; llama-batched-bench -npp N -pps: one
         prefill copied into every sequence's own KV stream, so each decode step attends to
         B x (N + i) cached tokens on both sides), then --tokens decode steps are timed.
         --llama-tool llama-bench measures batch 1 with `llama-bench -p 0 -n T -d N -r 1`
         instead. Both prefill rates are printed too (from the same runs).
         --afd-context synthetic: afd's KV caches hold N synthetic positions per sequence
         (`afd bench --context N --steps T`, no prefill, afd pp t/s prints 0) and its tok/s is
         B / the mean decode step: the same decode work, for cells whose B x N prefill alone
         takes half an hour (batch 16 at 16384).

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
  /usr/bin/python3 bench/vs_llama_cpp.py bench --afd build/apps/afd --model /tmp/models/dsv3-bench \
      --gguf /tmp/models/dsv3-bench.gguf --llama-bin /tmp/llama.cpp/build/bin --batch 1,16 --depth 4096 \
      --tokens 32 --pairs 3
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


def reference_rows(a, ids, forced):
    """The float64 oracle (tests/reference) on this prompt: its own greedy tokens, and its
    logits rows teacher-forced on `forced` (afd's tokens), one row per generated step."""
    sys.path.insert(0, a.oracle_dir)
    try:
        import hf_moe_ref  # noqa: E402  (tests/reference: greedy)
        import reference  # noqa: E402  (picks the family's reference by model_type)
    except ImportError as e:
        raise HarnessError(f"--oracle: cannot import the reference from {a.oracle_dir}: {e}")
    model = reference.load_model(a.model)
    rows, _ = hf_moe_ref.greedy(model, [ids], len(forced), forced=[forced])
    _, own = hf_moe_ref.greedy(reference.load_model(a.model), [ids], len(forced))
    rows = rows[0]
    return own[0], [log_softmax([float(x) for x in rows[len(ids) - 1 + k]]) for k in range(len(forced))]


def llama_steps(a, srv, ids, afd_tokens):
    """llama.cpp teacher-forced on afd's tokens: step k sends the prompt + afd's first k tokens
    (the cached prefix is reused, so each step decodes one token) and takes one greedy token
    with its top log-probabilities (computed from the raw logits). EOS is not suppressed
    (no ignore_eos, whose logit bias would change the choice); a one-token request that ends
    in EOS still reports it. Equal tokens at every step mean equal free-running greedy
    sequences, since each step sees the context the other engine saw."""
    out = []
    for k in range(len(afd_tokens)):
        res = srv.post("/completion", {"prompt": ids + afd_tokens[:k], "n_predict": 1, "temperature": 0.0,
                                       "top_k": 1, "n_probs": a.top, "cache_prompt": True,
                                       "return_tokens": True, "samplers": ["top_k"]})
        probs = res.get("completion_probabilities") or []
        if len(probs) != 1:
            raise HarnessError(f"llama-server step {k}: {len(probs)} completion_probabilities entries "
                               f"(a piece that is not valid UTF-8? see `serve_vs_llama_server.py prepare`): "
                               f"{json.dumps(res)[:500]}")
        out.append(probs[0])
    return out


def llama_free_running(a, srv, ids):
    """One request: llama.cpp's own greedy continuation (ignore_eos: EOS logits biased away)."""
    res = srv.post("/completion", {"prompt": ids, "n_predict": a.tokens, "temperature": 0.0, "top_k": 1,
                                   "n_probs": a.top, "ignore_eos": True, "cache_prompt": False,
                                   "return_tokens": True, "samplers": ["top_k"]})
    return res.get("completion_probabilities") or []


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
    ora_tokens, ora_lp = reference_rows(a, ids, afd_tokens) if a.oracle else (None, None)

    with LlamaServer(a.llama_bin, a.gguf, a.threads, ctx=max(512, len(ids) + a.tokens + 16),
                     extra=a.llama_arg) as srv:
        probs = llama_free_running(a, srv, ids) if a.free_running else llama_steps(a, srv, ids, afd_tokens)
    llama_tokens = [int(s["id"]) for s in probs]
    print(f"prompt ids      {ids}")
    print(f"afd tokens      {afd_tokens}")
    print(f"llama.cpp tokens {llama_tokens}" + ("  (free-running, EOS biased away)" if a.free_running else
                                                "  (each step on afd's context)"))
    if ora_tokens is not None:
        print(f"oracle tokens   {ora_tokens}  (float64 reference, free-running)")
    first = next((k for k, (x, y) in enumerate(zip(afd_tokens, llama_tokens)) if x != y), None)
    n = min(len(afd_tokens), len(llama_tokens))
    n_same = sum(1 for x, y in zip(afd_tokens, llama_tokens) if x == y)
    print(f"identical tokens: {n_same} of {n}; identical prefix: {first if first is not None else n}")
    if ora_tokens is not None:
        fo = next((k for k, (x, y) in enumerate(zip(afd_tokens, ora_tokens)) if x != y), None)
        print(f"afd vs oracle: identical prefix {fo if fo is not None else len(ora_tokens)} of {len(ora_tokens)}")
    hdr = f"{'step':>4} {'afd':>6} {'llama':>6} {'|dlp| llama-afd':>16}"
    if ora_tokens is not None:
        hdr += f" {'oracle':>6} {'|dlp| llama-orc':>16} {'|dlp| afd-orc':>14} {'(all V)':>9}"
    print(hdr + f" {'afd top1-top2':>14}   (|dlp|: largest |logprob difference| over llama.cpp's top-{a.top})")
    worst = {"llama_afd": 0.0, "llama_oracle": 0.0, "afd_oracle_top": 0.0, "afd_oracle_all": 0.0}
    for k, step in enumerate(probs[:len(afd_lp)]):
        lp = afd_lp[k]
        top = [(int(t["id"]), float(t["logprob"])) for t in step.get("top_logprobs") or []]
        d = max((abs(lp[i] - v) for i, v in top), default=float("nan"))
        two = sorted(lp, reverse=True)[:2]
        line = f"{k:>4} {afd_tokens[k]:>6} {llama_tokens[k]:>6} {d:>16.5f}"
        counts = not a.free_running or first is None or k <= first
        if counts:
            worst["llama_afd"] = max(worst["llama_afd"], d)
        if ora_tokens is not None:
            olp = ora_lp[k]
            do = max((abs(olp[i] - v) for i, v in top), default=float("nan"))
            dao = max(abs(olp[i] - lp[i]) for i, _ in top)
            dall = max(abs(x - y) for x, y in zip(olp, lp))
            line += f" {ora_tokens[k]:>6} {do:>16.5f} {dao:>14.5f} {dall:>9.5f}"
            if counts:
                worst["llama_oracle"] = max(worst["llama_oracle"], do)
                worst["afd_oracle_top"] = max(worst["afd_oracle_top"], dao)
                worst["afd_oracle_all"] = max(worst["afd_oracle_all"], dall)
        print(line + f" {two[0] - two[1]:>14.4f}")
        if a.free_running and first is not None and k == first:
            print("     (sequences differ from here; later steps see different contexts)")
            break
    print(f"largest |dlogprob| llama.cpp vs afd: {worst['llama_afd']:.5f}")
    if ora_tokens is not None:
        print(f"largest |dlogprob| llama.cpp vs oracle: {worst['llama_oracle']:.5f}; afd vs oracle: "
              f"{worst['afd_oracle_top']:.5f} over llama.cpp's top-{a.top}, {worst['afd_oracle_all']:.5f} over "
              "the whole vocabulary")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": a.model, "gguf": a.gguf, "prompt_ids": ids, "afd_tokens": afd_tokens,
                       "llama_tokens": llama_tokens, "oracle_tokens": ora_tokens, "identical": n_same,
                       "compared": n, "free_running": a.free_running, "max_abs_dlogprob": worst}, f, indent=2)
    ok = first is None and (ora_tokens is None or ora_tokens[:n] == afd_tokens[:n])
    return 0 if ok else 2


# ---------------------------------------------------------------- bench

def afd_bench_row(a, args, batch, what, context=None):
    """The row of batch `batch` (and `context`, if given) that `afd bench --json --batch B
    --threads T ARGS` prints."""
    p = run([a.afd, "bench", "--model", a.model, "--json", "--batch", str(batch), "--threads", str(a.threads), *args,
             *a.afd_arg], timeout=a.timeout)
    out = p.stdout
    rows = [r for r in json.loads(out[out.index("{"):])["rows"]
            if int(r["batch"]) == batch and (context is None or int(r["context"]) == context)]
    if not rows:
        raise HarnessError(f"afd bench{what} printed no row for batch {batch}")
    return rows[0]


def afd_synthetic_depth_tps(a, batch):
    """--depth with --afd-context synthetic: `afd bench --batch B --context N --steps T` (each
    sequence's KV cache filled with N synthetic positions instead of a prefill; then T decode
    steps, the context growing by one per step as in decode). tok/s = B / mean step time, as
    llama-batched-bench's S_TG is tokens over the whole decode time."""
    r = afd_bench_row(a, ["--context", str(a.depth), "--steps", str(a.tokens)], batch, f" at context {a.depth}",
                      context=a.depth)
    b, wb = float(r["bytes_per_step"]), float(r["weight_bytes_per_step"])
    print(f"  afd step at context {a.depth}: {b / 1e6:.1f} MB read per step ({(b - wb) / 1e6:.1f} MB of it KV and "
          f"activations), median step {float(r['step_ms']):.1f} ms, {float(r['bandwidth_fraction']):.3f} of the read "
          "bandwidth afd bench measured in the same run", flush=True)
    return batch / (float(r["step_ms_mean"]) * 1e-3), float(r["step_ms"]), 0.0


def afd_decode_tps(a, batch):
    if a.depth and a.afd_context == "synthetic":
        return afd_synthetic_depth_tps(a, batch)
    r = afd_bench_row(a, ["--e2e", "--tokens", str(a.tokens), "--prompt-len", str(a.prompt_len)], batch, " --e2e")
    return float(r["decode_tokens_per_s"]), float(r["step_ms"]), float(r.get("prefill_tokens_per_s", 0.0))


def llama_depth_bench_tps(a, batch):
    """--depth with --llama-tool llama-bench (batch 1): `llama-bench -p 0 -n T -d N -r 1`, the
    generation of T tokens after an untimed N-token prefill."""
    if batch != 1:
        raise HarnessError("--llama-tool llama-bench measures batch 1 only")
    cmd = [tool(a.llama_bin, "llama-bench"), "-m", a.gguf, "-p", "0", "-n", str(a.tokens), "-d", str(a.depth),
           "-t", str(a.threads), "-r", "1", "-o", "json", *a.llama_arg]
    p = run(cmd, timeout=a.timeout)
    j = json.loads(p.stdout[p.stdout.index("["):])
    rows = [r for r in j if int(r["n_gen"]) == a.tokens and int(r.get("n_depth", 0)) == a.depth]
    if not rows:
        raise HarnessError(f"llama-bench printed no tg{a.tokens} @ d{a.depth} row:\n{p.stdout[-2000:]}")
    ns = statistics.median(float(x) for x in rows[0]["samples_ns"])
    return a.tokens / (ns * 1e-9), ns * 1e-6 / a.tokens, 0.0


def llama_decode_tps(a, batch):
    if a.depth and a.llama_tool == "llama-bench":
        return llama_depth_bench_tps(a, batch)
    ctx = batch * (a.prompt_len + a.tokens) + 256
    # The measured configuration comes first; a cheap one follows it (see below): at depth a
    # second (8-token prompt) configuration instead of a second prefill of the long prompt.
    shape = (["-npp", f"{a.prompt_len},8", "-ntg", str(a.tokens)] if a.depth else
             ["-npp", str(a.prompt_len), "-ntg", f"{a.tokens},1"])
    cmd = [tool(a.llama_bin, "llama-batched-bench"), "-m", a.gguf, "-t", str(a.threads), "-tb", str(a.threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", *shape,
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
                if int(j["pl"]) == batch and int(j["tg"]) == a.tokens and int(j["pp"]) == a.prompt_len:
                    return float(j["speed_tg"]), 1e3 * float(j["t_tg"]) / a.tokens, float(j["speed_pp"])
        print(f"  (llama-batched-bench printed no result line for batch {batch}; run again)", file=sys.stderr)
    raise HarnessError(f"llama-batched-bench printed no jsonl row for batch {batch} in 3 runs:\n{p.stdout[-2000:]}")


def rng(xs):
    return f"{min(xs):.1f}-{max(xs):.1f}"


def cmd_bench(a):
    batches = [int(b) for b in a.batch.split(",")]
    if a.depth:
        a.prompt_len = a.depth
    tool(a.llama_bin, "llama-bench" if a.depth and a.llama_tool == "llama-bench" else "llama-batched-bench")
    started = datetime.datetime.now(datetime.timezone.utc)
    what = (f"depth {a.depth} (a {a.depth}-token prompt per sequence, then {a.tokens} timed decode steps; "
            f"llama.cpp: {a.llama_tool})" if a.depth else f"prompt {a.prompt_len}, {a.tokens} new tokens")
    print(f"# {started:%Y-%m-%d %H:%M} UTC; {a.pairs} pairs; {what}; "
          f"{a.threads} threads each; afd {a.model}, llama.cpp {a.gguf}; load avg {' '.join(map(str, loadavg()))}")
    extra = f" {'llama pp t/s':>12} {'afd pp t/s':>10}" if a.depth else ""
    print(f"{'pair':>4} {'batch':>5} {'first':>6} {'llama t/s':>10} {'afd t/s':>9} {'afd/llama':>9} "
          f"{'llama mean ms':>13} {'afd mean ms':>11} {'afd median ms':>13} {'load1 before':>12}" + extra)
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
                               "llama_step_ms": lla[1], "afd_step_ms_median": afd[1], "load1_before": load,
                               "llama_prefill_tps": lla[2], "afd_prefill_tps": afd[2]})
            extra = f" {lla[2]:>12.1f} {afd[2]:>10.1f}" if a.depth else ""
            print(f"{i:>4} {b:>5} {first:>6} {lla[0]:>10.1f} {afd[0]:>9.1f} {ratio:>9.3f} {lla[1]:>13.2f} "
                  f"{1e3 * b / afd[0]:>11.2f} {afd[1]:>13.2f} {load:>12.2f}" + extra, flush=True)
    print()
    print(("| batch | context |" if a.depth else "| batch |") + " llama.cpp tok/s (median, range) | afd tok/s "
          "(median, range) | afd / llama.cpp, median [min, max] | pairs | load avg (1 min) range |")
    print("|---:|---:|---:|---:|---:|---:|" + ("---:|" if a.depth else ""))
    for b in batches:
        r = results[b]
        ll = [x["llama_tps"] for x in r]
        af = [x["afd_tps"] for x in r]
        ra = [x["ratio"] for x in r]
        lo = [x["load1_before"] for x in r]
        ctx = f" {a.depth} |" if a.depth else ""
        print(f"| {b} |{ctx} {statistics.median(ll):.1f} ({rng(ll)}) | {statistics.median(af):.1f} ({rng(af)}) | "
              f"**{statistics.median(ra):.2f}** [{min(ra):.2f}, {max(ra):.2f}] | {len(r)} | {min(lo):.1f}-{max(lo):.1f} |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"started_utc": started.isoformat(), "model": a.model, "gguf": a.gguf, "threads": a.threads,
                       "prompt_len": a.prompt_len, "depth": a.depth, "llama_tool": a.llama_tool if a.depth else
                       "llama-batched-bench", "tokens": a.tokens, "pairs": results}, f, indent=2)
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
    c.add_argument("--oracle", action="store_true",
                   help="also run the float64 reference (tests/reference) on the prompt: its greedy tokens and "
                        "its log-probabilities on afd's tokens (small models only: numpy float64)")
    c.add_argument("--oracle-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                        "reference"), help="the reference's directory")
    c.add_argument("--free-running", action="store_true",
                   help="llama.cpp in one request on its own tokens (ignore_eos, which biases EOS away) instead "
                        "of one request per step on afd's context")
    c.add_argument("--json-out", help="write the tokens and the largest differences as JSON here")
    c.add_argument("--llama-arg", action="append", default=[],
                   help="extra llama-server argument (repeatable; --llama-arg=-ctk --llama-arg=f32: an f32 KV cache "
                        "instead of llama.cpp's default f16)")
    b = sub.choices["bench"]
    b.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes")
    b.add_argument("--pairs", type=int, default=5, help="interleaved (afd, llama.cpp) pairs per batch")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--tokens", type=int, default=64, help="new tokens per sequence")
    b.add_argument("--depth", type=int, default=0,
                   help="long-context decode: every sequence first holds an N-token prompt (replaces --prompt-len); "
                        "only the --tokens decode steps after it are timed (afd: its decode tok/s; llama.cpp: S_TG of "
                        "llama-batched-bench -npp N -ntg T -pps, or llama-bench -d N -n T with --llama-tool)")
    b.add_argument("--afd-context", choices=["prefill", "synthetic"], default="prefill",
                   help="--depth on afd's side: prefill B distinct N-token prompts (`afd bench --e2e`, untimed), or "
                        "fill each KV cache with N synthetic positions (`afd bench --context N`: the decode steps "
                        "alone, for batch 16 at 16384, whose prefill takes half an hour on 2 cores)")
    b.add_argument("--llama-tool", choices=["llama-batched-bench", "llama-bench"], default="llama-batched-bench",
                   help="--depth: llama.cpp's measuring program (llama-bench: batch 1 only)")
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
