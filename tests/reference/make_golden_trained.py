#!/usr/bin/python3
"""Golden data for afd's shipped trained models (assets/models/wordnet-*): the f64 reference's
(mla_mfa_ref.py) teacher-forced negative log-likelihood over the held-out sample, and its greedy
continuations of a chat prompt and a text prompt.

    /usr/bin/python3 tests/reference/make_golden_trained.py [MODEL_DIR ...]

For each model directory it writes tests/reference/trained/<name>.json:
  documents, tokens, nll_mean, perplexity: every blank-line-separated document of the model's
    eval-sample.txt as [bos] + its ids, all tokens after the first scored (what `afd eval`
    computes with its default separator);
  mtp_top1, mtp_tokens (models with an MTP module): the module's greedy top-1 accuracy on the
    token after next over the same documents (positions i with i+2 in the document), computed
    from the shipped weights by mtp_forward (MODELS.md B7);
  prompts, greedy_tokens, min_gap: MAX_NEW greedy tokens (generation does not stop at eos) after
    each prompt, and the smallest top-2 logit gap among those decisions (must exceed 1e-3 so an
    f32 engine makes the same choices).
Token ids come from the trainer's tokenizer (scripts/train/tokenizer.py), which the tests check
against afd's by the token count `afd eval` reports, and the real-tokenizer test checks against an
independent JS implementation.
"""

import json
import math
import os
import sys

import numpy as np

import hf_moe_ref
import mla_mfa_ref as ref

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "train"))
import tokenizer as tk  # noqa: E402

MAX_NEW = 16
PROMPTS = [("chat", "What does harbor mean?"), ("text", "The ship entered the")]
DEFAULT_MODELS = ["assets/models/wordnet-dsv3", "assets/models/wordnet-step3"]


def log_softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def golden(model_dir):
    tok = tk.Tokenizer.read(model_dir)
    cfg = ref.Config.from_dir(model_dir)
    model = ref.Model.from_dir(model_dir, mla_form="absorbed", load_mtp=cfg.n_mtp > 0)
    docs = [d.strip() for d in open(os.path.join(model_dir, "eval-sample.txt")).read().split("\n\n") if d.strip()]
    nll, n, mtp_hit, mtp_n = 0.0, 0, 0, 0
    for i in range(0, len(docs), 16):
        seqs = [[tok.bos] + tok.encode(d) for d in docs[i:i + 16]]
        outs, hidden = model.forward([(model.new_sequence(), s) for s in seqs], return_hidden=True)
        for s, logits, h in zip(seqs, outs, hidden):
            lp = log_softmax(logits[:-1])
            nll -= float(np.sum(lp[np.arange(len(s) - 1), s[1:]]))
            n += len(s) - 1
            if model.mtp is not None and len(s) > 2:
                ml = model.mtp_forward(model.new_mtp_sequence(), h[:-1], s[1:])   # row i predicts s[i+2]
                mtp_hit += int(np.sum(np.argmax(ml[:-1], axis=-1) == np.asarray(s[2:])))
                mtp_n += len(s) - 2
    prompts = []
    for kind, text in PROMPTS:
        if kind == "chat":
            sp = tok.special
            prompts.append([tok.bos, sp["<|user|>"]] + tok.encode(text) + [sp["<|assistant|>"]])
        else:
            prompts.append([tok.bos] + tok.encode(text))
    rows, toks = hf_moe_ref.greedy(model, prompts, MAX_NEW)
    gaps = []
    for p, r in zip(prompts, rows):
        for row in r[len(p) - 1:]:
            top = np.sort(row)[-2:]
            gaps.append(float(top[1] - top[0]))
    out = {"model": os.path.basename(os.path.normpath(model_dir)), "documents": len(docs), "tokens": n,
           "nll_mean": nll / n, "perplexity": math.exp(nll / n), "prompts": prompts,
           **({"mtp_top1": mtp_hit / mtp_n, "mtp_tokens": mtp_n} if mtp_n else {}),
           "prompt_texts": [t for _, t in PROMPTS], "greedy_tokens": toks,
           "greedy_texts": [tok.decode(t) for t in toks], "min_gap": min(gaps)}
    if out["min_gap"] <= 1e-3:
        raise SystemExit(f"{model_dir}: a greedy decision has a top-2 gap of {out['min_gap']:.2e}; pick other prompts")
    return out


def main():
    dirs = sys.argv[1:] or [os.path.join(ROOT, d) for d in DEFAULT_MODELS]
    os.makedirs(os.path.join(HERE, "trained"), exist_ok=True)
    for d in dirs:
        g = golden(d)
        path = os.path.join(HERE, "trained", g["model"] + ".json")
        with open(path, "w") as f:
            json.dump(g, f, indent=1)
            f.write("\n")
        print(f"{path}: {g['tokens']} tokens, perplexity {g['perplexity']:.3f}, MTP top-1 {g.get('mtp_top1')}, "
              f"min gap {g['min_gap']:.3g}, "
              f"greedy {g['greedy_texts']}")


if __name__ == "__main__":
    main()
