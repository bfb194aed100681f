#!/usr/bin/env python3
"""What --deterministic (batch-invariant inference) costs: decode and prefill tokens/s of
`afd bench` with the mode against the default fast mode, measured in the same run, the two
alternating (the order flips every pair) so that a machine's drift hits both alike.

Decode: `afd bench --batch B --context C --steps S` (whole decode steps, median step time).
Prefill: `afd bench --e2e --warmup 1 --batch B --prompt-len P --tokens 2` (prefill tokens/s).
Prints, per row, the median default and deterministic numbers and the ratio deterministic /
default of each pair: median [p10, p90] (below 1: the mode is slower).
--precision reference with --against B: the mode's side runs the afd binary B with the same
flags instead of adding --deterministic (reference precision is batch-invariant without the
flag, so its cost is an A/B of a build whose reference precision takes the fastest orders, --afd,
against B).

  /usr/bin/python3 bench/deterministic_cost.py --afd build/apps/afd --model models/bench \
      --pairs 5 --decode-batch 1,16,64 --context 512 --prefill-batch 1 --prompt-len 512
"""
import argparse
import json
import statistics
import subprocess


def run(a, args, deterministic):
    afd = a.against if deterministic and a.against else a.afd
    cmd = [afd, "--log-level", "error", "bench", "--model", a.model, "--json", "--skip-limits", *args]
    if deterministic and not a.against:
        cmd.append("--deterministic")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["rows"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--afd", default="build/apps/afd")
    ap.add_argument("--model", required=True)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--decode-batch", default="1,16,64")
    ap.add_argument("--context", default="512")
    ap.add_argument("--steps", default="10")
    ap.add_argument("--prefill-batch", default="1")
    ap.add_argument("--prompt-len", default="512")
    ap.add_argument("--threads", default="0")
    ap.add_argument("--precision", default="fast", help="fast | reference")
    ap.add_argument("--against", help="the mode's side runs this afd binary, without --deterministic")
    a = ap.parse_args()

    common = ["--threads", a.threads, "--precision", a.precision]
    decode_args = ["--batch", a.decode_batch, "--context", a.context, "--steps", a.steps, *common]
    prefill_args = ["--e2e", "--warmup", "1", "--batch", a.prefill_batch, "--prompt-len", a.prompt_len, "--tokens",
                    "2", *common]
    # key -> {False: [value per pair], True: [...]}; values are tokens/s (higher is better)
    got = {}
    for i in range(a.pairs):
        for det in ((False, True) if i % 2 == 0 else (True, False)):
            for r in run(a, decode_args, det):
                key = ("decode", r["batch"], r["context"])
                got.setdefault(key, {False: [], True: []})[det].append(r["batch"] * 1000.0 / r["step_ms"])
            for r in run(a, prefill_args, det):
                key = ("prefill", r["batch"], r["prompt_len"])
                got.setdefault(key, {False: [], True: []})[det].append(r["prefill_tokens_per_s"])

    print(f"{'what':8} {'batch':>5} {'tokens':>6} {'default tok/s':>14} {'determ. tok/s':>14}  ratio median [p10, p90]")
    for key in sorted(got):
        d, n = got[key][False], got[key][True]
        ratios = [y / x for x, y in zip(d, n)]
        print(f"{key[0]:8} {key[1]:>5} {key[2]:>6} {statistics.median(d):14.1f} {statistics.median(n):14.1f}  "
              f"{statistics.median(ratios):.3f} [{pct(ratios, 0.1):.3f}, {pct(ratios, 0.9):.3f}]")


if __name__ == "__main__":
    main()
