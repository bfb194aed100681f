#!/usr/bin/python3
"""Writes afd's golden reference data: small random-weight checkpoints in the exact Hugging
Face layout plus the f64 reference's logits and greedy continuations.

    /usr/bin/python3 tests/reference/make_golden.py [--out tests/reference/data] [--only CASE]

The DeepSeek-V2/V3/Kimi-K2 and Step-3 cases are defined and written by make_golden_mla_mfa.py;
this script runs both and writes the one manifest.

Deterministic: every case has a fixed base seed; the generator tries base, base+1, ...
and keeps the first seed whose greedy decisions (top-2 logit gap) and routing decisions
(gap between the k-th and (k+1)-th router logit) all clear MIN_GAP, so float32 versus
float64 rounding cannot flip a token or an expert choice.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402
import safetensors_io as st  # noqa: E402

MIN_GAP = 1e-3
MIN_DISTINCT = 4  # distinct ids in each greedy continuation (random models like to repeat)
MAX_NEW_TOKENS = 32
MAX_ATTEMPTS = 200

# Each case: the architecture and sizes, what it covers, and its base seed.
CASES = [
    dict(name="qwen3_gqa1_top1_tied", arch="qwen3_moe", seed=1000, layers=2, heads=4, kv_heads=4, head_dim=16,
         vocab=256, experts=8, top_k=1, moe_inter=32, norm_topk=False, tied=True, rope_theta=1e6, eps=1e-6,
         prompt_lens=(1, 6, 13),
         covers="GQA ratio 1; top-1 without renormalisation (weight = softmax prob < 1); tied embeddings; "
                "head_dim = hidden/heads"),
    dict(name="qwen3_gqa2_top2_untied", arch="qwen3_moe", seed=2000, layers=3, heads=4, kv_heads=2, head_dim=32,
         vocab=384, experts=8, top_k=2, moe_inter=32, norm_topk=True, tied=False, rope_theta=10000.0, eps=1e-6,
         prompt_lens=(6, 1, 13),
         covers="GQA ratio 2; top-2 with norm_topk_prob; untied lm_head; head_dim 32 != hidden/heads 16 "
                "(q_dim 128 > hidden 64); rope_theta 1e4"),
    dict(name="qwen3_gqa4_top8_fused", arch="qwen3_moe", seed=3000, layers=2, heads=8, kv_heads=2, head_dim=16,
         vocab=512, experts=16, top_k=8, moe_inter=48, norm_topk=False, tied=False, rope_theta=1e6, eps=1e-6,
         layout="fused", prompt_lens=(13, 6, 1),
         covers="GQA ratio 4; top-8 of 16 experts without renormalisation; fused expert layout "
                "(mlp.experts.gate_up_proj [16,96,64], mlp.experts.down_proj [16,64,48]; moe_intermediate "
                "48 so that 2I != hidden and a transposed read cannot pass the shape check)"),
    dict(name="qwen3_dense_sharded", arch="qwen3_moe", seed=4000, layers=4, heads=4, kv_heads=1, head_dim=24,
         vocab=320, experts=8, top_k=2, moe_inter=32, norm_topk=True, tied=True, rope_theta=1e6, eps=1e-6,
         mlp_only_layers=[0, 2], inter=96, shards=2, prompt_lens=(1, 6, 13),
         covers="GQA ratio 4 with a single kv head; dense MLP layers 0 and 2 via mlp_only_layers "
                "(intermediate_size 96); head_dim 24 (q_dim 96); sharded checkpoint (2 files + index); tied"),
    dict(name="qwen2moe_shared", arch="qwen2_moe", seed=5000, layers=3, heads=4, kv_heads=2, head_dim=16,
         vocab=384, experts=8, top_k=4, moe_inter=32, norm_topk=False, tied=False, rope_theta=1e6, eps=1e-6,
         shared_inter=64, inter=96, prompt_lens=(6, 13, 1),
         covers="qwen2_moe: q/k/v bias, no q/k norm; shared expert (intermediate 64) with sigmoid "
                "shared_expert_gate; top-4 without renormalisation; GQA ratio 2; untied"),
    dict(name="qwen2moe_sparse_step", arch="qwen2_moe", seed=6000, layers=4, heads=4, kv_heads=4, head_dim=16,
         vocab=256, experts=12, top_k=2, moe_inter=32, norm_topk=True, tied=True, rope_theta=10000.0, eps=1e-6,
         shared_inter=48, inter=80, decoder_sparse_step=2, prompt_lens=(13, 1, 6),
         covers="qwen2_moe with decoder_sparse_step 2 (layers 1,3 MoE; 0,2 dense, intermediate_size 80); "
                "12 experts top-2 with norm_topk_prob; shared expert; tied embeddings; GQA ratio 1"),
    dict(name="mixtral_top2", arch="mixtral", seed=7000, layers=2, heads=4, kv_heads=1, head_dim=16,
         vocab=320, experts=8, top_k=2, moe_inter=32, tied=False, rope_theta=1e6, eps=1e-5,
         prompt_lens=(1, 13, 6),
         covers="mixtral: block_sparse_moe.{gate, experts.e.w1/w2/w3} names, top-2 always renormalised, "
                "no q/k norm, no bias; GQA ratio 4; rms_norm_eps 1e-5"),
]

HIDDEN = 64
MAX_POS = 128

ARCH_NAMES = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
              "mixtral": "MixtralForCausalLM"}


def hf_config(c, bos=0, eos=1):
    a = c["arch"]
    d = {
        "architectures": [ARCH_NAMES[a]],
        "model_type": a,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "max_position_embeddings": MAX_POS,
        "num_attention_heads": c["heads"],
        "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["kv_heads"],
        "head_dim": c["head_dim"],
        "rms_norm_eps": c["eps"],
        "rope_scaling": None,
        "rope_theta": c["rope_theta"],
        "tie_word_embeddings": c["tied"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": c["vocab"],
        "num_experts_per_tok": c["top_k"],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }
    if a == "mixtral":
        d.update({"num_local_experts": c["experts"], "intermediate_size": c["moe_inter"],
                  "sliding_window": None, "router_jitter_noise": 0.0})
    else:
        d.update({
            "num_experts": c["experts"],
            "moe_intermediate_size": c["moe_inter"],
            "intermediate_size": c.get("inter", 4 * HIDDEN),
            "norm_topk_prob": c["norm_topk"],
            "decoder_sparse_step": c.get("decoder_sparse_step", 1),
            "mlp_only_layers": c.get("mlp_only_layers", []),
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": c["layers"],
        })
        if a == "qwen2_moe":
            d["shared_expert_intermediate_size"] = c["shared_inter"]
        else:
            d["attention_bias"] = False
    return dict(sorted(d.items()))


# Init scales: large enough that logits and router logits are well separated (std ~1-2),
# small enough that float32 rounding stays far below the 1e-4 logits tolerance.
STD_EMBED = 0.3
STD_MAT = 0.15
STD_ROUTER = 0.3
STD_LM_HEAD = 0.25
STD_BIAS = 0.1
STD_NORM = 0.1  # norm weights ~ 1 + N(0, 0.1)


def make_tensors(c, seed):
    """{name: st.Tensor (BF16)} in the HF layout of case c."""
    rng = np.random.default_rng(seed)
    out = {}

    def mat(name, shape, std=STD_MAT):
        out[name] = st.Tensor.from_float(rng.normal(0.0, std, size=shape), "BF16")

    def norm(name, n):
        out[name] = st.Tensor.from_float(1.0 + rng.normal(0.0, STD_NORM, size=(n,)), "BF16")

    cfg = ref.Config(hf_config(c))
    H, hd, E, I = HIDDEN, c["head_dim"], c["experts"], c["moe_inter"]
    mat("model.embed_tokens.weight", (c["vocab"], H), STD_EMBED)
    for l in range(c["layers"]):
        p = f"model.layers.{l}."
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        a = p + "self_attn."
        mat(a + "q_proj.weight", (c["heads"] * hd, H))
        mat(a + "k_proj.weight", (c["kv_heads"] * hd, H))
        mat(a + "v_proj.weight", (c["kv_heads"] * hd, H))
        mat(a + "o_proj.weight", (H, c["heads"] * hd))
        if cfg.qkv_bias:
            mat(a + "q_proj.bias", (c["heads"] * hd,), STD_BIAS)
            mat(a + "k_proj.bias", (c["kv_heads"] * hd,), STD_BIAS)
            mat(a + "v_proj.bias", (c["kv_heads"] * hd,), STD_BIAS)
        if cfg.qk_norm:
            norm(a + "q_norm.weight", hd)
            norm(a + "k_norm.weight", hd)
        if cfg.is_moe_layer(l):
            if c["arch"] == "mixtral":
                m = p + "block_sparse_moe."
                mat(m + "gate.weight", (E, H), STD_ROUTER)
                for e in range(E):
                    mat(m + f"experts.{e}.w1.weight", (I, H))
                    mat(m + f"experts.{e}.w2.weight", (H, I))
                    mat(m + f"experts.{e}.w3.weight", (I, H))
            else:
                m = p + "mlp."
                mat(m + "gate.weight", (E, H), STD_ROUTER)
                for e in range(E):
                    mat(m + f"experts.{e}.gate_proj.weight", (I, H))
                    mat(m + f"experts.{e}.up_proj.weight", (I, H))
                    mat(m + f"experts.{e}.down_proj.weight", (H, I))
                if cfg.shared_expert_intermediate_size:
                    S = cfg.shared_expert_intermediate_size
                    mat(m + "shared_expert.gate_proj.weight", (S, H))
                    mat(m + "shared_expert.up_proj.weight", (S, H))
                    mat(m + "shared_expert.down_proj.weight", (H, S))
                    mat(m + "shared_expert_gate.weight", (1, H), STD_ROUTER)
        else:
            m = p + "mlp."
            mat(m + "gate_proj.weight", (cfg.intermediate_size, H))
            mat(m + "up_proj.weight", (cfg.intermediate_size, H))
            mat(m + "down_proj.weight", (H, cfg.intermediate_size))
    norm("model.norm.weight", H)
    if not c["tied"]:
        mat("lm_head.weight", (c["vocab"], H), STD_LM_HEAD)
    if c.get("layout") == "fused":
        out = fuse_experts(out, cfg)
    return out


def fuse_experts(tensors, cfg):
    """Per-expert -> fused layout (definition): gate_up_proj[e] = concat(gate_e, up_e) along
    rows -> [E, 2I, H]; down_proj[e] = down_e -> [E, H, I]. Raw BF16 bits are moved as is."""
    out = dict(tensors)
    for l in range(cfg.n_layers):
        m = f"model.layers.{l}.mlp."
        if m + "experts.0.gate_proj.weight" not in out:
            continue
        gu, dn = [], []
        for e in range(cfg.n_experts):
            g = out.pop(m + f"experts.{e}.gate_proj.weight")
            u = out.pop(m + f"experts.{e}.up_proj.weight")
            d = out.pop(m + f"experts.{e}.down_proj.weight")
            gu.append(np.concatenate([g.raw, u.raw], axis=0))
            dn.append(d.raw)
        out[m + "experts.gate_up_proj"] = st.Tensor("BF16", np.stack(gu))
        out[m + "experts.down_proj"] = st.Tensor("BF16", np.stack(dn))
    return out


def make_prompts(c, seed):
    rng = np.random.default_rng(seed + 7_000_000)
    return [[int(x) for x in rng.integers(0, c["vocab"], size=n)] for n in c["prompt_lens"]]


def evaluate(c, seed):
    """Runs the f64 reference for one seed. -> dict with tensors, prompts, rows, tokens, gaps."""
    tensors = make_tensors(c, seed)
    cfg = ref.Config(hf_config(c))
    model = ref.Model(cfg, tensors, np.float64)
    prompts = make_prompts(c, seed)
    rows, toks = ref.greedy(model, prompts, MAX_NEW_TOKENS)
    # rows that choose a token: the last prompt row and every gen row
    token_gap = min(ref.top2_gap(r[j]) for r, p in zip(rows, prompts) for j in range(len(p) - 1, len(r)))
    return dict(tensors=tensors, cfg=cfg, prompts=prompts, rows=rows, tokens=toks,
                token_gap=token_gap, router_gap=model.stats.min_gap, decisions=model.stats.decisions)


def compact_json(obj):
    """A top-level object with one key per line and each inner list of a list on one line."""
    items = []
    for k, v in obj.items():
        if isinstance(v, list) and v and isinstance(v[0], list):
            inner = ",\n".join("  " + json.dumps(x, separators=(", ", ": ")) for x in v)
            items.append(f" {json.dumps(k)}: [\n{inner}\n ]")
        else:
            items.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(items) + "\n}\n"


def pick_special(prompts, tokens, vocab):
    """(bos, eos): the two largest ids that occur in no prompt and no continuation."""
    used = {t for seq in prompts + tokens for t in seq}
    free = [t for t in range(vocab - 1, -1, -1) if t not in used]
    if len(free) < 2:
        raise RuntimeError("no unused token ids for bos/eos")
    return free[1], free[0]


def fresh_case_dir(out_root, name):
    """out_root/name, created empty (an existing one is removed first)."""
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    return d


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def f32_run_and_logits(m32_forced, m32_free, r, max_new_tokens, d):
    """The same reference in float32: teacher-forced on the f64 tokens (an estimate of the
    deviation an engine computing in f32 shows) and free-running (its own greedy tokens).
    Writes the f64 logits to d/logits.f32. -> (f64 logits [rows, vocab], max |f64 - f32|, f32 tokens)"""
    rows32, _ = ref.greedy(m32_forced, r["prompts"], max_new_tokens, forced=r["tokens"])
    _, toks32 = ref.greedy(m32_free, r["prompts"], max_new_tokens)
    all64 = np.concatenate([np.asarray(x) for x in r["rows"]])
    all32 = np.concatenate([np.asarray(x, dtype=np.float64) for x in rows32])
    dev32 = float(np.max(np.abs(all64 - all32)))
    all64.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    return all64, dev32, toks32


def golden_run_fields(c, seed, r, all64, max_new_tokens):
    """The golden.json fields every family has, from "seed" to "min_top2_logit_gap", in file order."""
    return {
        "seed": seed,
        "prompts": r["prompts"],
        "max_new_tokens": max_new_tokens,
        "greedy_tokens": r["tokens"],
        "logits_file": "logits.f32",
        "vocab_size": c["vocab"],
        "n_rows": int(all64.shape[0]),
        "rows": [list(x) for x in ref.row_table(r["prompts"], max_new_tokens)],
        "min_top2_logit_gap": r["token_gap"],
    }


def golden_f32_fields(all64, dev32, toks32, r):
    """The golden.json fields on the logits' range and the f32 run (f32_run_and_logits), in file order."""
    return {
        "max_abs_logit": float(np.max(np.abs(all64))),
        "f32_reference_max_abs_dev": dev32,
        "f32_reference_tokens_match": toks32 == r["tokens"],
    }


def write_golden(d, golden):
    """Writes d/golden.json. -> the case directory's size in bytes."""
    assert golden["n_rows"] == len(golden["rows"])
    with open(os.path.join(d, "golden.json"), "w") as f:
        f.write(compact_json(golden))
    return sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))


def write_case(c, out_root):
    for attempt in range(MAX_ATTEMPTS):
        seed = c["seed"] + attempt
        r = evaluate(c, seed)
        if (r["token_gap"] > MIN_GAP and r["router_gap"] > MIN_GAP
                and min(len(set(t)) for t in r["tokens"]) >= MIN_DISTINCT):
            break
    else:
        raise RuntimeError(f"{c['name']}: no seed in {MAX_ATTEMPTS} attempts clears the gap {MIN_GAP}")
    d = fresh_case_dir(out_root, c["name"])
    bos, eos = pick_special(r["prompts"], r["tokens"], c["vocab"])
    write_json(os.path.join(d, "config.json"), hf_config(c, bos, eos))
    # Qwen3 checkpoints list two eos ids in generation_config.json (<|im_end|>, <|endoftext|>)
    gen_eos = [eos, bos] if c["arch"] == "qwen3_moe" else eos
    write_json(os.path.join(d, "generation_config.json"),
               {"bos_token_id": bos, "do_sample": False, "eos_token_id": gen_eos, "transformers_version": "4.51.0"})
    tensors = r["tensors"]
    if c.get("shards", 1) > 1:
        names = sorted(tensors)
        # split at a layer boundary: layers [0, n/2) (+ embeddings) in file 1, the rest in file 2
        half = c["layers"] // 2
        first = [n for n in names if n.startswith("model.embed_tokens") or
                 (n.startswith("model.layers.") and int(n.split(".")[2]) < half)]
        second = [n for n in names if n not in first]
        st.write_sharded(d, tensors, [first, second])
    else:
        st.write_file(os.path.join(d, st.SINGLE_NAME), tensors)

    # float32 run of the same reference, teacher-forced on the f64 tokens: an estimate of
    # the deviation an engine computing in f32 shows (and its own greedy tokens).
    all64, dev32, toks32 = f32_run_and_logits(ref.Model(r["cfg"], tensors, np.float32),
                                              ref.Model(r["cfg"], tensors, np.float32), r, MAX_NEW_TOKENS, d)
    golden = {
        "case": c["name"],
        "model_type": c["arch"],
        **golden_run_fields(c, seed, r, all64, MAX_NEW_TOKENS),
        "min_router_topk_gap": r["router_gap"] if r["router_gap"] != float("inf") else None,
        **golden_f32_fields(all64, dev32, toks32, r),
        "tolerance_note": ("logits computed in float64 from the BF16 weights, stored as float32; an engine "
                           "in reference mode (float32 activations) must match every row to 1e-4 absolute and "
                           "produce identical greedy_tokens. bos/eos ids occur in no prompt and no "
                           "continuation, so stopping at eos cannot shorten a run; no bos is prepended."),
    }
    size = write_golden(d, golden)
    print(f"{c['name']:28s} seed {seed} (attempt {attempt}) rows {golden['n_rows']} "
          f"min token gap {r['token_gap']:.4f} min router gap {r['router_gap']:.4f} "
          f"|logit|max {golden['max_abs_logit']:.2f} f32 dev {dev32:.2e} "
          f"f32 tokens {'same' if golden['f32_reference_tokens_match'] else 'DIFFER'} size {size} B")
    return {"name": c["name"], "model_type": c["arch"], "covers": c["covers"], "seed": seed,
            "layers": c["layers"], "hidden_size": HIDDEN, "heads": c["heads"], "kv_heads": c["kv_heads"],
            "gqa_ratio": c["heads"] // c["kv_heads"], "head_dim": c["head_dim"], "vocab_size": c["vocab"],
            "experts": c["experts"], "top_k": c["top_k"],
            "norm_topk_prob": True if c["arch"] == "mixtral" else c["norm_topk"],
            "shared_expert": c["arch"] == "qwen2_moe", "tied_embeddings": c["tied"],
            "expert_layout": c.get("layout", "per_expert"), "sharded": c.get("shards", 1) > 1,
            "dense_layers": [l for l in range(c["layers"]) if not r["cfg"].is_moe_layer(l)],
            "prompt_lengths": list(c["prompt_lens"]), "bytes": size,
            "f32_reference_max_abs_dev": dev32}


def mm_max_new_tokens():
    import make_golden_mla_mfa as mm
    return mm.MAX_NEW_TOKENS


def all_cases():
    """[(case spec, writer module)] for every golden case: this file's Qwen/Mixtral cases and
    make_golden_mla_mfa's DeepSeek / Step-3 cases."""
    import make_golden_mla_mfa as mm  # imports this module; imported here to avoid a cycle
    return [(c, sys.modules[__name__]) for c in CASES] + [(c, mm) for c in mm.CASES]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    ap.add_argument("--only", help="regenerate only these cases (comma-separated names); the manifest keeps "
                                   "the other cases' entries and is rewritten")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cases = all_cases()
    only = set(args.only.split(",")) if args.only else None
    if only and only - {c["name"] for c, _ in cases}:
        ap.error(f"no case named {sorted(only - {c['name'] for c, _ in cases})}")
    old = {}
    if only:
        with open(os.path.join(args.out, "manifest.json")) as f:
            old = {e["name"]: e for e in json.load(f)["cases"]}
    entries = []
    for c, writer in cases:
        if only and c["name"] not in only:
            if c["name"] not in old:
                ap.error(f"case {c['name']} is in no manifest yet: generate it too")
            entries.append(old[c["name"]])
            continue
        entries.append(writer.write_case(c, args.out))
    manifest = {
        "generator": "tests/reference/make_golden.py (Qwen3-MoE, Qwen2-MoE, Mixtral) and "
                     "tests/reference/make_golden_mla_mfa.py (DeepSeek-V2/V3/Kimi-K2, Step-3)",
        "reference": "tests/reference/hf_moe_ref.py and tests/reference/mla_mfa_ref.py (float64)",
        "max_new_tokens": {"hf_moe_ref": MAX_NEW_TOKENS, "mla_mfa_ref": mm_max_new_tokens()},
        "min_gap": MIN_GAP,
        "logits_tolerance_abs": 1e-4,
        "cases": entries,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
