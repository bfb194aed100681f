"""Trains one of afd's tiny WordNet models (CPU, PyTorch) and writes what `afd make-model
--config --weights --tokenizer` turns into the shipped checkpoint.

  /usr/bin/python3 scripts/train/train.py --arch deepseek_v3 --out WORK [--steps N] [--seed S]

A second phase continues a packaged checkpoint (--init) so that it copies text from far back in
its context, which prompt-lookup drafting needs: induction rows, attention losses on chosen
heads, single-document rows, then the MTP module alone (--mtp-only). The stages that trained the
shipped default model are at the end of scripts/train-model.sh; the experiments behind them in
docs/TRAINING.md "Teaching the default model to copy".

WORK receives: tokenizer.json + tokenizer_config.json (trained here, or reused from
--tokenizer DIR), config.json (the model's HF config), trained.safetensors (float32, HF
logical names), eval.txt (the held-out documents, one per blank-line-separated block),
chat_eval.json (held-out words for the chat check), curve.json / curve.svg (training curve)
and metrics.json (final held-out perplexity, the unigram baseline, MTP accuracy).
Deterministic for a seed and a thread count.
"""

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))

import corpus  # noqa: E402
import model as M  # noqa: E402
import safetensors_io as st  # noqa: E402
import tokenizer as tk  # noqa: E402

VOCAB = 4096
MAX_POS = 2048


def config_for(arch):
    common = {"vocab_size": VOCAB, "hidden_size": 256, "num_attention_heads": 4, "rms_norm_eps": 1e-6,
              "hidden_act": "silu", "tie_word_embeddings": False}
    if arch == "deepseek_v3":
        c = dict(common)
        c.update({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                  "num_hidden_layers": 4, "num_key_value_heads": 4, "intermediate_size": 768,
                  "moe_intermediate_size": 192, "n_routed_experts": 8, "n_shared_experts": 1,
                  "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
                  "moe_layer_freq": 1, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
                  "topk_method": "noaux_tc", "norm_topk_prob": True, "q_lora_rank": 128, "kv_lora_rank": 64,
                  "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "rope_theta": 10000.0,
                  "rope_scaling": None, "rope_interleave": True, "max_position_embeddings": MAX_POS,
                  "num_nextn_predict_layers": 1})
        return c
    if arch == "step3":
        t = dict(common)
        t.update({"architectures": ["Step3TextForCausalLM"], "model_type": "step3_text",
                  "num_hidden_layers": 4, "num_attention_groups": 1, "head_dim": 64, "share_q_dim": 128,
                  "intermediate_size": 768, "moe_num_experts": 8, "moe_top_k": 2, "moe_intermediate_size": 192,
                  "share_expert_dim": 192, "norm_expert_weight": False, "moe_layers_enum": "1,2",
                  "rope_theta": 500000.0, "rope_scaling": None, "max_position_embedding": MAX_POS,
                  "max_seq_len": MAX_POS, "rms_norm_eps": 1e-5})
        return {"architectures": ["Step3VLForConditionalGeneration"], "model_type": "step3_vl",
                "text_config": t, "tie_word_embeddings": False}
    raise SystemExit(f"unknown --arch {arch} (deepseek_v3, step3)")


def documents(tok, data, rng):
    """Training documents as token lists: [bos] doc [eos] for plain text, the chat template's
    rendering for chat pairs; shuffled."""
    docs = [[tok.bos] + tok.encode(d) + [tok.eos] for d in data["train_plain"]]
    docs += [tok.encode_chat(u, a) for u, a in data["train_chat"]]
    rng.shuffle(docs)
    return docs


def copy_unit(tok, plain, rng, max_tokens, edit_rate):
    """[bos] X "\n\n" X' [eos] as ids: X a run of consecutive plain documents joined by blank
    lines (as eval.txt holds them), cut to about max_tokens; X' is X with each word replaced by
    another word of X at edit_rate (0: an exact copy). -> (ids, index of X' 's first id)."""
    i = rng.randrange(len(plain))
    text, n = plain[i], 0
    while len(tok.encode(text)) < max_tokens and i + 1 < len(plain):
        i += 1
        text += "\n\n" + plain[i]
    words = text.split(" ")
    if len(words) > 1:
        n = max(1, int(len(words) * rng.uniform(0.2, 1.0)))
        while n < len(words) and len(tok.encode(" ".join(words[:n]))) < max_tokens:
            n += 1
        words = words[:n]
    x = " ".join(words)
    y = " ".join(rng.choice(words) if rng.random() < edit_rate else w for w in words)
    head = [tok.bos] + tok.encode(x + "\n\n")
    return head + tok.encode(y) + [tok.eos], len(head)


def random_copy_unit(tok, rng, n, pool=0, unigram=None, spans=None, gap=None):
    """[bos] A R B "\n\n" R [eos]: R n ids drawn uniformly from the ordinary tokens, or with pool > 0
    from `pool` of them chosen for the unit (ids then recur within R, as words do in text, so the
    id before a position no longer tells where the copy is), or with unigram = (ids, cumulative
    weights) as often as text uses them, or with spans = (word list, K) as runs of 1..K
    consecutive words of the training text taken at random places (K = 1: random words), cut to
    n ids: text-shaped, yet only copying predicts where each run goes. Only copying predicts R's
    second half, so these units teach the induction that text copies need.
    A and B are empty, or with gap = (word list, G) runs of training text of 0..G ids each: then
    neither R's offset from bos nor its distance to the copy is fixed, and only matching the
    copy's ids against R (not counting positions) finds where it continues.
    -> (ids, targets, src): targets 0 where the id is noise no model can predict (bos, A, R's first
    half, B, the separator), 1 on the copy and its eos; src[i] the position in ids that a copy
    continues from at i (where R's i-th id was first followed by the next one), -1 where none."""
    alphabet = rng.sample(range(256, tok.bos), pool) if pool else None
    if spans:
        r = text_run(tok, rng, spans[0], n, spans[1])
    elif unigram:
        r = rng.choices(unigram[0], cum_weights=unigram[1], k=n)
    else:
        r = [rng.choice(alphabet) if alphabet else rng.randrange(256, tok.bos) for _ in range(n)]
    a = b = []
    if gap:
        a, b = (text_run(tok, rng, gap[0], rng.randint(0, gap[1]), 64) for _ in range(2))
    ids = [tok.bos] + a + r + b + tok.encode("\n\n") + r + [tok.eos]
    first, second = 1 + len(a), len(ids) - n - 1
    src = [-1] * len(ids)
    for k in range(n - 1):
        src[second + k] = first + k + 1
    return ids, [0] * (len(ids) - n - 1) + [1] * (n + 1), src


def text_run(tok, rng, words, n, k_max):
    """n ids of runs of 1..k_max consecutive words of `words` taken at random places."""
    r = []
    while len(r) < n:
        i = rng.randrange(len(words) - k_max)
        r += tok.encode(" " + " ".join(words[i:i + rng.randint(1, k_max)]))
    return r[:n]


def copy_row(tok, plain, rng, length, copy_max, random_share=0.5, random_max=128, pool=0, unigram=None,
             spans=None, gap=None):
    """One training row of `length` ids packed with copy units: random_share of them runs of
    random tokens (8..min(random_max, copy_max)) repeated once, the others runs of text
    (32..copy_max tokens; exact copies, or with 3 % of the words swapped).
    -> (ids, targets, src): targets 0 on ids that are random noise (random_copy_unit), so that the
    loss skips them, 1 elsewhere; src as random_copy_unit's (-1 in text copy units)."""
    row, tgt, src = [], [], []
    while len(row) < length:
        if rng.random() < random_share:
            ids, t, sr = random_copy_unit(tok, rng, rng.randint(8, min(random_max, copy_max)), pool, unigram, spans,
                                          gap)
            row, tgt, src = row + ids, tgt + t, src + [j + len(row) if j >= 0 else -1 for j in sr]
            continue
        ids, _ = copy_unit(tok, plain, rng, rng.randint(32, copy_max), 0.0 if rng.random() < 0.5 else 0.03)
        row, tgt, src = row + ids, tgt + [1] * len(ids), src + [-1] * len(ids)
    return row[:length], tgt[:length], src[:length]


@torch.no_grad()
def random_copy_accuracy(model, tok, n=16, length=32, seed=11, pool=0, unigram=None, spans=None, gap=None):
    """Top-1 on the repeated half of n held-out random_copy_units of `length` ids: induction alone."""
    rng = random.Random(seed)
    hit = tot = 0
    for _ in range(n):
        ids = random_copy_unit(tok, rng, length, pool, unigram, spans, gap)[0]
        x = torch.tensor([ids[:-1]])
        pred = model.forward(x)[0][0, -length - 1:-1].argmax(-1)
        hit += int((pred == torch.tensor(ids[-length - 1:-1])).sum())
        tot += length
    return hit / tot


def induction_rows(tok, rng, n, r_max=32, pool=0, unigram=None, spans=None, length=256, gap=None):
    """n rows of length + 1 ids packed with random_copy_units (R of 8..r_max ids, drawn as
    random_copy_unit's pool / unigram / spans / gap say) -> (x [n, length], y [n, length],
    src [n, length]) with y -100 (not scored) except on the repeated halves: only copying lowers
    their loss, and the unpredictable first halves add no gradient; src as random_copy_unit's."""
    rows = [copy_row(tok, None, rng, length + 1, r_max, random_share=1.0, random_max=r_max, pool=pool, unigram=unigram,
                     spans=spans, gap=gap)
            for _ in range(n)]
    chunk = torch.tensor([r for r, _, _ in rows])
    scored = torch.tensor([t for _, t, _ in rows]) != 0
    src = torch.tensor([s[:-1] for _, _, s in rows])
    return chunk[:, :-1], chunk[:, 1:].masked_fill(~scored[:, 1:], -100), src


def padded(seqs, pad):
    """Token lists as one batch padded with `pad`: (tokens [B, T], mask [B, T-1] of the positions
    whose next token is a sequence's own), T the longest length."""
    T = max(len(s) for s in seqs)
    x = torch.full((len(seqs), T), pad, dtype=torch.long)
    m = torch.zeros(len(seqs), T - 1, dtype=torch.bool)
    for j, s in enumerate(seqs):
        x[j, :len(s)] = torch.tensor(s)
        m[j, :len(s) - 1] = True
    return x, m


def doc_rows(docs, rng, n, pad, max_len=256):
    """n training documents (token lists, each from its bos), at most max_len + 1 ids, padded with
    `pad` -> (x [n, T], y [n, T]) with y -100 on the padding."""
    x, m = padded([d[:max_len + 1] for d in rng.sample(docs, n)], pad)
    return x[:, :-1], x[:, 1:].masked_fill(~m, -100)


@torch.no_grad()
def copy_accuracy(model, tok, docs, n=24, max_tokens=400, seed=5, shuffle=False):
    """Top-1 next-token accuracy on the copied half of n exact copy units of held-out documents
    (each X about max_tokens long): how well the model repeats text from far back. shuffle: X's
    words in a random order, so that only copying (not the language model) predicts the copy."""
    rng = random.Random(seed)
    hit = tot = 0
    for _ in range(n):
        ids, start = copy_unit(tok, docs, rng, max_tokens, 0.0)
        if shuffle:
            words = tok.decode(ids[1:start]).strip().split(" ")
            rng.shuffle(words)
            head = [tok.bos] + tok.encode(" ".join(words) + "\n\n")
            ids, start = head + tok.encode(" ".join(words)) + [tok.eos], len(head)
        x = torch.tensor([ids])
        logits, _ = model.forward(x)
        pred = logits[0, start - 1:-1].argmax(-1)
        hit += int((pred == x[0, start:]).sum())
        tot += len(ids) - start
    return hit / tot


def load_json(path):
    with open(path) as f:
        return json.load(f)


def load_init(model, model_dir):
    """Overwrites the model's parameters with a checkpoint's (same config): a packaged model
    directory (model.safetensors), or a training run's WORK directory (trained.safetensors)."""
    trained = os.path.join(model_dir, "trained.safetensors")
    ts = st.read_file(trained) if os.path.exists(trained) else st.load_dir(model_dir)
    for k, p in model.P.items():
        if k not in ts:
            raise SystemExit(f"--init {model_dir}: tensor {k} missing")
        v = torch.from_numpy(ts[k].to_f64()).float().reshape(p.shape)
        with torch.no_grad():
            p.copy_(v)


def eval_batches(tok, docs, batch=64):
    """Held-out documents as ([bos] + doc) in padded batches sorted by length: (tokens [B, T],
    mask [B, T-1] of the scored positions)."""
    seqs = sorted(([tok.bos] + tok.encode(d) for d in docs), key=len)
    for i in range(0, len(seqs), batch):
        yield padded(seqs[i:i + batch], tok.eos)


@torch.no_grad()
def evaluate(model, batches):
    """-> (mean NLL, next-token top-1, MTP top-1 on t[i+2] or None, tokens scored)."""
    nll, hit, mtp_hit, mtp_n, n = 0.0, 0, 0, 0, 0
    for x, m in batches:
        logits, h = model.forward(x)
        lp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        tgt = x[:, 1:]
        nll -= lp.gather(-1, tgt[..., None])[..., 0][m].sum().item()
        hit += (logits[:, :-1].argmax(-1) == tgt)[m].sum().item()
        n += int(m.sum())
        if model.n_mtp and x.shape[1] > 2:
            ml = model.mtp_forward(h[:, :-1], x[:, 1:])           # position i predicts t[i+2]
            mm = m[:, 1:]
            mtp_hit += (ml[:, :-1].argmax(-1) == x[:, 2:])[mm].sum().item()
            mtp_n += int(mm.sum())
    return nll / n, hit / n, (mtp_hit / mtp_n if mtp_n else None), n


def unigram_nll(train_docs, eval_batches_list, vocab):
    counts = np.ones(vocab)  # add-one smoothing
    for d in train_docs:
        np.add.at(counts, d, 1)
    logp = np.log(counts / counts.sum())
    nll, n = 0.0, 0
    for x, m in eval_batches_list:
        t = x[:, 1:][m].numpy()
        nll -= logp[t].sum()
        n += t.size
    return nll / n


def svg_curve(curve, path, title, batch, seq):
    W, Hh, pad = 640, 360, 50
    steps = [p["step"] for p in curve]
    ys = [math.exp(p["train_loss"]) for p in curve]
    ev = [(p["step"], p["eval_ppl"]) for p in curve if p.get("eval_ppl")]
    allv = ys + [v for _, v in ev]
    lo, hi = math.log(min(allv)), math.log(max(allv))
    sx = lambda s: pad + (W - 2 * pad) * s / max(steps)
    sy = lambda v: Hh - pad - (Hh - 2 * pad) * (math.log(v) - lo) / max(hi - lo, 1e-9)
    line = lambda pts, col: ('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' %
                             (col, " ".join("%.1f,%.1f" % (sx(s), sy(v)) for s, v in pts)))
    ticks = [10 ** k * m for k in range(0, 6) for m in (1, 2, 5) if min(allv) <= 10 ** k * m <= max(allv)]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (W, Hh), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" font-size="13">%s</text>' % (pad, title)]
    for t in ticks:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="5" y="%.1f">%g</text>' %
                   (pad, W - pad, sy(t), sy(t), sy(t) + 4, t))
    out.append(line(list(zip(steps, ys)), "#1f77b4"))
    if ev:
        out.append(line(ev, "#d62728"))
    out.append('<text x="%d" y="%d">step (batch %d x %d tokens); blue: training perplexity, red: held-out '
               'perplexity (log scale)</text>' % (pad, Hh - 15, batch, seq))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="deepseek_v3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokenizer", help="reuse the tokenizer files of this directory")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seq", type=int, default=128, help="training row length in tokens")
    ap.add_argument("--init", help="continue from this packaged checkpoint or WORK directory (same --arch) instead "
                                   "of random weights")
    ap.add_argument("--copy-frac", type=float, default=0.0,
                    help="share of each batch's rows packed with copy units (copy_row) instead of text")
    ap.add_argument("--copy-random", type=float, default=0.5, help="share of copy units that repeat random tokens")
    ap.add_argument("--induction-rows", type=int, default=0,
                    help="rows of repeated random tokens per step (induction_rows), scored on the copies only")
    ap.add_argument("--induction-max", type=int, default=32, help="longest random run R of the induction rows")
    ap.add_argument("--induction-len", type=int, default=256,
                    help="induction row length in tokens (a unit takes 2 R + 4 of them, plus the gaps)")
    ap.add_argument("--induction-gap", type=int, default=0,
                    help="put 0..G ids of training text before each induction unit's R and between R and its copy")
    ap.add_argument("--induction-pool", type=int, default=0,
                    help="draw each induction unit's R from this many ids (0: from all), so that ids recur as in text")
    ap.add_argument("--induction-unigram", action="store_true",
                    help="draw the induction units' ids as often as the training text uses them")
    ap.add_argument("--induction-words", type=int, default=0,
                    help="build the induction units from runs of 1..K consecutive training-text words taken "
                         "at random places (1: random words); 0: from single ids")
    ap.add_argument("--doc-rows", type=int, default=0,
                    help="rows per step that hold one training document each from its bos, as afd eval and short "
                         "prompts see them (the text rows are packed chunks, nearly always with other documents "
                         "before); a copy head must learn to stay out where nothing earlier matches")
    ap.add_argument("--attend-prev", help="L:H[,L:H...]: train head H of layer L to attend to the previous position "
                                          "on the induction rows (previous-token heads; in two layers, the later one "
                                          "then carries the two ids before each position)")
    ap.add_argument("--attend-copy", help="L:H[,L:H...]: train head H of layer L (after --attend-prev's layers) to "
                                          "attend, at each id of an induction unit's repeat, to where the copy "
                                          "continues (induction heads)")
    ap.add_argument("--attend-weight", type=float, default=0.5, help="weight of each --attend-* loss")
    ap.add_argument("--mtp-only", action="store_true",
                    help="train the MTP module alone (its block, norms and eh_proj) on the text rows, the main model "
                         "frozen (needs --init; not with the --induction/--doc/--copy rows). The WORK directory keeps "
                         "--init's curve (the main model's) and records this stage under mtp_stage")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="end the training after this many steps (0: --steps), the schedule still that of --steps")
    ap.add_argument("--stop-file", help="end the training at the next held-out evaluation once this file exists "
                                        "(writing everything as after the last step)")
    ap.add_argument("--bench", action="store_true", help="time 10 steps and exit")
    ap.add_argument("--tokenizer-only", action="store_true", help="train and write the tokenizer, then exit")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    data = corpus.build(seed=a.seed)
    if a.tokenizer:
        tok = tk.Tokenizer.read(a.tokenizer)
    else:
        texts = data["train_plain"] + [u for u, _ in data["train_chat"]] + [x for _, x in data["train_chat"]]
        tok = tk.Tokenizer(tk.train_bpe(texts, VOCAB), VOCAB)
    tok.write(a.out, MAX_POS)
    print(f"tokenizer ready ({time.time() - t0:.0f} s)", flush=True)
    if a.tokenizer_only:
        return
    cfg = config_for(a.arch)
    tcfg = cfg.get("text_config", cfg)
    tcfg["bos_token_id"], tcfg["eos_token_id"] = tok.bos, tok.eos
    if cfg is not tcfg:
        cfg["bos_token_id"], cfg["eos_token_id"] = tok.bos, tok.eos
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = random.Random(a.seed)
    docs = documents(tok, data, rng)
    stream = np.fromiter((t for d in docs for t in d), dtype=np.int64)
    SEQ = a.seq
    n_chunks = (len(stream) - 2) // SEQ
    freq = np.bincount(stream, minlength=VOCAB)[:tok.bos]  # the ordinary tokens' counts in the training text
    text_unigram = (list(range(tok.bos)), np.cumsum(freq).tolist())
    unigram = text_unigram if a.induction_unigram else None
    train_words = " ".join(data["train_plain"]).split()
    spans = (train_words, a.induction_words) if a.induction_words else None
    gap = (train_words, a.induction_gap) if a.induction_gap else None
    word_copy = lambda: random_copy_accuracy(model, tok, spans=(train_words, 1))
    gapped_copy = lambda: random_copy_accuracy(model, tok, spans=(train_words, 8), gap=(train_words, 192))
    print(f"{len(docs)} training documents, {len(stream)} tokens, {n_chunks} chunks of {SEQ}", flush=True)
    with open(os.path.join(a.out, "eval.txt"), "w") as f:
        f.write("\n\n".join(data["eval_docs"]) + "\n")
    with open(os.path.join(a.out, "chat_eval.json"), "w") as f:
        json.dump({"words": corpus.chat_words(data), "question": "What does {w} mean?"}, f, indent=1)
    ev_all = list(eval_batches(tok, data["eval_docs"]))
    ev_small = list(eval_batches(tok, data["eval_docs"][::8]))

    model = M.Model(cfg, a.seed)
    init_copy = None
    if a.init:
        load_init(model, a.init)
        init_copy = copy_accuracy(model, tok, data["eval_docs"])
        print(f"--init {a.init}: held-out copy top-1 {init_copy:.3f}", flush=True)
    n_copy = round(a.batch * a.copy_frac)
    copy_rng = random.Random(a.seed + 1)
    params = model.parameters()
    if a.mtp_only:
        if not (a.init and model.n_mtp) or a.induction_rows or a.doc_rows or a.copy_frac:
            raise SystemExit("--mtp-only: needs --init and a model with an MTP module, and no copy/induction/doc rows")
        if not os.path.exists(os.path.join(a.init, "metrics.json")):
            raise SystemExit("--mtp-only: --init must be a WORK directory of an earlier stage")
        mtp_before = evaluate(model, ev_all)[2]
        mtp_prefix = f"model.layers.{model.L}."
        params = [v for k, v in model.P.items() if k.startswith(mtp_prefix) and isinstance(v, torch.nn.Parameter)]
        for v in model.parameters():  # the frozen ones (embedding, head, main layers) get no gradients
            v.requires_grad_(any(v is q for q in params))
    decay = [p for p in params if p.dim() == 2]
    nodecay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    warm = max(1, a.steps // 30)
    sched = lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / a.steps))))
    order = np.random.default_rng(a.seed).permutation(n_chunks)
    curve, acc, acc_n, ind_acc, att_acc = [], 0.0, 0, 0.0, [0.0, 0.0]
    head = lambda spec: tuple(int(v) for v in spec.split(":"))
    prev_heads = [head(x) for x in a.attend_prev.split(",")] if a.attend_prev else []
    copy_heads = [head(x) for x in a.attend_copy.split(",")] if a.attend_copy else []
    watch = {}
    for l, h in prev_heads + copy_heads:
        watch.setdefault(l, []).append(h)
    if len(set(prev_heads + copy_heads)) < len(prev_heads + copy_heads) or watch and not a.induction_rows:
        raise SystemExit("--attend-prev/--attend-copy: each head once, and --induction-rows > 0")
    seen_head = lambda l, h: model.seen[l][:, watch[l].index(h)]  # [B, T, T]
    biases = {k: v for k, v in model.P.items() if k.endswith("e_score_correction_bias")}
    t_train = time.time()
    for step in range(a.steps):
        idx = order[(np.arange(a.batch) + step * a.batch) % n_chunks]
        rows = [(stream[i * SEQ:i * SEQ + SEQ + 2], np.ones(SEQ + 2, dtype=np.int64)) for i in idx[:a.batch - n_copy]]
        rows += [tuple(np.array(v) for v in copy_row(tok, data["train_plain"], copy_rng, SEQ + 2,
                                                     min(500, SEQ // 2 - 4), a.copy_random)[:2])
                 for _ in range(n_copy)]
        chunk = torch.from_numpy(np.stack([r for r, _ in rows]))
        scored = torch.from_numpy(np.stack([t for _, t in rows])) != 0
        x, y, y2 = chunk[:, :SEQ], chunk[:, 1:SEQ + 1], chunk[:, 2:SEQ + 2]
        stats = []
        with torch.set_grad_enabled(not a.mtp_only):  # --mtp-only: the main model's routing stats are not kept
            logits, h = model.forward(x, [] if a.mtp_only else stats)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.masked_fill(~scored[:, 1:SEQ + 1], -100).reshape(-1),
                               ignore_index=-100)
        total = loss
        if model.n_mtp:
            ml = model.mtp_forward(h, y, stats)
            mtp_loss = F.cross_entropy(
                ml.reshape(-1, VOCAB), y2.masked_fill(~scored[:, 2:SEQ + 2], -100).reshape(-1), ignore_index=-100)
            total = mtp_loss if a.mtp_only else total + a.mtp_weight * mtp_loss
        if a.induction_rows:
            ix, iy, isrc = induction_rows(tok, copy_rng, a.induction_rows, a.induction_max, a.induction_pool,
                                          unigram, spans, a.induction_len, gap)
            model.watch = watch
            il = F.cross_entropy(model.forward(ix)[0].reshape(-1, VOCAB), iy.reshape(-1), ignore_index=-100)
            total = total + il
            ind_acc += il.item()
            for l, h in prev_heads:
                p_prev = torch.diagonal(seen_head(l, h), offset=-1, dim1=1, dim2=2)  # [B, T-1]
                total = total - a.attend_weight * torch.log(p_prev + 1e-6).mean()
                att_acc[0] += p_prev.mean().item() / len(prev_heads)
            has = isrc >= 0
            for l, h in copy_heads:
                p_copy = seen_head(l, h).gather(2, isrc.clamp(min=0)[..., None])[..., 0][has]
                total = total - a.attend_weight * torch.log(p_copy + 1e-6).mean()
                att_acc[1] += p_copy.mean().item() / len(copy_heads)
            model.watch, model.seen = {}, {}
        if a.doc_rows:
            dx, dy = doc_rows(docs, copy_rng, a.doc_rows, tok.eos)
            total = total + F.cross_entropy(model.forward(dx)[0].reshape(-1, VOCAB), dy.reshape(-1), ignore_index=-100)
        if stats:
            total = total + 1e-4 * sum(s[2] for s in stats)
        for g in opt.param_groups:
            g["lr"] = a.lr * sched(step)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3): bias += g * sign(mean - load)
            for l, load, _ in stats:
                key = next((k for k in biases if k.startswith(f"model.layers.{l}.")), None)
                if key is not None:
                    biases[key] += 1e-3 * torch.sign(load.mean() - load)
        acc += (mtp_loss if a.mtp_only else loss).item()
        acc_n += 1
        if a.bench and step == 9:
            dt = (time.time() - t_train) / 10
            print(f"{dt:.3f} s/step, {a.batch * SEQ / dt:.0f} tokens/s")
            return
        last = step + 1 in (a.steps, a.stop_at)
        if (step + 1) % 50 == 0 or last:
            point = {"step": step + 1, "train_loss": acc / acc_n, "seconds": round(time.time() - t_train, 1)}
            if a.induction_rows:
                point["induction_loss"] = ind_acc / acc_n
            for i, (k, on) in enumerate((("prev", prev_heads), ("copy", copy_heads))):
                if on:
                    point[f"attend_{k}"] = att_acc[i] / acc_n
            acc, acc_n, ind_acc, att_acc = 0.0, 0, 0.0, [0.0, 0.0]
            if (step + 1) % a.eval_every == 0 or last:
                e = evaluate(model, ev_small)
                point.update(eval_ppl=math.exp(e[0]), eval_top1=e[1], eval_mtp_top1=e[2])
                if a.copy_frac > 0 or a.induction_rows:
                    point.update(eval_copy_top1=copy_accuracy(model, tok, data["eval_docs"], n=8),
                                 random_copy_top1=random_copy_accuracy(model, tok),
                                 pooled_copy_top1=random_copy_accuracy(model, tok, pool=16),
                                 unigram_copy_top1=random_copy_accuracy(model, tok, unigram=text_unigram),
                                 word_copy_top1=word_copy(), gapped_copy_top1=gapped_copy())
            curve.append(point)
            print(json.dumps(point), flush=True)
            if "eval_ppl" in point and a.stop_file and os.path.exists(a.stop_file):
                break
        if last:
            break
    steps_done = curve[-1]["step"] if curve else a.steps
    final = evaluate(model, ev_all)
    uni = unigram_nll(docs, ev_all, VOCAB)
    metrics = {"arch": a.arch, "steps": steps_done, "batch_tokens": a.batch * SEQ, "seed": a.seed,
               "threads": a.threads, "train_seconds": round(time.time() - t_train),
               "training_tokens_seen": steps_done * a.batch * SEQ, "training_tokens_total": int(len(stream)),
               "eval_tokens": final[3], "eval_ppl": math.exp(final[0]), "eval_top1": final[1],
               "eval_mtp_top1": final[2], "unigram_ppl": math.exp(uni),
               "ppl_over_unigram": math.exp(final[0]) / math.exp(uni),
               "params": sum(p.numel() for p in model.state().values()),
               "seq": SEQ, "copy_frac": a.copy_frac, "copy_random": a.copy_random,
               "init": os.path.basename(os.path.normpath(a.init)) if a.init else None, "lr": a.lr,
               "mtp_weight": a.mtp_weight,
               "induction_rows": a.induction_rows, "induction_max": a.induction_max,
               "induction_pool": a.induction_pool, "induction_unigram": a.induction_unigram,
               "induction_words": a.induction_words, "induction_len": a.induction_len,
               "induction_gap": a.induction_gap,
               "doc_rows": a.doc_rows, "attend_prev": a.attend_prev, "attend_copy": a.attend_copy,
               "attend_weight": a.attend_weight,
               "word_copy_top1": word_copy(), "gapped_copy_top1": gapped_copy(),
               "random_copy_top1": random_copy_accuracy(model, tok),
               "pooled_copy_top1": random_copy_accuracy(model, tok, pool=16),
               "unigram_copy_top1": random_copy_accuracy(model, tok, unigram=text_unigram),
               "eval_copy_top1": copy_accuracy(model, tok, data["eval_docs"]), "init_copy_top1": init_copy,
               "shuffled_copy_top1": copy_accuracy(model, tok, data["eval_docs"], n=16, max_tokens=100, shuffle=True)}
    if a.init and os.path.exists(os.path.join(a.init, "training.json")):  # a packaged first phase
        metrics["first_phase"] = {k: v for k, v in load_json(os.path.join(a.init, "training.json")).items()
                                  if k != "first_phase"}
        metrics["copy_top1_before"] = init_copy
    elif a.init and os.path.exists(os.path.join(a.init, "metrics.json")):  # a later stage of the second phase
        prev = load_json(os.path.join(a.init, "metrics.json"))
        if a.mtp_only:  # the main model is --init's: its stage's record, this stage's evaluations
            stage = {"steps": steps_done, "batch_tokens": a.batch * SEQ, "lr": a.lr, "threads": a.threads,
                     "train_seconds": metrics["train_seconds"], "eval_mtp_top1_before": mtp_before,
                     "eval_mtp_top1": metrics["eval_mtp_top1"], "curve": curve}
            evaluated = ("eval_tokens", "eval_ppl", "eval_top1", "eval_mtp_top1", "unigram_ppl", "ppl_over_unigram",
                         "word_copy_top1", "gapped_copy_top1", "random_copy_top1", "pooled_copy_top1",
                         "unigram_copy_top1", "eval_copy_top1", "shuffled_copy_top1")
            metrics = {**prev, **{k: metrics[k] for k in evaluated}, "mtp_stage": stage}
            curve = load_json(os.path.join(a.init, "curve.json"))
        else:
            metrics.update({k: prev[k] for k in ("first_phase", "copy_top1_before") if k in prev})
    print(json.dumps(metrics), flush=True)
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    with open(os.path.join(a.out, "curve.json"), "w") as f:
        json.dump(curve, f)
    svg_curve(curve, os.path.join(a.out, "curve.svg"), f"afd WordNet {a.arch}: training curve",
              metrics["batch_tokens"] // metrics["seq"], metrics["seq"])
    st.write_file(os.path.join(a.out, "trained.safetensors"),
                  {k: st.Tensor("F32", v.numpy()) for k, v in model.state().items()})


if __name__ == "__main__":
    main()
