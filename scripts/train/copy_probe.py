"""Where a trained model copies from: next-token top-1 on the repeat of a run R of held-out text,
as R grows and as text is put before R or between R and its repeat.

  /usr/bin/python3 scripts/train/copy_probe.py MODEL [--tokenizer DIR] [--units 8]

MODEL is a packaged model directory (model.safetensors) or a train.py WORK directory
(trained.safetensors); both hold config.json. Each unit is [bos] A R B "\\n\\n" R with R a run of
consecutive held-out words (no document breaks) cut to n ids and A, B other held-out text of the
given lengths. Top-1 is counted on R's repeat from its second id on (the first cannot be known).
A model that copies by matching ids scores the same whatever A and B are; one that learned to copy
from a fixed offset after bos or before the separator does not.
"""

import argparse
import os
import random
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))

import corpus  # noqa: E402
import model as M  # noqa: E402
import tokenizer as tk  # noqa: E402
import train as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokenizer", help="tokenizer directory (default: MODEL)")
    ap.add_argument("--units", type=int, default=8, help="units per row of the table")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = tk.Tokenizer.read(a.tokenizer or a.model)
    m = M.Model(T.load_json(os.path.join(a.model, "config.json")), 1)
    T.load_init(m, a.model)
    words = " ".join(corpus.build(seed=1)["eval_docs"]).split()
    sep = tok.encode("\n\n")

    def run(rng, n):
        i = rng.randrange(len(words) - 400)
        return tok.encode(" " + " ".join(words[i:i + 400]))[:n]

    @torch.no_grad()
    def top1(r_len, before, between):
        rng = random.Random(4)
        hit = tot = 0
        for _ in range(a.units):
            r, pre, mid = run(rng, r_len), run(rng, before) if before else [], run(rng, between) if between else []
            ids = [tok.bos] + pre + r + mid + sep + r
            start = len(ids) - len(r)
            pred = m.forward(torch.tensor([ids]))[0][0, start:-1].argmax(-1)
            hit += int((pred == torch.tensor(r[1:])).sum())
            tot += len(r) - 1
        return hit / tot

    print("| R ids | text before R | text between R and its repeat | copy top-1 |")
    print("|---:|---:|---:|---:|")
    rows = [(n, 0, 0) for n in (32, 48, 64, 80, 100, 150, 250)]
    rows += [(32, f, 0) for f in (32, 64, 128, 256)] + [(32, 0, f) for f in (32, 64, 128, 256)]
    for n, before, between in rows:
        print(f"| {n} | {before} | {between} | {top1(n, before, between):.3f} |", flush=True)


if __name__ == "__main__":
    main()
