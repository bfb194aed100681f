#!/usr/bin/env python3
"""What speculative decoding costs and gains, measured with `afd bench` (docs/BENCHMARKS.md
"Speculative decoding"). Two tables:

1. verify: the cost of one verification step, `afd bench --query-tokens 2` (each sequence
   forwards its last token and one draft) against a plain decode step (`--query-tokens 1`), the
   two alternating, one process each, the order flipping every pair. Per pair the ratio of the
   median step times; printed: median [p10, p90] over the pairs, and the byte cap: the ratio of
   the weight bytes the two steps read (two tokens route to more distinct experts than one).

2. e2e: end-to-end generation, `afd bench --e2e --prompt-ids-file` with real prompts (batch 1:
   one prompt per round), for every speculative setting against no speculation, the settings
   alternating one process per setting and pass. Per prompt (batch 1) or per round (batch > 1)
   the ratio of decode tokens/s to no speculation on the same prompts; printed: median
   [p10, p90] of the ratios, the acceptance by draft position, tokens per sequence per step,
   and the bound 1 + mean accepted drafts per step (what a free verification would give).

  /usr/bin/python3 bench/speculative.py --afd build/apps/afd verify --model M [--batch 1] \
      [--context 512] [--pairs 5]
  /usr/bin/python3 bench/speculative.py --afd build/apps/afd e2e --model M --prompts FILE \
      [--batch 1] [--rounds 8] [--tokens 256] [--passes 2] \
      [--settings none,mtp:1,mtp:2,mtp:3,ngram:4,ngram:4:auto]

A setting is METHOD:K[:MAX_BATCH] (MAX_BATCH: --speculative-max-batch, a number or auto).

3. edit-prompts: writes the edit workload's prompt ids. Each prompt is a run of consecutive
   held-out documents of the model's eval.txt, joined by blank lines, of at least --min-tokens
   tokens (the text to give back), then a blank line and the text's first --head-chars
   characters (the start of the answer). A model that copies continues with the rest of the text.

  /usr/bin/python3 bench/speculative.py --afd build/apps/afd edit-prompts --model M --out FILE \
      [--n 24] [--min-tokens 400] [--head-chars 60]

FILE: one prompt per line as comma-separated token ids (e.g. from
`afd eval --model M --text T --dump-tokens FILE`).
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def bench(afd, model, args):
    cmd = [afd, "--log-level", "error", "bench", "--model", model, "--json", "--skip-limits", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["rows"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summary(xs):
    return f"{statistics.median(xs):.3f} [{pct(xs, 0.1):.3f}, {pct(xs, 0.9):.3f}]"


def verify(a):
    base = ["--batch", str(a.batch), "--context", str(a.context), "--steps", str(a.steps)] + a.extra
    ratios, caps, t1, t2 = [], [], [], []
    for p in range(a.pairs):
        order = [1, 2] if p % 2 == 0 else [2, 1]
        got = {}
        for q in order:
            got[q] = bench(a.afd, a.model, base + ["--query-tokens", str(q)])[0]
        t1.append(got[1]["step_ms"])
        t2.append(got[2]["step_ms"])
        ratios.append(got[2]["step_ms"] / got[1]["step_ms"])
        caps.append(got[2]["weight_bytes_per_step"] / got[1]["weight_bytes_per_step"])
    print(f"| model | batch | context | decode step ms | verify (2 tokens) step ms | ratio median [p10, p90] "
          f"| byte cap | ratio / cap |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    r = statistics.median(ratios)
    cap = statistics.median(caps)
    print(f"| {a.model} | {a.batch} | {a.context} | {statistics.median(t1):.3f} | {statistics.median(t2):.3f} | "
          f"{summary(ratios)} | {cap:.3f} | {r / cap:.3f} |")


def e2e(a):
    settings = a.settings.split(",")
    base = ["--e2e", "--batch", str(a.batch), "--tokens", str(a.tokens), "--rounds", str(a.rounds),
            "--prompt-ids-file", a.prompts, "--warmup", "1"] + a.extra
    rows = {s: [] for s in settings}  # setting -> per pass, the rows of its process
    for p in range(a.passes):
        order = settings if p % 2 == 0 else list(reversed(settings))
        for s in order:
            args = list(base)
            if s != "none":
                method, k, *max_batch = s.split(":")
                args += ["--speculative", method, "--draft-tokens", k]
                args += ["--speculative-max-batch", max_batch[0]] if max_batch else []
            rows[s].append(bench(a.afd, a.model, args))
    print(f"| setting | decode tok/s (median) | speed-up median [p10, p90] | step ms median | accepted/step "
          f"| bound 1+acc | speed-up / bound | acceptance by position | tokens/seq/step |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|")
    for s in settings:
        ratios, tps, acc, prop, by_pos_p, by_pos_a, per_step, step_ms = [], [], 0, 0, [], [], [], []
        for p in range(a.passes):
            for r0, r in zip(rows["none"][p], rows[s][p]):
                ratios.append(r["decode_tokens_per_s"] / r0["decode_tokens_per_s"])
                tps.append(r["decode_tokens_per_s"])
                step_ms.append(r["step_ms"])
                sp = r["speculative"]
                acc += sp["drafts_accepted"]
                prop += sp["drafts_proposed"]
                per_step.append(sp["tokens_per_sequence_step"])
                for j, (n_p, n_a) in enumerate(zip(sp["proposed_by_position"], sp["accepted_by_position"])):
                    while len(by_pos_p) <= j:
                        by_pos_p.append(0)
                        by_pos_a.append(0)
                    by_pos_p[j] += n_p
                    by_pos_a[j] += n_a
        verifications = sum(r["speculative"]["verifications"] for p in range(a.passes) for r in rows[s][p])
        acc_step = acc / verifications if verifications else 0.0
        bound = 1 + acc_step
        pos = " / ".join(f"{n_a / n_p:.2f}" for n_p, n_a in zip(by_pos_p, by_pos_a) if n_p) or "-"
        sp_med = statistics.median(ratios)
        print(f"| {s} | {statistics.median(tps):.1f} | {summary(ratios)} | {statistics.median(step_ms):.3f} | "
              f"{acc_step:.2f} | {bound:.2f} | "
              f"{sp_med / bound:.3f} | {pos} | {statistics.median(per_step):.2f} |")


def dump_ids(afd, model, texts):
    """Token ids (BOS first) of each text, by `afd eval --dump-tokens` (the model's tokenizer)."""
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "texts.txt"), os.path.join(d, "ids.txt")
        with open(src, "w") as f:
            f.write("\t\t\t".join(texts) + "\n")
        subprocess.run([afd, "--log-level", "error", "eval", "--model", model, "--text", src, "--separator",
                        "\\t\\t\\t", "--dump-tokens", out, "--threads", "1"], check=True, capture_output=True)
        return [[int(t) for t in line.split(",")] for line in open(out).read().split()]


def edit_prompts(a):
    docs = [d.strip() for d in open(os.path.join(a.model, "eval.txt")).read().split("\n\n") if d.strip()]
    lens = [len(ids) - 1 for ids in dump_ids(a.afd, a.model, docs)]
    texts, i = [], 0
    while len(texts) < a.n and i < len(docs):
        j, n = i, 0
        while j < len(docs) and n < a.min_tokens:
            n += lens[j] + 1
            j += 1
        if n < a.min_tokens:
            break
        x = "\n\n".join(docs[i:j])
        texts.append(x + "\n\n" + x[:a.head_chars])
        i = j
    prompts = dump_ids(a.afd, a.model, texts)
    with open(a.out, "w") as f:
        f.writelines(",".join(map(str, p)) + "\n" for p in prompts)
    sizes = sorted(len(p) for p in prompts)
    print(f"{len(prompts)} prompts, {sizes[0]}..{sizes[-1]} tokens -> {a.out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--afd", default="build/apps/afd")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--model", required=True)
    v.add_argument("--batch", type=int, default=1)
    v.add_argument("--context", type=int, default=512)
    v.add_argument("--steps", type=int, default=20)
    v.add_argument("--pairs", type=int, default=5)
    e = sub.add_parser("e2e")
    e.add_argument("--model", required=True)
    e.add_argument("--prompts", required=True)
    e.add_argument("--batch", type=int, default=1)
    e.add_argument("--rounds", type=int, default=8)
    e.add_argument("--tokens", type=int, default=256)
    e.add_argument("--passes", type=int, default=2)
    e.add_argument("--settings", default="none,mtp:1,mtp:2,mtp:3,ngram:4")
    for p in (v, e):
        p.add_argument("extra", nargs="*", help="more afd bench flags (after --)")
    w = sub.add_parser("edit-prompts")
    w.add_argument("--model", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--n", type=int, default=24)
    w.add_argument("--min-tokens", type=int, default=400)
    w.add_argument("--head-chars", type=int, default=60)
    a = ap.parse_args()
    {"verify": verify, "e2e": e2e, "edit-prompts": edit_prompts}[a.cmd](a)


if __name__ == "__main__":
    main()
