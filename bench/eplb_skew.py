#!/usr/bin/env python3
"""Expert load balancing under skewed routing (issue 41; docs/DEPLOYMENT.md "Expert load
balancing"): `afd serve --topology 1A{y}F --eplb` against the same bundle with the contiguous
placement (`--eplb-interval-s 0`), under a load of concurrent streaming requests of one prompt
whose tokens route most pairs to a few experts.

Per FFN worker count y and placement it starts a bundle, lets the load run --warmup seconds
(EPLB plans every --interval seconds), then measures --seconds:
  - the (token, routed expert) pairs each FFN worker computed, per MoE layer
    (`afd_ffn_expert_tokens_total`, from the front end's /metrics): max/mean over the workers,
    the mean over the layers and the worst layer; and over all layers together
    (`afd_ffn_expert_rows_total`);
  - each worker's mean time per FFN batch (`afd_ffn_compute_seconds_total / afd_ffn_batches_total`);
  - what users see: the gaps between a stream's tokens (inter-token latency, median and p90
    over every gap of every stream) and output tokens/s.
An emulated FFN cost per pair (--ffn-us-per-row, `--emulate-stage-costs`) makes load mean time
on a small machine. Prints a table; --json-out writes the rows.

  /usr/bin/python3 bench/eplb_skew.py --afd build/apps/afd --model assets/models/wordnet-dsv3 \\
      --ffn 2,4 --redundant 2,2 --streams 16 --seconds 30

Standard library only. Every process it starts is stopped by pid.
"""

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics(port):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()


def per_ffn(text, name):
    """{ffn label: value} of a series."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            m = re.search(r'ffn="([^"]+)"', line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def per_ffn_layer(text):
    """{(ffn, layer): tokens} of afd_ffn_expert_tokens_total (summed over experts)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("afd_ffn_expert_tokens_total{"):
            f = re.search(r'ffn="([^"]+)"', line)
            l = re.search(r'layer="(\d+)"', line)
            if f and l:
                key = (f.group(1), int(l.group(1)))
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def layer_balance(before, after):
    """Per MoE layer max/mean over the FFN workers of the pairs computed between two scrapes:
    (mean over layers, worst layer)."""
    d = {k: v - before.get(k, 0) for k, v in after.items()}
    workers = sorted({k[0] for k in d})
    ratios = []
    for layer in sorted({k[1] for k in d}):
        loads = [d.get((w, layer), 0.0) for w in workers]
        mean = statistics.mean(loads)
        if mean > 0:
            ratios.append(max(loads) / mean)
    return (statistics.mean(ratios), max(ratios)) if ratios else (0.0, 0.0)


class Load:
    """n threads streaming greedy completions of `prompt` back to back; token arrival gaps."""

    def __init__(self, port, n, prompt, max_tokens):
        self.port, self.prompt, self.max_tokens = port, prompt, max_tokens
        self.gaps, self.tokens, self.failures = [], 0, []
        self.measuring = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stop.is_set():
            body = {"prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True, "temperature": 0,
                    "stream": True}
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"})
                last = None
                with urllib.request.urlopen(req, timeout=600) as r:
                    for line in r:
                        if not line.startswith(b"data: {"):
                            continue
                        now = time.monotonic()
                        with self.lock:
                            if self.measuring:
                                self.tokens += 1
                                if last is not None:
                                    self.gaps.append(now - last)
                        last = now
            except Exception as e:  # noqa: BLE001 - counted and reported
                with self.lock:
                    self.failures.append(repr(e))

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(600)


def run_one(a, y, redundant, eplb):
    port = free_port()
    costs = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    costs.write(json.dumps({"ffn_us_per_row": a.ffn_us_per_row}))
    costs.close()
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    cmd = [a.afd, "serve", "--model", a.model, "--port", str(port), "--topology", f"1A{y}F", "--threads", "1",
           "--eplb", "--eplb-interval-s", str(a.interval if eplb else 0), "--eplb-redundant", str(redundant),
           "--emulate-stage-costs", costs.name, "--max-running", str(a.streams)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError("afd serve exited; log: " + log.name)
            if "bundle complete" in line:
                break
        load = Load(port, a.streams, a.prompt, a.max_tokens)
        time.sleep(a.warmup)
        m0 = metrics(port)
        with load.lock:
            load.measuring = True
        t0 = time.monotonic()
        time.sleep(a.seconds)
        with load.lock:
            load.measuring = False
        t1 = time.monotonic()
        m1 = metrics(port)
        load.close()
        rows = {k: v - per_ffn(m0, "afd_ffn_expert_rows_total").get(k, 0)
                for k, v in per_ffn(m1, "afd_ffn_expert_rows_total").items()}
        secs = {k: v - per_ffn(m0, "afd_ffn_compute_seconds_total").get(k, 0)
                for k, v in per_ffn(m1, "afd_ffn_compute_seconds_total").items()}
        batches = {k: v - per_ffn(m0, "afd_ffn_batches_total").get(k, 0)
                   for k, v in per_ffn(m1, "afd_ffn_batches_total").items()}
        placements = sum(float(l.rsplit(" ", 1)[1]) for l in m1.splitlines()
                         if l.startswith("afd_ffn_eplb_placements_total{"))
        layer_mean, layer_worst = layer_balance(per_ffn_layer(m0), per_ffn_layer(m1))
        vals = [rows[k] for k in sorted(rows)]
        mean = statistics.mean(vals) if vals else 0
        batch_ms = {k: 1e3 * secs[k] / batches[k] for k in secs if batches.get(k)}
        gaps = sorted(load.gaps)
        row = {"ffn_workers": y, "placement": "eplb" if eplb else "contiguous", "redundant": redundant if eplb else 0,
               "placements": placements, "rows_per_worker": {k: rows[k] for k in sorted(rows)},
               "max_over_mean": max(vals) / mean if mean else 0,
               "layer_max_over_mean": layer_mean, "worst_layer_max_over_mean": layer_worst,
               "batch_ms_per_worker": {k: batch_ms[k] for k in sorted(batch_ms)},
               "itl_median_ms": 1e3 * statistics.median(gaps) if gaps else 0,
               "itl_p90_ms": 1e3 * gaps[int(0.9 * (len(gaps) - 1))] if gaps else 0,
               "tokens_per_s": load.tokens / (t1 - t0), "failures": len(load.failures)}
        return row
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        os.unlink(costs.name)


def svg(rows, title):
    """A bar chart (SVG text) of the pairs each FFN worker computed, one group per bundle and
    placement, each bar relative to its group's mean (1 = even)."""
    groups = [r for r in rows if r["rows_per_worker"]]
    bar, gap, h, top, left = 22, 26, 180, 40, 50
    width = max(720, left + sum(len(r["rows_per_worker"]) * bar + gap for r in groups) + 20)
    hi = max(max(v for v in r["rows_per_worker"].values()) / statistics.mean(r["rows_per_worker"].values())
             for r in groups)
    hi = max(2.0, hi)
    y = lambda v: top + h - h * v / hi  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + h + 60}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="18" font-size="13">{title}</text>']
    for v in (0.5, 1.0, 1.5, 2.0):
        if v <= hi:
            out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ccc"/>')
            out.append(f'<text x="{left - 30}" y="{y(v) + 4:.1f}">{v:.1f}</text>')
    x = left + 10
    for r in groups:
        vals = list(r["rows_per_worker"].values())
        mean = statistics.mean(vals)
        color = "#d95f02" if r["placement"] == "contiguous" else "#1b9e77"
        for v in vals:
            out.append(f'<rect x="{x}" y="{y(v / mean):.1f}" width="{bar - 4}" height="{top + h - y(v / mean):.1f}" '
                       f'fill="{color}"/>')
            x += bar
        label = f'1A{r["ffn_workers"]}F {r["placement"]}'
        out.append(f'<text x="{x - len(vals) * bar}" y="{top + h + 16}">{label}</text>')
        out.append(f'<text x="{x - len(vals) * bar}" y="{top + h + 30}">max/mean {r["max_over_mean"]:.2f}</text>')
        x += gap
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--afd", default="build/apps/afd")
    ap.add_argument("--model", default="assets/models/wordnet-dsv3")
    ap.add_argument("--ffn", default="2,4", help="FFN worker counts")
    ap.add_argument("--redundant", default="2,2", help="--eplb-redundant per FFN worker count")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default=" ".join(["cat"] * 60))
    ap.add_argument("--ffn-us-per-row", type=float, default=300)
    ap.add_argument("--interval", type=float, default=2)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--json-out")
    ap.add_argument("--svg-out", help="a bar chart of the pairs per FFN worker relative to the mean")
    a = ap.parse_args()
    ys = [int(v) for v in a.ffn.split(",")]
    rs = [int(v) for v in a.redundant.split(",")]
    if len(rs) != len(ys):
        sys.exit("--redundant needs one value per --ffn value")
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {a.model}; {a.streams} streams of "
          f"{a.max_tokens} tokens; FFN cost {a.ffn_us_per_row} us per pair; warm-up {a.warmup} s, window "
          f"{a.seconds} s; load avg {os.getloadavg()[0]:.2f}")
    print("| FFN workers | placement | R | pairs per worker | max/mean per layer (mean, worst) | all layers | "
          "ms per FFN batch (per worker) | inter-token median / p90 ms | tokens/s | failed |")
    print("|---:|---|---:|---|---|---:|---|---|---:|---:|")
    out = []
    for y, r in zip(ys, rs):
        for eplb in (False, True):
            row = run_one(a, y, r, eplb)
            out.append(row)
            pw = " / ".join(f"{v:.0f}" for v in row["rows_per_worker"].values())
            bm = " / ".join(f"{v:.2f}" for v in row["batch_ms_per_worker"].values())
            print(f"| {y} | {row['placement']} | {row['redundant']} | {pw} | {row['layer_max_over_mean']:.3f}, "
                  f"{row['worst_layer_max_over_mean']:.3f} | {row['max_over_mean']:.3f} | {bm} | "
                  f"{row['itl_median_ms']:.1f} / {row['itl_p90_ms']:.1f} | {row['tokens_per_s']:.1f} | "
                  f"{row['failures']} |", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    if a.svg_out:
        with open(a.svg_out, "w") as f:
            f.write(svg(out, f"Pairs per FFN worker over {a.seconds:.0f} s / mean (all MoE layers): contiguous vs EPLB"))


if __name__ == "__main__":
    main()
