#!/usr/bin/python3
"""Convert an afd qwen3_moe or DeepSeek-V3-layout checkpoint (HF safetensors + tokenizer.json)
to one GGUF file.

For side-by-side runs against llama.cpp on the same weights (bench/vs_llama_cpp.py). Uses
llama.cpp's gguf-py package (numpy only) from a llama.cpp source tree given by --llama-cpp
or $LLAMA_CPP; llama.cpp itself is never part of this repository.

  /usr/bin/python3 bench/gguf_convert.py --model models/tiny --out /tmp/tiny.gguf \
      --llama-cpp /work/llama.cpp [--outtype bf16|q8_0|f32]

Tensor types written:
  bf16  every matrix as stored (bf16 bits copied unchanged); norms and the router as F32
        (exact widening of bf16).
  q8_0  the projections afd's FP8 block format quantizes (attention q/k/v/o and the expert
        gate/up/down matrices) as Q8_0 from the stored values; the token embedding and the
        LM head stay bf16, norms and the router F32 — the same split as `afd quantize --fp8`.
  f32   everything F32.

Supported checkpoints (bf16/f16/f32 tensors, expert tensors per expert (mlp.experts.E.*_proj)
or fused (mlp.experts.gate_up_proj / down_proj)):

  qwen3_moe -> llama.cpp `qwen3moe`: every layer MoE (decoder_sparse_step 1, no
        mlp_only_layers), norm_topk_prob true, no rope_scaling. llama.cpp's qwen3moe graph
        renormalises the top-k weights and has no dense-layer variant.

  deepseek_v3, kimi_k2 (and deepseek_v2 with topk_method greedy) -> llama.cpp `deepseek2`
        (MLA in its absorbed form): q_a/q_b LoRA or q_proj (q_lora_rank null),
        kv_a_proj_with_mqa, kv_b_proj split per head into attn_k_b (the k rows, transposed to
        [head, kv_lora_rank, qk_nope]) and attn_v_b ([head, v_head_dim, kv_lora_rank]), as
        llama.cpp's own converter does; head_count_kv 1, key_length kv_lora_rank +
        qk_rope_head_dim, value_length kv_lora_rank, key/value_length_mla the per-head
        sizes. first_k_dense_replace dense layers (ffn_gate/up/down), then MoE layers:
        ffn_gate_inp (router, F32), exp_probs_b.bias (e_score_correction_bias, F32), routed
        experts stacked [E, ...] as ffn_{gate,up,down}_exps, shared experts as
        ffn_*_shexp; expert_gating_func sigmoid|softmax (scoring_func), expert_group_count /
        expert_group_used_count (n_group / topk_group: llama.cpp scores a group by the sum
        of its two best biased scores and masks the others with -inf, which is noaux_tc),
        expert_weights_norm (norm_topk_prob), expert_weights_scale (routed_scaling_factor).
        RoPE: llama.cpp's deepseek2 rotates interleaved pairs (GPT-J), as HF with
        rope_interleave true (the default); with rope_interleave false the rope rows of
        q and of kv_a are permuted so that the same pairs rotate. YaRN (rope_scaling type
        yarn): factor, original_max_position_embeddings, yarn_log_mul = 0.1 x
        mscale_all_dim (llama.cpp's deepseek2 convention); refused unless mscale equals
        mscale_all_dim and beta_fast/beta_slow are 32/1 (the only values llama.cpp's
        deepseek2 uses). MTP layers (num_nextn_predict_layers, model.layers.L >=
        num_hidden_layers) are skipped, as llama.cpp's converter does. Refused: moe_layer_freq
        != 1, group_limited_greedy routing with groups that mask (groups scored by their
        max), attention_bias, n_shared_experts 0.

Settings llama.cpp cannot express are refused rather than converted to a different model.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np


class ConvertError(Exception):
    pass


# ---------------------------------------------------------------- safetensors reading

_ST_DTYPES = {"BF16": (np.uint16, "bf16"), "F16": (np.float16, "f16"), "F32": (np.float32, "f32")}


class SafeTensors:
    """Memory-mapped view of every tensor in a checkpoint directory (one or more shards)."""

    def __init__(self, model_dir):
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        if not files:
            raise ConvertError(f"{model_dir}: no .safetensors files")
        self.tensors = {}  # name -> (path, dtype tag, shape, offset, nbytes)
        for fname in files:
            path = os.path.join(model_dir, fname)
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise ConvertError(f"{path}: shorter than a safetensors header")
                (hlen,) = struct.unpack("<Q", head)
                if hlen > 100_000_000:
                    raise ConvertError(f"{path}: header length {hlen} is implausible")
                header = json.loads(f.read(hlen))
            base = 8 + hlen
            size = os.path.getsize(path)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                dt = info.get("dtype")
                if dt not in _ST_DTYPES:
                    raise ConvertError(f"{path}: tensor {name} has dtype {dt}; only BF16, F16, F32 are supported")
                start, end = info["data_offsets"]
                shape = tuple(int(d) for d in info["shape"])
                nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_ST_DTYPES[dt][0]).itemsize
                if end - start != nbytes or base + end > size:
                    raise ConvertError(f"{path}: tensor {name} offsets [{start}, {end}) do not fit shape {shape}")
                if name in self.tensors:
                    raise ConvertError(f"{path}: tensor {name} appears in two shards")
                self.tensors[name] = (path, dt, shape, base + start, nbytes)

    def has(self, name):
        return name in self.tensors

    def shape(self, name):
        return self._info(name)[2]

    def dtype(self, name):
        return self._info(name)[1]

    def _info(self, name):
        if name not in self.tensors:
            raise ConvertError(f"checkpoint has no tensor {name}")
        return self.tensors[name]

    def raw(self, name):
        """The stored array (uint16 bits for BF16), memory-mapped, read-only."""
        path, dt, shape, off, _ = self._info(name)
        return np.memmap(path, dtype=_ST_DTYPES[dt][0], mode="r", offset=off, shape=shape)

    def f32(self, name):
        a = self.raw(name)
        if self.dtype(name) == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(a, dtype=np.float32)


# ---------------------------------------------------------------- tensor plan

class Out:
    """One GGUF tensor: its name, numpy-order shape, GGML type and how to produce it."""

    def __init__(self, name, shape, qtype, produce):
        self.name, self.shape, self.qtype, self.produce = name, tuple(shape), qtype, produce


def typed(gguf, st, outtype, name_out, src_names, shape, kind, transform=None):
    """One output tensor from one checkpoint tensor, or from a list of them stacked on a new
    first axis. kind: 'norm' | 'router' | 'embed' | 'linear'. transform (optional) maps the
    stacked array to the output layout (a pure index operation: slicing, transposing,
    reordering rows), applied alike to bf16 bits and to f32 values."""
    T = gguf.GGMLQuantizationType
    names = src_names if isinstance(src_names, list) else [src_names]
    bf16 = all(st.dtype(n) == "BF16" for n in names)
    tf = transform or (lambda x: x)

    def values(raw):
        get = st.raw if raw else st.f32
        return np.ascontiguousarray(tf(np.stack([get(n) for n in names]) if len(names) > 1 else get(names[0])))

    if kind in ("norm", "router") or outtype == "f32" or not bf16 and outtype == "bf16":
        return Out(name_out, shape, T.F32, lambda: values(False))
    if outtype == "q8_0" and kind == "linear" and shape[-1] % 32 == 0:
        return Out(name_out, shape, T.Q8_0, lambda: gguf.quants.quantize(values(False), T.Q8_0))
    if not bf16:
        return Out(name_out, shape, T.F32, lambda: values(False))
    return Out(name_out, shape, T.BF16, lambda: values(True))


def check_shape(st, name, want):
    got = st.shape(name)
    if tuple(got) != tuple(want):
        raise ConvertError(f"tensor {name}: shape {list(got)}, config implies {list(want)}")


def plan_tensors(gguf, st, cfg, outtype):
    """qwen3_moe -> qwen3moe."""
    L = int(cfg["num_hidden_layers"])
    E = int(cfg["num_experts"])

    def out(name_out, src, shape, kind):
        return typed(gguf, st, outtype, name_out, src, shape, kind)

    H, V = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    nh, nkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    hd = int(cfg.get("head_dim") or H // nh)
    I = int(cfg["moe_intermediate_size"])
    outs = []
    check_shape(st, "model.embed_tokens.weight", (V, H))
    outs.append(out("token_embd.weight", "model.embed_tokens.weight", (V, H), "embed"))
    for l in range(L):
        p = f"model.layers.{l}."
        b = f"blk.{l}."
        a = p + "self_attn."
        for hf, gg, shp, kind in [
            (p + "input_layernorm.weight", "attn_norm.weight", (H,), "norm"),
            (a + "q_proj.weight", "attn_q.weight", (nh * hd, H), "linear"),
            (a + "k_proj.weight", "attn_k.weight", (nkv * hd, H), "linear"),
            (a + "v_proj.weight", "attn_v.weight", (nkv * hd, H), "linear"),
            (a + "o_proj.weight", "attn_output.weight", (H, nh * hd), "linear"),
            (a + "q_norm.weight", "attn_q_norm.weight", (hd,), "norm"),
            (a + "k_norm.weight", "attn_k_norm.weight", (hd,), "norm"),
            (p + "post_attention_layernorm.weight", "ffn_norm.weight", (H,), "norm"),
            (p + "mlp.gate.weight", "ffn_gate_inp.weight", (E, H), "router"),
        ]:
            check_shape(st, hf, shp)
            outs.append(out(b + gg, hf, shp, kind))
        outs.extend(routed_experts(gguf, st, p + "mlp.experts.", b, E, I, H, outtype))
    outs.extend(final_norm_and_head(gguf, st, cfg, outtype, H, V))
    return outs


def routed_experts(gguf, st, m, b, E, I, H, outtype):
    """ffn_{gate,up,down}_exps of one layer from either expert layout (m: 'model.layers.L.mlp.experts.')."""
    if st.has(m + "gate_up_proj"):
        check_shape(st, m + "gate_up_proj", (E, 2 * I, H))
        check_shape(st, m + "down_proj", (E, H, I))
        return fused_experts(gguf, st, m, b, E, I, H, outtype)
    outs = []
    for proj, gg, shp in [("gate_proj", "ffn_gate_exps", (I, H)), ("up_proj", "ffn_up_exps", (I, H)),
                          ("down_proj", "ffn_down_exps", (H, I))]:
        names = [f"{m}{e}.{proj}.weight" for e in range(E)]
        for n in names:
            check_shape(st, n, shp)
        outs.append(typed(gguf, st, outtype, b + gg + ".weight", names, (E,) + shp, "linear"))
    return outs


def final_norm_and_head(gguf, st, cfg, outtype, H, V):
    check_shape(st, "model.norm.weight", (H,))
    outs = [typed(gguf, st, outtype, "output_norm.weight", "model.norm.weight", (H,), "norm")]
    if cfg.get("tie_word_embeddings", False):
        return outs  # llama.cpp falls back to token_embd.weight when output.weight is absent
    if not st.has("lm_head.weight"):
        raise ConvertError("checkpoint has no lm_head.weight and tie_word_embeddings is false")
    check_shape(st, "lm_head.weight", (V, H))
    outs.append(typed(gguf, st, outtype, "output.weight", "lm_head.weight", (V, H), "embed"))
    return outs


def fused_experts(gguf, st, m, b, E, I, H, outtype):
    """Fused layout: gate_up_proj [E, 2I, H] holds expert e's gate rows then its up rows."""
    T = gguf.GGMLQuantizationType
    gu, dn = m + "gate_up_proj", m + "down_proj"
    bf16 = st.dtype(gu) == "BF16" and st.dtype(dn) == "BF16"

    def make(name, shape, take):
        if outtype == "f32" or (outtype == "bf16" and not bf16):
            return Out(name, shape, T.F32, lambda: np.ascontiguousarray(take(True)))
        if outtype == "q8_0" and shape[-1] % 32 == 0:
            return Out(name, shape, T.Q8_0, lambda: gguf.quants.quantize(np.ascontiguousarray(take(True)), T.Q8_0))
        if not bf16:
            return Out(name, shape, T.F32, lambda: np.ascontiguousarray(take(True)))
        return Out(name, shape, T.BF16, lambda: np.ascontiguousarray(take(False)))

    def part(tensor, lo, hi):
        return lambda as_f32: (st.f32(tensor) if as_f32 else st.raw(tensor))[:, lo:hi, :]

    return [make(b + "ffn_gate_exps.weight", (E, I, H), part(gu, 0, I)),
            make(b + "ffn_up_exps.weight", (E, I, H), part(gu, I, 2 * I)),
            make(b + "ffn_down_exps.weight", (E, H, I), part(dn, 0, H))]


# DeepSeek defaults for absent fields (transformers' DeepseekV3Config / DeepseekV2Config).
_DS_DEFAULTS = {
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
                    "routed_scaling_factor": 2.5},
    "kimi_k2": {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
                "routed_scaling_factor": 2.5},
    "deepseek_v2": {"scoring_func": "softmax", "topk_method": "greedy", "norm_topk_prob": False,
                    "routed_scaling_factor": 1.0},
}


def ds_get(cfg, key):
    v = cfg.get(key)
    return _DS_DEFAULTS[cfg["model_type"]][key] if v is None else v


def ds_dims(cfg):
    d = {k: int(cfg[k]) for k in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                                  "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                                  "moe_intermediate_size", "intermediate_size", "n_routed_experts",
                                  "num_experts_per_tok")}
    d["q_lora_rank"] = int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else 0
    d["n_shared_experts"] = int(cfg.get("n_shared_experts") or 0)
    d["first_k_dense_replace"] = int(cfg.get("first_k_dense_replace") or 0)
    return d


def rope_perm(R, interleave):
    """Row order that turns HF rotate-half pairs (i, i + R/2) into llama.cpp's interleaved pairs
    (2i, 2i + 1) with the same frequency i; the identity when the checkpoint is interleaved."""
    if interleave:
        return np.arange(R)
    return np.array([j // 2 + (j % 2) * (R // 2) for j in range(R)])


def plan_tensors_deepseek(gguf, st, cfg, outtype):
    """deepseek_v3 / kimi_k2 / deepseek_v2 -> deepseek2 (absorbed MLA: attn_k_b / attn_v_b)."""
    d = ds_dims(cfg)
    H, V, L = d["hidden_size"], d["vocab_size"], d["num_hidden_layers"]
    nh, QR, KR = d["num_attention_heads"], d["q_lora_rank"], d["kv_lora_rank"]
    R, P, Vd = d["qk_rope_head_dim"], d["qk_nope_head_dim"], d["v_head_dim"]
    E, I, Id = d["n_routed_experts"], d["moe_intermediate_size"], d["intermediate_size"]
    S, dense = d["n_shared_experts"], d["first_k_dense_replace"]
    perm = rope_perm(R, cfg.get("rope_interleave", True) is not False)
    # q rows: per head [nope P | rope R]; kv_a rows: [latent KR | rope R]
    q_rows = np.concatenate([np.concatenate([h * (P + R) + np.arange(P), h * (P + R) + P + perm])
                             for h in range(nh)])
    kva_rows = np.concatenate([np.arange(KR), KR + perm])

    def out(name_out, src, shape, kind, transform=None):
        check_shape(st, src, shape if transform is None else st.shape(src))
        return typed(gguf, st, outtype, name_out, src, shape, kind, transform)

    outs = []
    check_shape(st, "model.embed_tokens.weight", (V, H))
    outs.append(out("token_embd.weight", "model.embed_tokens.weight", (V, H), "embed"))
    for l in range(L):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        a = p + "self_attn."
        outs.append(out(b + "attn_norm.weight", p + "input_layernorm.weight", (H,), "norm"))
        if QR:
            outs.append(out(b + "attn_q_a.weight", a + "q_a_proj.weight", (QR, H), "linear"))
            outs.append(out(b + "attn_q_a_norm.weight", a + "q_a_layernorm.weight", (QR,), "norm"))
            check_shape(st, a + "q_b_proj.weight", (nh * (P + R), QR))
            outs.append(out(b + "attn_q_b.weight", a + "q_b_proj.weight", (nh * (P + R), QR), "linear",
                            lambda x: x[q_rows]))
        else:
            check_shape(st, a + "q_proj.weight", (nh * (P + R), H))
            outs.append(out(b + "attn_q.weight", a + "q_proj.weight", (nh * (P + R), H), "linear",
                            lambda x: x[q_rows]))
        check_shape(st, a + "kv_a_proj_with_mqa.weight", (KR + R, H))
        outs.append(out(b + "attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight", (KR + R, H), "linear",
                        lambda x: x[kva_rows]))
        outs.append(out(b + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight", (KR,), "norm"))
        # kv_b_proj [nh * (P + Vd), KR]: per head P rows of W_UK then Vd rows of W_UV.
        kvb = a + "kv_b_proj.weight"
        check_shape(st, kvb, (nh * (P + Vd), KR))
        outs.append(out(b + "attn_k_b.weight", kvb, (nh, KR, P), "linear",
                        lambda x: x.reshape(nh, P + Vd, KR)[:, :P, :].transpose(0, 2, 1)))
        outs.append(out(b + "attn_v_b.weight", kvb, (nh, Vd, KR), "linear",
                        lambda x: x.reshape(nh, P + Vd, KR)[:, P:, :]))
        outs.append(out(b + "attn_output.weight", a + "o_proj.weight", (H, nh * Vd), "linear"))
        outs.append(out(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (H,), "norm"))
        m = p + "mlp."
        if l < dense:
            for proj, gg, shp in [("gate_proj", "ffn_gate", (Id, H)), ("up_proj", "ffn_up", (Id, H)),
                                  ("down_proj", "ffn_down", (H, Id))]:
                outs.append(out(b + gg + ".weight", m + proj + ".weight", shp, "linear"))
            continue
        outs.append(out(b + "ffn_gate_inp.weight", m + "gate.weight", (E, H), "router"))
        if st.has(m + "gate.e_score_correction_bias"):
            outs.append(out(b + "exp_probs_b.bias", m + "gate.e_score_correction_bias", (E,), "norm"))
        elif ds_get(cfg, "topk_method") == "noaux_tc":
            raise ConvertError(f"topk_method noaux_tc but {m}gate.e_score_correction_bias is missing")
        outs.extend(routed_experts(gguf, st, m + "experts.", b, E, I, H, outtype))
        for proj, gg, shp in [("gate_proj", "ffn_gate_shexp", (S * I, H)), ("up_proj", "ffn_up_shexp", (S * I, H)),
                              ("down_proj", "ffn_down_shexp", (H, S * I))]:
            outs.append(out(b + gg + ".weight", m + "shared_experts." + proj + ".weight", shp, "linear"))
    outs.extend(final_norm_and_head(gguf, st, cfg, outtype, H, V))
    return outs


def nbytes_of(gguf, out):
    n = int(np.prod(out.shape, dtype=np.int64))
    T = gguf.GGMLQuantizationType
    if out.qtype == T.Q8_0:
        return n // 32 * 34
    return n * {T.F32: 4, T.BF16: 2, T.F16: 2}[out.qtype]


# ---------------------------------------------------------------- tokenizer

# The Split regex of afd's generated tokenizers and of the trained models' tokenizers
# (serve/text/pre_tokenizer.h, SplitPattern::qwen2): llama.cpp's pre-tokenizer "qwen2".
_PRE_PATTERNS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
}


def tokenizer_pre(tj, path):
    """llama.cpp's pre-tokenizer name for tokenizer.json's Split pattern."""
    pre = tj.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    regexes = [(x.get("pattern") or {}).get("Regex") for x in parts if x.get("type") == "Split"]
    if len(regexes) == 1 and regexes[0] in _PRE_PATTERNS:
        return _PRE_PATTERNS[regexes[0]]
    raise ConvertError(f"{path}: pre-tokenizer {json.dumps(pre)[:300]} is not one this script knows; "
                       "give --tokenizer-pre NAME (a llama.cpp pre-tokenizer name)")


def add_tokenizer(gguf, w, model_dir, cfg, pre_override=None):
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        raise ConvertError(f"{path} is missing (afd make-model writes it for vocab_size >= 260)")
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"{path}: model type {model.get('type')!r}; only byte-level BPE is supported")
    vocab = model["vocab"]
    V = int(cfg["vocab_size"])
    added = {int(t["id"]): t for t in tj.get("added_tokens", [])}
    tokens = [None] * V
    types = [gguf.TokenType.NORMAL] * V
    for text, i in vocab.items():
        if not 0 <= i < V:
            raise ConvertError(f"{path}: token {text!r} has id {i} outside vocab_size {V}")
        tokens[i] = text
    for i, t in added.items():
        if not 0 <= i < V:
            raise ConvertError(f"{path}: added token {t['content']!r} has id {i} outside vocab_size {V}")
        tokens[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    for i in range(V):
        if tokens[i] is None:  # the embedding has more rows than the tokenizer has tokens
            tokens[i] = f"[PAD{i}]"
            types[i] = gguf.TokenType.UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_override or tokenizer_pre(tj, path))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = cfg.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if eos_ids:
        w.add_eos_token_id(int(eos_ids[0]))
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(int(cfg["bos_token_id"]))
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    tc = {}
    if os.path.exists(tc_path):
        with open(tc_path, encoding="utf-8") as f:
            tc = json.load(f)
    # text prompts: BOS first when the tokenizer adds one (the trained models do); prompts
    # given as token ids (every harness in bench/) are taken as they are
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    if tc:
        if isinstance(tc.get("chat_template"), str):
            w.add_chat_template(tc["chat_template"])
        pad = tc.get("pad_token")
        for i, t in added.items():
            if pad is not None and t["content"] == pad:
                w.add_pad_token_id(i)


# ---------------------------------------------------------------- main

def load_gguf_py(llama_cpp):
    if not llama_cpp:
        raise ConvertError("give --llama-cpp DIR (a llama.cpp source tree) or set $LLAMA_CPP")
    path = os.path.join(llama_cpp, "gguf-py")
    if not os.path.isdir(os.path.join(path, "gguf")):
        raise ConvertError(f"{path}/gguf not found: --llama-cpp must name a llama.cpp source tree")
    sys.path.insert(0, path)
    import gguf  # noqa: E402  (llama.cpp's gguf-py)
    return gguf


DEEPSEEK_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v2")


def check_config(cfg, model_dir):
    where = os.path.join(model_dir, "config.json")
    if cfg.get("model_type") in DEEPSEEK_TYPES:
        return check_config_deepseek(cfg, where)
    if cfg.get("model_type") != "qwen3_moe":
        raise ConvertError(f"{where}: model_type {cfg.get('model_type')!r}; supported: qwen3_moe, "
                           + ", ".join(DEEPSEEK_TYPES))
    if cfg.get("quantization_config"):
        raise ConvertError(f"{where}: quantized checkpoints are not supported; convert the bf16 checkpoint")
    if int(cfg.get("decoder_sparse_step", 1)) != 1 or cfg.get("mlp_only_layers"):
        raise ConvertError(f"{where}: dense layers (decoder_sparse_step != 1 or mlp_only_layers) have no "
                           "llama.cpp qwen3moe equivalent")
    if not cfg.get("norm_topk_prob", False):
        raise ConvertError(f"{where}: norm_topk_prob false; llama.cpp's qwen3moe always renormalises the top-k weights")
    if cfg.get("rope_scaling"):
        raise ConvertError(f"{where}: rope_scaling is not supported")


def check_config_deepseek(cfg, where):
    if cfg.get("quantization_config"):
        raise ConvertError(f"{where}: quantized checkpoints are not supported; convert the bf16 checkpoint")
    for k in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
              "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "moe_intermediate_size", "intermediate_size",
              "n_routed_experts", "num_experts_per_tok", "rope_theta", "rms_norm_eps", "max_position_embeddings"):
        if cfg.get(k) is None:
            raise ConvertError(f"{where}: {k} is missing (this script converts MoE checkpoints only)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConvertError(f"{where}: hidden_act {cfg.get('hidden_act')!r}; llama.cpp's deepseek2 uses silu")
    if cfg.get("attention_bias"):
        raise ConvertError(f"{where}: attention_bias true; llama.cpp's deepseek2 has no attention biases")
    if int(cfg.get("moe_layer_freq") or 1) != 1:
        raise ConvertError(f"{where}: moe_layer_freq {cfg.get('moe_layer_freq')}; llama.cpp's deepseek2 makes every "
                           "layer from first_k_dense_replace on MoE")
    if not cfg.get("n_shared_experts"):
        raise ConvertError(f"{where}: n_shared_experts is 0 or absent; llama.cpp's deepseek2 needs shared experts")
    if int(cfg["num_hidden_layers"]) in (26, 27) and cfg.get("q_lora_rank"):
        raise ConvertError(f"{where}: llama.cpp takes a 26- or 27-layer deepseek2 for DeepSeek-V2-Lite and then "
                           "ignores q_lora_rank")
    if int(cfg["qk_rope_head_dim"]) % 2:
        raise ConvertError(f"{where}: odd qk_rope_head_dim")
    sf = ds_get(cfg, "scoring_func")
    if sf not in ("sigmoid", "softmax"):
        raise ConvertError(f"{where}: scoring_func {sf!r}; llama.cpp has sigmoid and softmax")
    tm = ds_get(cfg, "topk_method")
    ng, tg = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
    if tm not in ("noaux_tc", "greedy", "group_limited_greedy"):
        raise ConvertError(f"{where}: topk_method {tm!r} is not supported")
    if tm == "group_limited_greedy" and 1 < ng and tg < ng:
        raise ConvertError(f"{where}: group_limited_greedy scores a group by its best expert; llama.cpp scores "
                           "it by the sum of its two best")
    if tm == "noaux_tc" and ng > 1 and int(cfg["n_routed_experts"]) // ng < 2:
        raise ConvertError(f"{where}: noaux_tc groups of fewer than 2 experts")
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("type") or rs.get("rope_type")
        if kind != "yarn":
            raise ConvertError(f"{where}: rope_scaling type {kind!r}; only yarn is supported")
        if float(rs.get("beta_fast", 32)) != 32 or float(rs.get("beta_slow", 1)) != 1:
            raise ConvertError(f"{where}: YaRN beta_fast/beta_slow {rs.get('beta_fast')}/{rs.get('beta_slow')}; "
                               "llama.cpp's deepseek2 always uses 32/1")
        if float(rs["factor"]) > 1 and float(rs.get("mscale", 1)) != float(rs.get("mscale_all_dim", 0)):
            raise ConvertError(f"{where}: YaRN mscale {rs.get('mscale', 1)} != mscale_all_dim "
                               f"{rs.get('mscale_all_dim', 0)}: HF scales cos/sin by their ratio, llama.cpp's "
                               "deepseek2 never does")
        if "original_max_position_embeddings" not in rs:
            raise ConvertError(f"{where}: rope_scaling has no original_max_position_embeddings")


def add_deepseek_metadata(gguf, w, cfg):
    d = ds_dims(cfg)
    KR, R = d["kv_lora_rank"], d["qk_rope_head_dim"]
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(d["hidden_size"])
    w.add_block_count(d["num_hidden_layers"])
    w.add_feed_forward_length(d["intermediate_size"])
    w.add_head_count(d["num_attention_heads"])
    w.add_head_count_kv(1)  # absorbed MLA: one latent "KV head" shared by every query head
    w.add_key_length(KR + R)
    w.add_value_length(KR)
    w.add_key_length_mla(d["qk_nope_head_dim"] + R)
    w.add_value_length_mla(d["v_head_dim"])
    w.add_q_lora_rank(d["q_lora_rank"])  # 0: q_proj (llama.cpp reads the key for non-"lite" layer counts)
    w.add_kv_lora_rank(KR)
    w.add_rope_dimension_count(R)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(d["vocab_size"])
    w.add_leading_dense_block_count(d["first_k_dense_replace"])
    w.add_expert_feed_forward_length(d["moe_intermediate_size"])
    w.add_expert_count(d["n_routed_experts"])
    w.add_expert_used_count(d["num_experts_per_tok"])
    w.add_expert_shared_count(d["n_shared_experts"])
    w.add_expert_weights_scale(float(ds_get(cfg, "routed_scaling_factor")))
    w.add_expert_weights_norm(bool(ds_get(cfg, "norm_topk_prob")))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if ds_get(cfg, "scoring_func") == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    ng, tg = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
    if ds_get(cfg, "topk_method") != "greedy" and ng > 1 and tg < ng:
        w.add_expert_group_count(ng)
        w.add_expert_group_used_count(tg)
    rs = cfg.get("rope_scaling")
    if rs and float(rs["factor"]) > 1:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rs["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rs["original_max_position_embeddings"]))
        if float(rs.get("mscale_all_dim", 0)):
            # llama.cpp divides this key by 0.1 when it loads a deepseek2 file (its converter's convention)
            w.add_rope_scaling_yarn_log_mul(0.1 * float(rs["mscale_all_dim"]))


def add_qwen3_metadata(gguf, w, cfg):
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    hd = int(cfg.get("head_dim") or H // nh)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(H)
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_feed_forward_length(int(cfg.get("intermediate_size") or cfg["moe_intermediate_size"]))
    w.add_head_count(nh)
    w.add_head_count_kv(int(cfg["num_key_value_heads"]))
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(int(cfg["num_experts"]))
    w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
    w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))


def convert(model_dir, out_path, outtype, llama_cpp, pre_override=None):
    gguf = load_gguf_py(llama_cpp)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    check_config(cfg, model_dir)
    st = SafeTensors(model_dir)
    deepseek = cfg["model_type"] in DEEPSEEK_TYPES
    outs = (plan_tensors_deepseek if deepseek else plan_tensors)(gguf, st, cfg, outtype)

    w = gguf.GGUFWriter(out_path, "deepseek2" if deepseek else "qwen3moe")
    w.add_name(os.path.basename(os.path.normpath(model_dir)))
    w.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "f32": gguf.LlamaFileType.ALL_F32}[outtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    (add_deepseek_metadata if deepseek else add_qwen3_metadata)(gguf, w, cfg)
    add_tokenizer(gguf, w, model_dir, cfg, pre_override)

    # Tensor infos first, then the data streamed one tensor at a time (memory: one tensor).
    # (A non-uint8 tensor_dtype with raw_dtype set keeps o.shape as the element shape.)
    for o in outs:
        w.add_tensor_info(o.name, o.shape, np.dtype(np.float32), nbytes_of(gguf, o), raw_dtype=o.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for o in outs:
        data = np.ascontiguousarray(o.produce())
        if data.nbytes != nbytes_of(gguf, o):
            raise ConvertError(f"{o.name}: produced {data.nbytes} bytes, expected {nbytes_of(gguf, o)}")
        w.write_tensor_data(data)
        total += data.nbytes
    w.close()
    return len(outs), total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="afd/HF checkpoint directory (config.json, *.safetensors)")
    ap.add_argument("--out", required=True, help="output .gguf file")
    ap.add_argument("--outtype", choices=["bf16", "q8_0", "f32"], default="bf16")
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP"), help="llama.cpp source tree (for gguf-py)")
    ap.add_argument("--tokenizer-pre", help="llama.cpp pre-tokenizer name (default: from tokenizer.json's Split "
                    "pattern; afd's tokenizers: qwen2)")
    args = ap.parse_args()
    try:
        n, total = convert(args.model, args.out, args.outtype, args.llama_cpp, args.tokenizer_pre)
    except (ConvertError, OSError, KeyError, ValueError) as e:
        print(f"gguf_convert: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {n} tensors, {total / 1e6:.1f} MB of tensor data ({args.outtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
