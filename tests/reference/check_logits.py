#!/usr/bin/python3
"""Compares a logits dump written by another engine (e.g. `afd generate --dump-logits`)
with the float64 reference (hf_moe_ref.py or mla_mfa_ref.py, by the model's model_type).

    check_logits.py MODEL_DIR DUMP_FILE [PROMPT ...] [--max-new-tokens N] [--gen-ids IDS ...]
                    [--tol 1e-4] [--report-only] [--json]

PROMPT is a comma-separated id list, one per sequence, in the order the dump holds them
(no PROMPT: the prompts of MODEL_DIR/golden.json). The dump must hold, per sequence and in
prompt order, one float32 row of vocab_size logits for every prompt position and for every
generated step t = 1..N-1 (the row after feeding generated token t-1); see README.md.

The reference is teacher-forced on the engine's own generated tokens: by default the argmax
of each of its token-choosing rows (greedy decoding), or --gen-ids (one comma list per
prompt) for sampled runs. So a fast mode that picks a different token at some step is still
compared row for row, and the report says where its greedy tokens first leave the
reference's. Exit status: 0 if max |engine - reference| <= --tol and (for greedy dumps) the
tokens equal the reference's greedy tokens, 1 otherwise (always 0 with --report-only),
2 on unusable input.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402  (greedy, row_table)
import reference  # noqa: E402  (picks hf_moe_ref or mla_mfa_ref by model_type)


def parse_ids(s):
    try:
        return [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise SystemExit(f"check_logits: bad id list {s!r}")


def fail(msg):
    print(f"check_logits: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("dump_file")
    ap.add_argument("prompts", nargs="*", help="comma-separated ids per sequence")
    ap.add_argument("--max-new-tokens", type=int, help="per sequence (default: golden.json's, else inferred)")
    ap.add_argument("--gen-ids", action="append", help="generated ids of one sequence (repeat per prompt)")
    ap.add_argument("--tol", type=float, default=1e-4, help="max abs logits error allowed (default 1e-4)")
    ap.add_argument("--report-only", action="store_true", help="exit 0 whatever the error")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args()

    golden = None
    gpath = os.path.join(args.model_dir, "golden.json")
    if os.path.exists(gpath):
        with open(gpath) as f:
            golden = json.load(f)
    prompts = [parse_ids(p) for p in args.prompts]
    if not prompts:
        if golden is None:
            fail("no prompts given and MODEL_DIR has no golden.json")
        prompts = golden["prompts"]
    if any(len(p) == 0 for p in prompts):
        fail("empty prompt")

    try:
        model = reference.load_model(args.model_dir)
    except (ValueError, OSError) as e:
        fail(f"{args.model_dir}: {e}")
    V = model.cfg.vocab_size
    size = os.path.getsize(args.dump_file)
    if size % (4 * V) != 0:
        fail(f"{args.dump_file}: {size} bytes is not a whole number of float32 rows of vocab_size {V}")
    dump = np.fromfile(args.dump_file, dtype="<f4").reshape(-1, V).astype(np.float64)
    n_rows = dump.shape[0]
    sum_len = sum(len(p) for p in prompts)
    n_new = args.max_new_tokens
    if n_new is None and golden is not None and prompts == golden["prompts"]:
        n_new = golden["max_new_tokens"]
    if n_new is None:
        extra = n_rows - sum_len
        if extra < 0 or extra % len(prompts) != 0:
            fail(f"cannot infer max_new_tokens: {n_rows} rows for prompts of total length {sum_len}")
        n_new = extra // len(prompts) + 1
    want_rows = sum_len + len(prompts) * (n_new - 1)
    if n_rows != want_rows:
        fail(f"{args.dump_file}: {n_rows} rows, expected {want_rows} "
             f"(sum of prompt lengths {sum_len} + {len(prompts)} x (max_new_tokens {n_new} - 1))")
    if not np.all(np.isfinite(dump)):
        fail(f"{args.dump_file}: non-finite logits")

    # the engine's tokens: --gen-ids or its greedy choices
    table = ref.row_table(prompts, n_new)
    starts = np.cumsum([0] + [len(p) + n_new - 1 for p in prompts])
    if args.gen_ids:
        if len(args.gen_ids) != len(prompts):
            fail("--gen-ids must be given once per prompt")
        engine_tokens = [parse_ids(s) for s in args.gen_ids]
        if any(len(t) < n_new for t in engine_tokens):
            fail(f"--gen-ids lists need {n_new} ids")
        engine_tokens = [t[:n_new] for t in engine_tokens]
        greedy_dump = False
    else:
        engine_tokens = [[int(x) for x in np.argmax(dump[s + len(p) - 1:s + len(p) + n_new - 1], axis=1)]
                         for p, s in zip(prompts, starts)]
        greedy_dump = True

    rows, _ = ref.greedy(model, prompts, n_new, forced=engine_tokens)
    refl = np.concatenate([np.asarray(r) for r in rows])
    _, ref_tokens = ref.greedy(reference.load_model(args.model_dir), prompts, n_new)

    err = np.abs(dump - refl)
    row_err = err.max(axis=1)
    worst = int(np.argmax(row_err))
    kinds = np.array([k for _, _, k in table])
    argmax_differs = int(np.sum(np.argmax(dump, axis=1) != np.argmax(refl, axis=1)))
    diverge = []
    for i, (a, b) in enumerate(zip(engine_tokens, ref_tokens)):
        t = next((j for j in range(n_new) if a[j] != b[j]), None)
        if t is not None:
            diverge.append({"seq": i, "step": t, "engine": a[t], "reference": b[t]})
    report = {
        "model_dir": args.model_dir,
        "dump_file": args.dump_file,
        "rows": n_rows,
        "vocab_size": V,
        "max_new_tokens": n_new,
        "max_abs_err": float(row_err.max()),
        "mean_abs_err": float(err.mean()),
        "max_abs_err_prompt_rows": float(row_err[kinds == "prompt"].max()),
        "max_abs_err_gen_rows": float(row_err[kinds == "gen"].max()) if np.any(kinds == "gen") else 0.0,
        "worst_row": {"row": worst, "seq": table[worst][0], "position": table[worst][1], "kind": table[worst][2]},
        "max_abs_ref_logit": float(np.abs(refl).max()),
        "rows_argmax_differs": argmax_differs,
        "tokens_source": "argmax of dump (greedy)" if greedy_dump else "--gen-ids",
        "greedy_divergence": diverge,
        "tol": args.tol,
    }
    ok = report["max_abs_err"] <= args.tol and (not greedy_dump or not diverge)
    report["pass"] = bool(ok)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        w = report["worst_row"]
        print(f"rows {n_rows} (prompt {int(np.sum(kinds == 'prompt'))}, gen {int(np.sum(kinds == 'gen'))}), "
              f"vocab {V}, max_new_tokens {n_new}")
        print(f"max abs err {report['max_abs_err']:.3e} at row {w['row']} (seq {w['seq']}, position "
              f"{w['position']}, {w['kind']}); mean abs err {report['mean_abs_err']:.3e}")
        print(f"  prompt rows max {report['max_abs_err_prompt_rows']:.3e}, gen rows max "
              f"{report['max_abs_err_gen_rows']:.3e}; max |reference logit| {report['max_abs_ref_logit']:.2f}")
        print(f"rows whose argmax differs from the reference's: {argmax_differs}")
        if diverge:
            for d in diverge:
                print(f"  seq {d['seq']}: engine token {d['engine']} != reference greedy {d['reference']} "
                      f"at step {d['step']}")
        else:
            print("engine tokens equal the reference's greedy tokens")
        print(("PASS" if ok else "FAIL") + f" (tol {args.tol:g})")
    sys.exit(0 if ok or args.report_only else 1)


if __name__ == "__main__":
    main()
