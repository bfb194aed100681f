#!/usr/bin/python3
"""Golden recursive MTP drafts (mtp_draft_ref.py) for two tiny DeepSeek-V3 checkpoints with an
MTP module (MODELS.md B7), written to tests/reference/mtp/<case>/:

    /usr/bin/python3 tests/reference/make_golden_mtp.py [--only CASE]

Each case directory holds config.json, generation_config.json, model.safetensors and
mtp_drafts.json:
  sequences: the true token sequences (a random prompt, then the main model's greedy
    continuation), k: drafts per position (3);
  positions: one row per drafting position, [sequence index, position i, d1, ..., dk], for every
    i with a known t[i+1] (i = 0 .. len - 2), sequences in order;
  margins: the same rows' top-1 minus top-2 logit of each draft (a C++ test skips a near tie
    and the drafts after it);
  min_margin, min_router_select_gap, min_router_group_gap (over the main model's runs and every
    MTP step), f32_reference_drafts_match (this reference in float32 drafts the same ids),
    d1_equals_true_next (positions where d1 = t[i+2], for scale), positions_changed_if_normed_fed
    (positions whose drafts change when step j > 1 is fed rmsnorm(b, shared_head.norm) instead of
    the block output b: the golden tells the two rules apart).

Cases (the layout and draws of make_golden_mla_mfa.py, smaller):
  dsv3_mtp_own_head: bf16; the MTP layer has its own embed_tokens and shared_head.head, drawn
    independently of the main model's (so a loader that takes the main ones fails);
  dsv3_mtp_shared_head: FP8; the MTP layer has neither, so the main model's embedding and LM head
    are used (as DeepSeek documents them shared).

Seed rule: seeds base, base+1, ... until the seed meets make_golden_mla_mfa's rule over the main
model's greedy run, the teacher-forced runs and every MTP step (top-2 gaps of the greedy
decisions > 1e-3, routing gaps > 1e-4, >= 3 distinct generated ids, the correction bias and the
group mask change selections), every draft margin is > 1e-3, the float32 run drafts the same
ids, and feeding the normed state changes some draft.
"""

import argparse
import os
import sys

import numpy as np

import hf_moe_ref
import make_golden as mg
import make_golden_mla_mfa as mm
import mla_mfa_ref as ref
import mtp_draft_ref
import safetensors_io as st
from ref_common import rms_norm

HERE = os.path.dirname(os.path.abspath(__file__))
K = 3
NEW_TOKENS = 12
MIN_GAP = 1e-3
MAX_ATTEMPTS = 100

SMALL = dict(hidden=64, vocab=128, heads=2, q_lora=48, kv_lora=32, nope=16, rope=16, v_dim=16, inter=64,
             moe_inter=16, experts=8, n_shared=1, top_k=2, n_group=4, topk_group=2, layers=1, first_k_dense=0,
             mtp=1, max_pos=4096, prompt_lens=(4, 19))

CASES = [
    mm.ds(**SMALL, name="dsv3_mtp_own_head", arch="deepseek_v3", seed=21000, fp8=False, own_head=True,
          covers="deepseek_v3 bf16, one MoE layer + MTP layer 1 (MoE, 8 experts in 4 groups keep 2, top-2, 1 "
                 "shared, sigmoid + bias); the MTP layer's own embed_tokens and shared_head.head, drawn apart "
                 "from the main model's"),
    mm.ds(**SMALL, name="dsv3_mtp_shared_head", arch="deepseek_v3", seed=22000, fp8=True, own_head=False,
          covers="deepseek_v3 FP8 (e4m3 128x128 partial blocks), as dsv3_mtp_own_head; the MTP layer has no "
                 "embed_tokens and no shared_head.head: the main model's embedding and LM head are used"),
]


def make_tensors(c, seed):
    """{name: st.Tensor}: the main model as make_golden_mla_mfa draws it, then the MTP module at
    layer id c["layers"] (a MoE decoder layer, enorm, hnorm, a bf16 eh_proj, shared_head.norm,
    and with own_head its own embedding and head)."""
    cfg = ref.Config(mm.hf_config(c))
    w = mm._Writer(seed, c["fp8"])
    H, V = c["hidden"], c["vocab"]
    w.plain("model.embed_tokens.weight", (V, H), mm.STD_EMBED)
    for l in range(c["layers"]):
        mm._ds_layer(w, c, cfg, l)
    w.norm("model.norm.weight", H)
    w.plain("lm_head.weight", (V, H), mm.GAIN_LM_HEAD / np.sqrt(H))
    l = c["layers"]
    p = f"model.layers.{l}."
    mm._ds_layer(w, c, cfg, l, moe=True)
    w.norm(p + "enorm.weight", H)
    w.norm(p + "hnorm.weight", H)
    w.plain(p + "eh_proj.weight", (H, 2 * H), mm.GAIN_MAT / np.sqrt(2 * H))
    w.norm(p + "shared_head.norm.weight", H)
    if c["own_head"]:
        w.plain(p + "embed_tokens.weight", (V, H), mm.STD_EMBED)
        w.plain(p + "shared_head.head.weight", (V, H), mm.GAIN_LM_HEAD / np.sqrt(H))
    return w.out


def draft_all(model, seqs):
    """-> (rows [[s, i, d1..dk]], margins [[m1..mk]]) over every sequence, teacher-forced."""
    rows, margins = [], []
    for s, toks in enumerate(seqs):
        _, hid = model.forward([(model.new_sequence(), toks)], return_hidden=True)
        d, m = mtp_draft_ref.recursive_drafts(model, toks, hid[0], K)
        rows += [[s, i] + di for i, di in enumerate(d)]
        margins += m
    return rows, margins


def evaluate(c, seed):
    tensors = make_tensors(c, seed)
    cfg = ref.Config(mm.hf_config(c))
    model = ref.Model(cfg, tensors, np.float64, mla_form="both", load_mtp=True)
    prompts = mg.make_prompts(c, seed)
    grows, toks = hf_moe_ref.greedy(model, prompts, NEW_TOKENS)
    token_gap = min(hf_moe_ref.top2_gap(r[j]) for r, p in zip(grows, prompts) for j in range(len(p) - 1, len(r)))
    seqs = [p + t for p, t in zip(prompts, toks)]
    rows, margins = draft_all(model, seqs)
    return dict(tensors=tensors, cfg=cfg, model=model, prompts=prompts, tokens=toks, seqs=seqs, rows=rows,
                margins=margins, token_gap=token_gap, min_margin=min(min(m) for m in margins), stats=model.stats)


def accept(c, r):
    """-> None if the seed meets make_golden_mla_mfa's rule and every draft margin is > MIN_GAP,
    else why not."""
    if r["min_margin"] <= MIN_GAP:
        return f"draft margin {r['min_margin']:.2e}"
    return mm.accept(c, r)


def normed_fed_changes(r):
    """Positions whose drafts change when step j > 1 is fed the normed state instead of b."""
    m, eps = r["model"], r["cfg"].rms_norm_eps
    changed = 0
    for s, toks in enumerate(r["seqs"]):
        _, hid = m.forward([(m.new_sequence(), toks)], return_hidden=True)
        d, _ = mtp_draft_ref.recursive_drafts(m, toks, hid[0], K,
                                              feed=lambda z, _l: rms_norm(z, m.mtp["head_norm"], eps))
        want = [row[2:] for row in r["rows"] if row[0] == s]
        changed += sum(a != b for a, b in zip(d, want))
    return changed


def write_case(c, out_root):
    def run(seed):
        r = evaluate(c, seed)
        reason = accept(c, r)
        if reason is None:
            m32 = ref.Model(r["cfg"], r["tensors"], np.float32, mla_form="both", load_mtp=True)
            r["changed"] = normed_fed_changes(r)
            if draft_all(m32, r["seqs"])[0] != r["rows"]:
                reason = "the float32 run drafts other ids"
            elif r["changed"] == 0:
                reason = "feeding the normed state changes no draft"
        return r, reason

    seed, attempt, r = mm.search_seed(c, run, MAX_ATTEMPTS)
    changed = r["changed"]
    d = mg.fresh_case_dir(out_root, c["name"])
    bos, eos = mg.pick_special(r["prompts"], r["tokens"], c["vocab"])
    mg.write_json(os.path.join(d, "config.json"), mm.hf_config(c, bos, eos))
    mg.write_json(os.path.join(d, "generation_config.json"),
                  {"bos_token_id": bos, "do_sample": False, "eos_token_id": eos, "transformers_version": "4.46.3"})
    st.write_file(os.path.join(d, st.SINGLE_NAME), r["tensors"])
    s = r["stats"]
    true_next = sum(1 for row in r["rows"] if row[1] + 2 < len(r["seqs"][row[0]])
                    and row[2] == r["seqs"][row[0]][row[1] + 2])
    golden = {
        "case": c["name"],
        "covers": c["covers"],
        "seed": seed,
        "mtp_own_embed_and_head": c["own_head"],
        "k": K,
        "prompt_lengths": [len(p) for p in r["prompts"]],
        "sequences": r["seqs"],
        "positions": r["rows"],
        "margins": [[round(x, 6) for x in m] for m in r["margins"]],
        "min_margin": round(r["min_margin"], 6),
        "min_router_select_gap": round(s.min_select_gap, 6),
        "min_router_group_gap": round(s.min_group_gap, 6),
        "min_main_top2_logit_gap": round(r["token_gap"], 6),
        "f32_reference_drafts_match": True,
        "d1_equals_true_next": true_next,
        "positions_changed_if_normed_fed": changed,
        "note": ("drafts of mtp_draft_ref.recursive_drafts in float64: at position i the module runs at i on "
                 "(h[i], t[i+1]), then at i+1 on (b1, d1), at i+2 on (b2, d2), b the decoder layer's output "
                 "before shared_head.norm; the speculative positions are dropped before position i+1. h is "
                 "the main model's final-normed state, teacher-forced over the whole sequence."),
    }
    with open(os.path.join(d, "mtp_drafts.json"), "w") as f:
        f.write(mg.compact_json(golden))
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{c['name']:24s} seed {seed} (attempt {attempt}) positions {len(r['rows'])} min margin "
          f"{r['min_margin']:.4f} select gap {s.min_select_gap:.2e} group gap {s.min_group_gap:.2e} "
          f"d1 = true {true_next} normed-fed changes {changed} size {size} B")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "mtp"))
    ap.add_argument("--only", help="comma-separated case names")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    names = {c["name"] for c in CASES}
    if only and only - names:
        ap.error(f"no case named {sorted(only - names)}")
    os.makedirs(args.out, exist_ok=True)
    for c in CASES:
        if not only or c["name"] in only:
            write_case(c, args.out)


if __name__ == "__main__":
    sys.exit(main())
