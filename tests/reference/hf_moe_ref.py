"""Independent reference of the Hugging Face forward pass of Qwen3-MoE, Qwen2-MoE and
Mixtral, in numpy float64 (or float32, to estimate what an f32 engine deviates by).

Written from the Hugging Face model semantics (modeling_qwen3_moe.py,
modeling_qwen2_moe.py, modeling_mixtral.py), not from afd's C++ code. Only inference
without padding: every sequence is processed at its own positions 0..L-1 with a
per-sequence KV cache; a batch is a list of (sequence, new tokens) that is flattened
into one [n_tokens, hidden] activation matrix, like a serving engine does.

Usage as a library:
    model = Model.from_dir("tests/reference/data/qwen3_gqa2_top2")
    rows, tokens = greedy(model, [[1, 2, 3]], max_new_tokens=8)
"""

import json
import math
import os

import numpy as np

import safetensors_io as st
from ref_common import checked_tensor, flatten_batch, load_embed_norm_head, rms_norm, silu, softmax


# ----------------------------------------------------------------------------- config

class Config:
    """The config.json fields the forward pass uses, with Hugging Face's defaults."""

    def __init__(self, d):
        self.raw = d
        mt = d.get("model_type")
        if mt not in ("qwen3_moe", "qwen2_moe", "mixtral"):
            raise ValueError(f"config.json: unsupported model_type {mt!r}")
        self.model_type = mt

        def req(k):
            if k not in d or d[k] is None:
                raise ValueError(f"config.json: missing field {k}")
            return d[k]

        self.vocab_size = int(req("vocab_size"))
        self.hidden_size = int(req("hidden_size"))
        self.n_layers = int(req("num_hidden_layers"))
        self.n_heads = int(req("num_attention_heads"))
        kv = d.get("num_key_value_heads")
        self.n_kv_heads = int(kv) if kv is not None else self.n_heads
        hd = d.get("head_dim")
        self.head_dim = int(hd) if hd is not None else self.hidden_size // self.n_heads
        self.rope_theta = float(d.get("rope_theta", 1e6 if mt == "mixtral" else 10000.0))
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-5 if mt == "mixtral" else 1e-6))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        self.max_position_embeddings = int(d.get("max_position_embeddings", 0) or 0)
        self.intermediate_size = int(d.get("intermediate_size", 0) or 0)
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {d.get('hidden_act')!r} not supported (silu only)")
        rs = d.get("rope_scaling")
        if rs not in (None, {}) and not (isinstance(rs, dict)
                                         and rs.get("rope_type", rs.get("type")) == "default"):
            raise ValueError("config.json: rope_scaling is not supported by the reference")
        if d.get("use_sliding_window", False):
            raise ValueError("config.json: use_sliding_window is not supported by the reference")
        if mt == "mixtral":
            self.n_experts = int(req("num_local_experts"))
            self.top_k = int(req("num_experts_per_tok"))
            self.moe_intermediate_size = int(req("intermediate_size"))
            self.norm_topk_prob = True          # Mixtral always renormalises the top-k
            self.decoder_sparse_step = 1
            self.mlp_only_layers = []
            self.shared_expert_intermediate_size = 0
            self.qk_norm = False
            self.qkv_bias = False
            self.o_bias = False
            sw = d.get("sliding_window")
            if sw is not None and int(sw) < self.max_position_embeddings:
                raise ValueError("config.json: sliding_window attention is not supported by the reference")
        else:
            self.n_experts = int(d.get("num_experts", 0) or 0)
            self.top_k = int(req("num_experts_per_tok")) if self.n_experts > 0 else 0
            self.moe_intermediate_size = int(d.get("moe_intermediate_size", 0) or 0)
            self.norm_topk_prob = bool(d.get("norm_topk_prob", False))
            self.decoder_sparse_step = int(d.get("decoder_sparse_step", 1) or 1)
            self.mlp_only_layers = [int(x) for x in (d.get("mlp_only_layers") or [])]
            if mt == "qwen2_moe":
                self.shared_expert_intermediate_size = int(req("shared_expert_intermediate_size"))
                self.qk_norm = False
                self.qkv_bias = True
                self.o_bias = False
            else:
                self.shared_expert_intermediate_size = 0  # Qwen3-MoE has no shared expert
                self.qk_norm = True
                ab = bool(d.get("attention_bias", False))
                self.qkv_bias = ab
                self.o_bias = ab
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError("config.json: num_attention_heads not divisible by num_key_value_heads")
        if self.head_dim % 2 != 0:
            raise ValueError("config.json: head_dim must be even for RoPE")
        if self.n_experts > 0 and not (1 <= self.top_k <= self.n_experts):
            raise ValueError("config.json: num_experts_per_tok outside [1, num_experts]")

    def is_moe_layer(self, layer):
        if self.model_type == "mixtral":
            return True
        return (layer not in self.mlp_only_layers and self.n_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    @staticmethod
    def from_dir(model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return Config(json.load(f))


# ----------------------------------------------------------------------------- math

def rope_cos_sin(positions, head_dim, theta, dtype):
    """NEOX rotate-half RoPE tables. positions [n] -> cos, sin [n, head_dim]
    with inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2, duplicated (cat(f, f))."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / head_dim))
    freqs = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]   # [n, half]
    emb = np.concatenate([freqs, freqs], axis=-1)                                   # [n, head_dim]
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def apply_rope(x, cos, sin):
    """x [n, heads, head_dim]; x*cos + rotate_half(x)*sin, rotate_half = cat(-x2, x1)."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


# ----------------------------------------------------------------------------- model

class Sequence:
    """Per-sequence state: tokens seen and per-layer K/V caches [len, n_kv, head_dim]."""

    def __init__(self, n_layers):
        self.length = 0
        self.k = [None] * n_layers
        self.v = [None] * n_layers


class Model:
    def __init__(self, cfg, tensors, dtype=np.float64):
        """cfg: Config; tensors: {name: st.Tensor} in HF naming (either expert layout)."""
        self.cfg = cfg
        self.dtype = dtype
        self.stats = RoutingStats()
        self._load(tensors)

    @staticmethod
    def from_dir(model_dir, dtype=np.float64):
        return Model(Config.from_dir(model_dir), st.load_dir(model_dir), dtype)

    # -- weights
    def _load(self, tensors):
        c = self.cfg
        used = set()

        def get(name, shape):
            return checked_tensor(tensors, used, name, shape).to_f64().astype(self.dtype)

        H, hd = c.hidden_size, c.head_dim
        self.embed, self.final_norm, self.lm_head = load_embed_norm_head(get, c, used)
        self.layers = []
        for l in range(c.n_layers):
            p = f"model.layers.{l}."
            L = {}
            L["in_norm"] = get(p + "input_layernorm.weight", (H,))
            L["post_norm"] = get(p + "post_attention_layernorm.weight", (H,))
            a = p + "self_attn."
            L["wq"] = get(a + "q_proj.weight", (c.n_heads * hd, H))
            L["wk"] = get(a + "k_proj.weight", (c.n_kv_heads * hd, H))
            L["wv"] = get(a + "v_proj.weight", (c.n_kv_heads * hd, H))
            L["wo"] = get(a + "o_proj.weight", (H, c.n_heads * hd))
            if c.qkv_bias:
                L["bq"] = get(a + "q_proj.bias", (c.n_heads * hd,))
                L["bk"] = get(a + "k_proj.bias", (c.n_kv_heads * hd,))
                L["bv"] = get(a + "v_proj.bias", (c.n_kv_heads * hd,))
            if c.o_bias:
                L["bo"] = get(a + "o_proj.bias", (H,))
            if c.qk_norm:
                L["q_norm"] = get(a + "q_norm.weight", (hd,))
                L["k_norm"] = get(a + "k_norm.weight", (hd,))
            if c.is_moe_layer(l):
                L["moe"] = True
                I, E = c.moe_intermediate_size, c.n_experts
                if c.model_type == "mixtral":
                    m = p + "block_sparse_moe."
                    L["router"] = get(m + "gate.weight", (E, H))
                    L["eg"] = [get(m + f"experts.{e}.w1.weight", (I, H)) for e in range(E)]
                    L["eu"] = [get(m + f"experts.{e}.w3.weight", (I, H)) for e in range(E)]
                    L["ed"] = [get(m + f"experts.{e}.w2.weight", (H, I)) for e in range(E)]
                else:
                    m = p + "mlp."
                    L["router"] = get(m + "gate.weight", (E, H))
                    if m + "experts.gate_up_proj" in tensors:
                        # fused layout: gate_up_proj [E, 2I, H] (gate rows 0..I-1, up rows I..2I-1),
                        # down_proj [E, H, I]
                        gu = get(m + "experts.gate_up_proj", (E, 2 * I, H))
                        dn = get(m + "experts.down_proj", (E, H, I))
                        L["eg"] = [gu[e, :I, :] for e in range(E)]
                        L["eu"] = [gu[e, I:, :] for e in range(E)]
                        L["ed"] = [dn[e] for e in range(E)]
                    else:
                        L["eg"] = [get(m + f"experts.{e}.gate_proj.weight", (I, H)) for e in range(E)]
                        L["eu"] = [get(m + f"experts.{e}.up_proj.weight", (I, H)) for e in range(E)]
                        L["ed"] = [get(m + f"experts.{e}.down_proj.weight", (H, I)) for e in range(E)]
                    if c.shared_expert_intermediate_size > 0:
                        S = c.shared_expert_intermediate_size
                        L["sg"] = get(m + "shared_expert.gate_proj.weight", (S, H))
                        L["su"] = get(m + "shared_expert.up_proj.weight", (S, H))
                        L["sd"] = get(m + "shared_expert.down_proj.weight", (H, S))
                        L["sgate"] = get(m + "shared_expert_gate.weight", (1, H))
            else:
                L["moe"] = False
                I = c.intermediate_size
                m = p + "mlp."
                L["dg"] = get(m + "gate_proj.weight", (I, H))
                L["du"] = get(m + "up_proj.weight", (I, H))
                L["dd"] = get(m + "down_proj.weight", (H, I))
            self.layers.append(L)
        # older checkpoints store the RoPE table as a buffer; it is recomputed here
        unused = sorted(k for k in set(tensors) - used if not k.endswith("rotary_emb.inv_freq"))
        if unused:
            raise ValueError(f"checkpoint has tensors the config does not use: {unused[:5]}")

    def new_sequence(self):
        return Sequence(self.cfg.n_layers)

    # -- forward
    def forward(self, batch):
        """batch: list of (Sequence, tokens). Appends the tokens to each sequence and returns
        a list of logits arrays [len(tokens), vocab] (one row per appended token)."""
        c = self.cfg
        toks, positions, segs = flatten_batch(batch, c.vocab_size, c.max_position_embeddings,
                                              "max_position_embeddings")
        x = self.embed[np.asarray(toks)]                                      # [T, H]
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, self.dtype)
        for l, L in enumerate(self.layers):
            h = rms_norm(x, L["in_norm"], c.rms_norm_eps)
            x = x + self._attention(l, L, h, cos, sin, segs)
            h = rms_norm(x, L["post_norm"], c.rms_norm_eps)
            x = x + (self._moe(l, L, h) if L["moe"] else self._mlp(h, L["dg"], L["du"], L["dd"]))
        x = rms_norm(x, self.final_norm, c.rms_norm_eps)
        logits = x @ self.lm_head.T                                           # [T, V]
        out = []
        for seq, s, e in segs:
            seq.length += e - s
            out.append(logits[s:e])
        return out

    def _attention(self, l, L, h, cos, sin, segs):
        c = self.cfg
        T, hd = h.shape[0], c.head_dim
        q = h @ L["wq"].T
        k = h @ L["wk"].T
        v = h @ L["wv"].T
        if c.qkv_bias:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = q.reshape(T, c.n_heads, hd)
        k = k.reshape(T, c.n_kv_heads, hd)
        v = v.reshape(T, c.n_kv_heads, hd)
        if c.qk_norm:  # per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, L["q_norm"], c.rms_norm_eps)
            k = rms_norm(k, L["k_norm"], c.rms_norm_eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        out = np.zeros((T, c.n_heads, hd), dtype=self.dtype)
        rep = c.n_heads // c.n_kv_heads
        scale = 1.0 / math.sqrt(hd)
        for seq, s, e in segs:
            past = seq.length
            seq.k[l] = k[s:e] if seq.k[l] is None else np.concatenate([seq.k[l], k[s:e]])
            seq.v[l] = v[s:e] if seq.v[l] is None else np.concatenate([seq.v[l], v[s:e]])
            K, Vv = seq.k[l], seq.v[l]                                         # [ctx, n_kv, hd]
            n_new, ctx = e - s, K.shape[0]
            # causal: query i (position past+i) sees keys 0..past+i
            mask = np.arange(ctx)[None, :] > (past + np.arange(n_new))[:, None]  # [n_new, ctx]
            for hh in range(c.n_heads):
                g = hh // rep  # HF repeat_kv: query head hh uses kv head hh // n_rep
                sc = (q[s:e, hh, :] @ K[:, g, :].T) * scale                    # [n_new, ctx]
                sc = np.where(mask, -np.inf, sc)
                out[s:e, hh, :] = softmax(sc) @ Vv[:, g, :]
        o = out.reshape(T, c.n_heads * hd) @ L["wo"].T
        if c.o_bias:
            o = o + L["bo"]
        return o

    @staticmethod
    def _mlp(h, wg, wu, wd):
        return (silu(h @ wg.T) * (h @ wu.T)) @ wd.T

    def _moe(self, l, L, h):
        c = self.cfg
        T = h.shape[0]
        rl = h @ L["router"].T                                                # [T, E]
        probs = softmax(rl)                                                   # softmax over ALL experts
        order = np.argsort(-rl, axis=-1, kind="stable")
        top = order[:, :c.top_k]                                              # [T, k]
        w = np.take_along_axis(probs, top, axis=-1)                           # [T, k]
        if c.norm_topk_prob:
            w = w / np.sum(w, axis=-1, keepdims=True)
        self.stats.observe(rl, order, c.top_k)
        out = np.zeros_like(h)
        for e in range(c.n_experts):
            rows, slot = np.nonzero(top == e)
            if rows.size == 0:
                continue
            y = self._mlp(h[rows], L["eg"][e], L["eu"][e], L["ed"][e])
            out[rows] += w[rows, slot][:, None] * y
        if "sg" in L:
            g = 1.0 / (1.0 + np.exp(-(h @ L["sgate"].T)))                       # [T, 1]
            out = out + g * self._mlp(h, L["sg"], L["su"], L["sd"])
        return out


class RoutingStats:
    """Smallest gap between the k-th and (k+1)-th router logit seen: a near tie there could
    make a float32 engine route a token to a different expert than the f64 reference."""

    def __init__(self):
        self.min_gap = math.inf
        self.decisions = 0

    def observe(self, router_logits, order, k):
        if k >= router_logits.shape[1]:
            self.decisions += router_logits.shape[0]
            return
        a = np.take_along_axis(router_logits, order[:, k - 1:k], axis=-1)
        b = np.take_along_axis(router_logits, order[:, k:k + 1], axis=-1)
        if a.size:
            self.min_gap = min(self.min_gap, float(np.min(a - b)))
        self.decisions += router_logits.shape[0]


# ----------------------------------------------------------------------------- generation

def top2_gap(row):
    s = np.sort(row)
    return float(s[-1] - s[-2])


def greedy(model, prompts, max_new_tokens, batched=True, forced=None):
    """Greedy continuation of every prompt (independently: no padding, own positions).

    Returns (rows, tokens): rows is a list per sequence of logits rows in dump order —
    one row per prompt position, then one per generated step t = 1..max_new_tokens-1
    (the row obtained after feeding generated token t-1; the last generated token is never
    fed) — and tokens is a list per sequence of the max_new_tokens generated ids.
    With `forced` (a list per sequence of token lists), those tokens are fed instead of the
    argmax (teacher forcing), e.g. to follow another engine's choices.
    batched=False runs each sequence alone (same math; used to check batch independence).
    """
    if not batched:
        rows, toks = [], []
        for i, p in enumerate(prompts):
            r, t = greedy(model, [p], max_new_tokens, True, None if forced is None else [forced[i]])
            rows += r
            toks += t
        return rows, toks
    seqs = [model.new_sequence() for _ in prompts]
    rows = [[] for _ in prompts]
    toks = [[] for _ in prompts]
    outs = model.forward([(s, p) for s, p in zip(seqs, prompts)])
    for i, o in enumerate(outs):
        rows[i] += list(o)
    for t in range(max_new_tokens):
        nxt = []
        for i in range(len(prompts)):
            tok = int(np.argmax(rows[i][-1])) if forced is None else int(forced[i][t])
            toks[i].append(tok)
            nxt.append(tok)
        if t == max_new_tokens - 1:
            break
        outs = model.forward([(s, [tok]) for s, tok in zip(seqs, nxt)])
        for i, o in enumerate(outs):
            rows[i] += list(o)
    return rows, toks


def row_table(prompts, max_new_tokens):
    """[(seq_index, position, kind)] for each dumped row, in dump order."""
    out = []
    for i, p in enumerate(prompts):
        for pos in range(len(p) + max_new_tokens - 1):
            out.append((i, pos, "prompt" if pos < len(p) else "gen"))
    return out
