"""Independent reference of DeepSeek-V2 / V3 / Kimi-K2 (MLA attention) and Step-3 text (MFA
attention), in numpy float64 (or float32, to estimate what an f32 engine deviates by).

Written from the model semantics collected in docs/MODELS.md (sections A-C), not from
any model code and not from afd's C++ code. Same contract as hf_moe_ref.Model: no padding,
every sequence at its own positions 0..L-1 with its own cache; a batch is a list of
(Sequence, new tokens) flattened into one [n_tokens, hidden] matrix; hf_moe_ref.greedy drives
generation.

FP8 block-quantized weights (F8_E4M3 + float32 weight_scale_inv) are dequantized once at load
with fp8_e4m3.dequantize; the forward pass then sees only float64 weights.

MLA is computed in both forms from the same cache (per token: the normalised latent c_n and
the rotated rope key k_pe): "naive" (B3: expand c_n through kv_b into per-head k_nope and v)
and "absorbed" (B4: fold W_UK into the query and W_UV after the attention). With
mla_form="both" (default) both run and must agree; the naive result is returned.
"""

import json
import math
import os

import numpy as np

import fp8_e4m3
import safetensors_io as st
from ref_common import checked_tensor, flatten_batch, load_embed_norm_head, rms_norm, sigmoid, silu, softmax

DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")
STEP3_TYPES = ("step3_text", "step3_vl")
VISION_PREFIXES = ("vision_model.", "vit_downsampler", "vit_large_projector.")


def is_supported(d):
    return d.get("model_type") in DEEPSEEK_TYPES + STEP3_TYPES


# ----------------------------------------------------------------------------- config

class Config:
    """The config.json fields the forward pass uses. Errors name the field."""

    def __init__(self, d):
        self.raw = d
        mt = d.get("model_type")
        self.wrapper = None
        if mt == "step3_vl":
            t = d.get("text_config")
            if not isinstance(t, dict):
                raise ValueError("config.json: model_type step3_vl needs a text_config object")
            if t.get("model_type", "step3_text") != "step3_text":
                raise ValueError(f"config.json: text_config.model_type {t.get('model_type')!r} is not step3_text")
            self.wrapper = "step3_vl"
            qc = d.get("quantization_config", t.get("quantization_config"))
            where = "text_config."
        elif mt in ("step3_text",) + DEEPSEEK_TYPES:
            t = d
            qc = d.get("quantization_config")
            where = ""
        else:
            raise ValueError(f"config.json: unsupported model_type {mt!r}")
        self.model_type = mt
        self.family = "step3" if mt in STEP3_TYPES else "deepseek"
        self.t = t

        def req(k):
            if k not in t or t[k] is None:
                raise ValueError(f"config.json: missing field {where}{k}")
            return t[k]

        def opt(k, default):
            v = t.get(k)
            return default if v is None else v

        self.vocab_size = int(req("vocab_size"))
        self.hidden_size = int(req("hidden_size"))
        self.n_layers = int(req("num_hidden_layers"))
        self.n_heads = int(req("num_attention_heads"))
        self.rms_norm_eps = float(opt("rms_norm_eps", 1e-5 if self.family == "step3" else 1e-6))
        self.tie_word_embeddings = bool(opt("tie_word_embeddings", False))
        if opt("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: {where}hidden_act {t.get('hidden_act')!r} not supported (silu only)")
        self.fp8_block = self._parse_quant(qc)
        if self.family == "step3":
            self._parse_step3(req, opt)
        else:
            self._parse_deepseek(req, opt)

    @staticmethod
    def _parse_quant(qc):
        if qc is None:
            return None
        if not isinstance(qc, dict) or qc.get("quant_method") != "fp8":
            raise ValueError(f"config.json: quantization_config.quant_method {qc.get('quant_method')!r} "
                             "is not supported (fp8 only)")
        if qc.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"config.json: quantization_config.fmt {qc.get('fmt')!r} is not e4m3")
        bs = qc.get("weight_block_size")
        if not (isinstance(bs, list) and len(bs) == 2 and all(isinstance(x, int) and x > 0 for x in bs)):
            raise ValueError("config.json: quantization_config.weight_block_size must be two positive integers")
        return (bs[0], bs[1])

    def _parse_step3(self, req, opt):
        self.max_positions = int(opt("max_position_embedding", opt("max_position_embeddings", opt("max_seq_len", 0))))
        if int(opt("num_attention_groups", 1)) != 1:
            raise ValueError("config.json: num_attention_groups must be 1 (one shared K/V head)")
        self.head_dim = int(req("head_dim"))
        self.share_q_dim = int(req("share_q_dim"))
        self.intermediate_size = int(req("intermediate_size"))
        self.n_experts = int(req("moe_num_experts"))
        self.top_k = int(req("moe_top_k"))
        self.moe_intermediate_size = int(req("moe_intermediate_size"))
        self.shared_inter = int(req("share_expert_dim"))
        self.norm_topk_prob = bool(opt("norm_expert_weight", False))
        self.rope_theta = float(opt("rope_theta", 500000.0))
        rs = self.t.get("rope_scaling")
        if rs not in (None, {}) and not (isinstance(rs, dict) and rs.get("rope_type", rs.get("type")) == "default"):
            raise ValueError("config.json: rope_scaling is not supported for step3_text (expected null)")
        enum = self.t.get("moe_layers_enum")
        if enum is None:
            self.moe_layers = set(range(1, self.n_layers))  # vLLM / SGLang default: only layer 0 dense
        else:
            try:
                items = enum.strip().split(",") if isinstance(enum, str) else list(enum)
                self.moe_layers = {int(x) for x in items}
            except (ValueError, TypeError) as e:
                raise ValueError(f"config.json: moe_layers_enum {enum!r} is not a comma-separated list of "
                                 "layer indices") from e
            bad = sorted(x for x in self.moe_layers if not 0 <= x < self.n_layers)
            if bad:
                raise ValueError(f"config.json: moe_layers_enum lists layers {bad} outside [0, {self.n_layers})")
        if self.head_dim % 2:
            raise ValueError("config.json: head_dim must be even for RoPE")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError("config.json: moe_top_k outside [1, moe_num_experts]")
        self.n_mtp = 0

    def _parse_deepseek(self, req, opt):
        mt = self.model_type
        v2 = mt == "deepseek_v2"
        self.max_positions = int(opt("max_position_embeddings", 0))
        ql = self.t.get("q_lora_rank")
        self.q_lora_rank = None if ql is None else int(ql)
        self.kv_lora_rank = int(req("kv_lora_rank"))
        self.qk_nope = int(req("qk_nope_head_dim"))
        self.qk_rope = int(req("qk_rope_head_dim"))
        self.v_head_dim = int(req("v_head_dim"))
        self.intermediate_size = int(req("intermediate_size"))
        ne = self.t.get("n_routed_experts")
        self.n_experts = 0 if ne is None else int(ne)
        if self.n_experts:
            self.top_k = int(req("num_experts_per_tok"))
            self.moe_intermediate_size = int(req("moe_intermediate_size"))
        else:
            self.top_k = 0
            self.moe_intermediate_size = 0
        ns = self.t.get("n_shared_experts")
        self.shared_inter = (int(ns) if ns else 0) * self.moe_intermediate_size
        self.first_k_dense = int(opt("first_k_dense_replace", 0))
        self.moe_layer_freq = int(opt("moe_layer_freq", 1))
        if self.moe_layer_freq < 1:
            raise ValueError("config.json: moe_layer_freq must be >= 1")
        # Defaults follow transformers' DeepseekV2Config / DeepseekV3Config.
        self.scoring_func = opt("scoring_func", "softmax" if v2 else "sigmoid")
        self.topk_method = opt("topk_method", "greedy" if v2 else "noaux_tc")
        self.norm_topk_prob = bool(opt("norm_topk_prob", not v2))
        self.routed_scaling_factor = float(opt("routed_scaling_factor", 1.0 if v2 else 2.5))
        self.n_group = int(opt("n_group", 1))
        self.topk_group = int(opt("topk_group", 1))
        if self.scoring_func not in ("sigmoid", "softmax"):
            raise ValueError(f"config.json: scoring_func {self.scoring_func!r} not supported (sigmoid, softmax)")
        if self.topk_method not in ("noaux_tc", "group_limited_greedy", "greedy"):
            raise ValueError(f"config.json: topk_method {self.topk_method!r} not supported "
                             "(noaux_tc, group_limited_greedy, greedy)")
        if self.n_experts:
            if self.n_group < 1 or self.n_experts % self.n_group:
                raise ValueError("config.json: n_routed_experts is not a multiple of n_group")
            if not 1 <= self.topk_group <= self.n_group:
                raise ValueError("config.json: topk_group outside [1, n_group]")
            if self.topk_method == "noaux_tc" and self.n_experts // self.n_group < 2:
                raise ValueError("config.json: noaux_tc needs at least 2 experts per group")
            if not 1 <= self.top_k <= self.n_experts:
                raise ValueError("config.json: num_experts_per_tok outside [1, n_routed_experts]")
            grouped = self.topk_method != "greedy"
            if grouped and self.top_k > self.topk_group * self.n_experts // self.n_group:
                raise ValueError("config.json: num_experts_per_tok exceeds the experts of topk_group groups")
        self.n_mtp = int(opt("num_nextn_predict_layers", 0))
        self.rope_interleave = bool(opt("rope_interleave", True))
        if self.qk_rope % 2:
            raise ValueError("config.json: qk_rope_head_dim must be even")
        self.rope = RopeParams.deepseek(self.t, self.qk_rope, self.qk_nope + self.qk_rope)

    def is_moe_layer(self, layer):
        if self.family == "step3":
            return layer in self.moe_layers
        return (self.n_experts > 0 and layer >= self.first_k_dense and layer % self.moe_layer_freq == 0)

    @staticmethod
    def from_dir(model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return Config(json.load(f))


# ----------------------------------------------------------------------------- rope / yarn

def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_dim(dim, base, orig_max, rotations):
    """The rotary pair index whose wavelength makes `rotations` turns over orig_max tokens."""
    return dim * math.log(orig_max / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_low_high(dim, base, orig_max, beta_fast, beta_slow):
    low = max(math.floor(yarn_correction_dim(dim, base, orig_max, beta_fast)), 0)
    high = min(math.ceil(yarn_correction_dim(dim, base, orig_max, beta_slow)), dim - 1)
    return low, high


def yarn_ramp(n, low, high):
    """[n]: 0 up to pair `low`, 1 from pair `high`, linear between (high + 0.001 if equal)."""
    hi = high + 0.001 if low == high else high
    return np.clip((np.arange(n, dtype=np.float64) - low) / (hi - low), 0.0, 1.0)


def yarn_inv_freq(dim, base, factor, orig_max, beta_fast, beta_slow):
    """YaRN inverse frequencies for `dim` rotary dims (dim/2 pairs): pairs up to `low` keep
    base^(-2i/dim), pairs from `high` on are divided by factor, linear blend between."""
    f_ext = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    f_int = f_ext / factor
    low, high = yarn_low_high(dim, base, orig_max, beta_fast, beta_slow)
    keep = 1.0 - yarn_ramp(dim // 2, low, high)
    return f_int * (1.0 - keep) + f_ext * keep


class RopeParams:
    """inv_freq [dim/2], cos/sin magnitude factor, softmax scale."""

    def __init__(self, inv_freq, attn_factor, softmax_scale, low=None, high=None):
        self.inv_freq = inv_freq
        self.attn_factor = attn_factor
        self.softmax_scale = softmax_scale
        self.low, self.high = low, high

    @staticmethod
    def deepseek(t, rope_dim, qk_head_dim):
        base = float(t.get("rope_theta") if t.get("rope_theta") is not None else 10000.0)
        scale = qk_head_dim ** -0.5
        rs = t.get("rope_scaling")
        kind = None if not rs else rs.get("rope_type", rs.get("type"))
        if kind in (None, "default"):
            return RopeParams(base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim), 1.0, scale)
        if kind != "yarn":
            raise ValueError(f"config.json: rope_scaling type {kind!r} not supported (yarn only)")
        for k in ("factor", "original_max_position_embeddings"):
            if rs.get(k) is None:
                raise ValueError(f"config.json: rope_scaling.{k} missing")
        factor = float(rs["factor"])
        orig = float(rs["original_max_position_embeddings"])
        bf = float(rs.get("beta_fast", 32))
        bsl = float(rs.get("beta_slow", 1))
        ms = float(rs.get("mscale", 1) or 0)
        msad = float(rs.get("mscale_all_dim", 0) or 0)
        inv = yarn_inv_freq(rope_dim, base, factor, orig, bf, bsl)
        attn = yarn_get_mscale(factor, ms) / yarn_get_mscale(factor, msad)
        if msad:
            m = yarn_get_mscale(factor, msad)
            scale = scale * m * m
        low, high = yarn_low_high(rope_dim, base, orig, bf, bsl)
        return RopeParams(inv, attn, scale, low, high)


def rope_interleaved(x, positions, inv_freq, factor=1.0):
    """GPT-J pairs (2i, 2i+1) of the last dim rotated by pos*inv_freq[i]; cos and sin scaled
    by `factor`. x [T, ..., d], positions [T]."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]     # [T, d/2]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (inv_freq.size,)
    c = (np.cos(ang) * factor).reshape(shape).astype(x.dtype)
    s = (np.sin(ang) * factor).reshape(shape).astype(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x1 * c + x0 * s
    return out


def rope_neox(x, positions, inv_freq, factor=1.0):
    """Rotate-half pairs (i, i + d/2) of the last dim rotated by pos*inv_freq[i]."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (inv_freq.size,)
    c = (np.cos(ang) * factor).reshape(shape).astype(x.dtype)
    s = (np.sin(ang) * factor).reshape(shape).astype(x.dtype)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


# ----------------------------------------------------------------------------- math

def mlp(h, wg, wu, wd):
    return (silu(h @ wg.T) * (h @ wu.T)) @ wd.T


def causal_softmax(scores, past):
    """scores [n_new, ctx] of queries at positions past..past+n_new-1 -> probabilities with the
    keys after each query masked out."""
    n_new, ctx = scores.shape
    mask = np.arange(ctx)[None, :] > (past + np.arange(n_new))[:, None]
    return softmax(np.where(mask, -np.inf, scores))


# ----------------------------------------------------------------------------- routing

class Route:
    """One routing call: idx [T, k] expert ids, weights [T, k], and per-row diagnostics:
    select_gap (k-th minus (k+1)-th of the scores the choice compares, inf if nothing is left
    to choose from), group_gap (topk_group-th minus next group score, inf without groups),
    bias_changed (the correction bias changed the chosen set), mask_excluded (plain top-k of
    the choice scores, without the group mask, picks an expert of a dropped group)."""

    def __init__(self, idx, weights, select_gap, group_gap, bias_changed, mask_excluded):
        self.idx, self.weights = idx, weights
        self.select_gap, self.group_gap = select_gap, group_gap
        self.bias_changed, self.mask_excluded = bias_changed, mask_excluded


def _topk_gap(values, k):
    """-> (indices of the k largest (stable: lower index first on ties), gap k-th - (k+1)-th)."""
    order = np.argsort(-values, axis=-1, kind="stable")
    idx = order[:, :k]
    if k >= values.shape[-1]:
        return idx, np.full(values.shape[0], np.inf)
    a = np.take_along_axis(values, order[:, k - 1:k], axis=-1)[:, 0]
    b = np.take_along_axis(values, order[:, k:k + 1], axis=-1)[:, 0]
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isneginf(b), np.inf, a - b)
    return idx, gap


def _group_select(choice, n_group, topk_group, top_k, group_score):
    """Group-limited top-k: keep the topk_group groups with the largest group_score(choice
    viewed [T, n_group, E/n_group]); every expert of the other groups gets -inf."""
    T, E = choice.shape
    g = choice.reshape(T, n_group, E // n_group)
    gs = group_score(g)                                                   # [T, n_group]
    kept, ggap = _topk_gap(gs, topk_group)
    keep = np.zeros((T, n_group), dtype=bool)
    np.put_along_axis(keep, kept, True, axis=-1)
    keep_e = np.repeat(keep, E // n_group, axis=-1)
    masked = np.where(keep_e, choice, -np.inf)
    idx, sgap = _topk_gap(masked, top_k)
    plain, _ = _topk_gap(choice, top_k)
    excluded = ~np.all(np.take_along_axis(keep_e, plain, axis=-1), axis=-1)
    return idx, sgap, ggap, excluded


def _top2_sum(g):
    s = np.sort(g, axis=-1)
    return s[..., -1] + s[..., -2]


def route_deepseek(logits, scoring, method, top_k, n_group, topk_group, norm, scale, bias=None):
    """DeepSeek router on router logits [T, E] (MODELS.md B5, B8).
    scores s = sigmoid or softmax(logits). noaux_tc: choice = s + bias, groups scored by the sum
    of their two largest choice values; group_limited_greedy: choice = s, groups scored by
    their max; greedy: plain top-k of s. Weights are the unbiased s of the chosen experts,
    divided by their sum if norm, times scale."""
    s = sigmoid(logits) if scoring == "sigmoid" else softmax(logits)
    T = s.shape[0]
    if method == "noaux_tc":
        if bias is None:
            raise ValueError("noaux_tc routing needs e_score_correction_bias")
        choice = s + bias[None, :]
    elif bias is not None:
        raise ValueError(f"a correction bias is only used with noaux_tc, not {method}")
    else:
        choice = s
    if method == "greedy":
        idx, sgap = _topk_gap(choice, top_k)
        ggap, excluded = np.full(T, np.inf), np.zeros(T, dtype=bool)
    else:
        gscore = _top2_sum if method == "noaux_tc" else (lambda g: np.max(g, axis=-1))
        idx, sgap, ggap, excluded = _group_select(choice, n_group, topk_group, top_k, gscore)
    if method == "noaux_tc":
        unb, _, _, _ = _group_select(s, n_group, topk_group, top_k, _top2_sum)
        changed = np.array([set(a) != set(b) for a, b in zip(idx.tolist(), unb.tolist())], dtype=bool)
    else:
        changed = np.zeros(T, dtype=bool)
    w = np.take_along_axis(s, idx, axis=-1)
    if norm:
        w = w / np.sum(w, axis=-1, keepdims=True)
    w = w * scale
    return Route(idx, w, sgap, ggap, changed, excluded)


def route_step3(logits, top_k, norm):
    """Step-3 router (A4): softmax over all experts, top-k of the probabilities, weights are the
    probabilities (renormalised to sum 1 only with norm_expert_weight)."""
    p = softmax(logits)
    idx, sgap = _topk_gap(p, top_k)
    w = np.take_along_axis(p, idx, axis=-1)
    if norm:
        w = w / np.sum(w, axis=-1, keepdims=True)
    T = p.shape[0]
    return Route(idx, w, sgap, np.full(T, np.inf), np.zeros(T, dtype=bool), np.zeros(T, dtype=bool))


class RouterStats:
    """Over every routing decision since construction: the smallest selection and group gaps,
    how many decisions the correction bias changed, how many the group mask changed, and the
    largest disagreement seen between the two MLA forms."""

    def __init__(self):
        self.min_select_gap = math.inf
        self.min_group_gap = math.inf
        self.decisions = 0
        self.bias_changed = 0
        self.mask_excluded = 0
        self.mla_form_max_diff = 0.0

    def observe(self, r):
        if r.idx.shape[0]:
            self.min_select_gap = min(self.min_select_gap, float(np.min(r.select_gap)))
            self.min_group_gap = min(self.min_group_gap, float(np.min(r.group_gap)))
        self.decisions += r.idx.shape[0]
        self.bias_changed += int(np.sum(r.bias_changed))
        self.mask_excluded += int(np.sum(r.mask_excluded))


# ----------------------------------------------------------------------------- model

class Sequence:
    """Per-sequence state: tokens seen and per-layer caches (MLA: c_n [len, kv_lora_rank] and
    k_pe [len, qk_rope_head_dim], rotated; MFA: k, v [len, head_dim])."""

    def __init__(self, n_layers):
        self.length = 0
        self.cache = [dict() for _ in range(n_layers)]

    def truncate(self, n):
        """Drops positions >= n from every cache (no-op when n >= length): the roll-back of
        positions computed speculatively."""
        if n >= self.length:
            return
        n = max(n, 0)
        for cache in self.cache:
            for k in cache:
                cache[k] = cache[k][:n]
        self.length = n


class Model:
    def __init__(self, cfg, tensors, dtype=np.float64, mla_form="both", load_mtp=False):
        """cfg: Config; tensors: {name: st.Tensor} in Hugging Face naming. load_mtp: also read
        (and shape-check) the MTP module's tensors into self.mtp."""
        if mla_form not in ("both", "naive", "absorbed"):
            raise ValueError(f"mla_form {mla_form!r}")
        self.cfg = cfg
        self.dtype = dtype
        self.mla_form = mla_form
        self.stats = RouterStats()
        self.trace = None            # set to a list to collect (layer, name, array) stages
        self.mtp = None
        self._load(tensors, load_mtp)

    @staticmethod
    def from_dir(model_dir, dtype=np.float64, mla_form="both", load_mtp=False):
        return Model(Config.from_dir(model_dir), st.load_dir(model_dir), dtype, mla_form, load_mtp)

    # -- weights
    def _load(self, tensors, load_mtp):
        c = self.cfg
        used = set()
        dt = self.dtype

        def tensor(name, shape):
            return checked_tensor(tensors, used, name, shape)

        def plain(name, shape):
            """A tensor the format never quantizes (embeddings, norms, router, bias)."""
            t = tensor(name, shape)
            if t.dtype == "F8_E4M3":
                raise ValueError(f"tensor {name}: F8_E4M3 where the format keeps bf16/f32")
            return t.to_f64().astype(dt)

        def linear(name, shape):
            """A Linear weight [out, in] (or stacked [E, out, in]); FP8 with its scale partner."""
            t = tensor(name, shape)
            sname = name + "_scale_inv"
            if t.dtype != "F8_E4M3":
                if sname in tensors:
                    raise ValueError(f"tensor {sname}: scale for a weight stored as {t.dtype}, not F8_E4M3")
                return t.to_f64().astype(dt)
            if c.fp8_block is None:
                raise ValueError(f"tensor {name} is F8_E4M3 but config.json has no fp8 quantization_config")
            if sname not in tensors:
                raise ValueError(f"tensor {name} is F8_E4M3 but its scale {sname} is missing")
            s = tensors[sname]
            if s.dtype != "F32":
                raise ValueError(f"tensor {sname}: dtype {s.dtype}, expected F32")
            want = fp8_e4m3.scale_shape(shape, c.fp8_block)
            if tuple(s.shape) != want:
                raise ValueError(f"tensor {sname}: shape {list(s.shape)}, expected {list(want)} for weight "
                                 f"{list(shape)} with blocks {list(c.fp8_block)}")
            used.add(sname)
            return fp8_e4m3.dequantize(t.raw, s.raw, c.fp8_block).astype(dt)

        self._plain, self._linear = plain, linear
        self._has = tensors.__contains__
        self.embed, self.final_norm, self.lm_head = load_embed_norm_head(plain, c, used)
        self.layers = [self._load_layer(l) for l in range(c.n_layers)]
        if load_mtp:
            if c.n_mtp < 1:
                raise ValueError("config.json: num_nextn_predict_layers is 0, there is no MTP module")
            self.mtp = self._load_mtp(c.n_layers)

        def ignored(k):
            if k.endswith("rotary_emb.inv_freq"):
                return True
            if c.wrapper == "step3_vl" and k.startswith(VISION_PREFIXES):
                return True        # the vision tower: a text-only forward never reads it
            if c.n_mtp and k.startswith("model.layers."):
                n = k.split(".")[2]
                # MTP modules live at layer ids num_hidden_layers .. +num_nextn_predict_layers-1;
                # the main model never reads them
                return n.isdigit() and c.n_layers <= int(n) < c.n_layers + c.n_mtp
            return False

        unused = sorted(k for k in set(tensors) - used if not ignored(k))
        if unused:
            raise ValueError(f"checkpoint has tensors the config does not use: {unused[:5]}")

    def _load_layer(self, l):
        c = self.cfg
        plain, linear = self._plain, self._linear
        H = c.hidden_size

        def swiglu(prefix, inter):
            """(gate_proj, up_proj [inter, H], down_proj [H, inter]) under prefix."""
            return (linear(prefix + "gate_proj.weight", (inter, H)), linear(prefix + "up_proj.weight", (inter, H)),
                    linear(prefix + "down_proj.weight", (H, inter)))

        p = f"model.layers.{l}."
        L = {"in_norm": plain(p + "input_layernorm.weight", (H,)),
             "post_norm": plain(p + "post_attention_layernorm.weight", (H,))}
        a = p + "self_attn."
        if c.family == "deepseek":
            N, P, R, Vd, Lkv = c.n_heads, c.qk_nope, c.qk_rope, c.v_head_dim, c.kv_lora_rank
            if c.q_lora_rank is None:
                L["wq"] = linear(a + "q_proj.weight", (N * (P + R), H))
            else:
                L["wq_a"] = linear(a + "q_a_proj.weight", (c.q_lora_rank, H))
                L["q_a_norm"] = plain(a + "q_a_layernorm.weight", (c.q_lora_rank,))
                L["wq_b"] = linear(a + "q_b_proj.weight", (N * (P + R), c.q_lora_rank))
            L["wkv_a"] = linear(a + "kv_a_proj_with_mqa.weight", (Lkv + R, H))
            L["kv_a_norm"] = plain(a + "kv_a_layernorm.weight", (Lkv,))
            L["wkv_b"] = linear(a + "kv_b_proj.weight", (N * (P + Vd), Lkv))
            L["wo"] = linear(a + "o_proj.weight", (H, N * Vd))
            m = p + "mlp."
            if c.is_moe_layer(l):
                E, I = c.n_experts, c.moe_intermediate_size
                L["moe"] = True
                L["router"] = plain(m + "gate.weight", (E, H))
                if c.topk_method == "noaux_tc":
                    L["bias"] = plain(m + "gate.e_score_correction_bias", (E,))
                L["eg"] = [linear(m + f"experts.{e}.gate_proj.weight", (I, H)) for e in range(E)]
                L["eu"] = [linear(m + f"experts.{e}.up_proj.weight", (I, H)) for e in range(E)]
                L["ed"] = [linear(m + f"experts.{e}.down_proj.weight", (H, I)) for e in range(E)]
                if c.shared_inter:
                    S = c.shared_inter
                    L["sg"], L["su"], L["sd"] = swiglu(m + "shared_experts.", S)
            else:
                L["moe"] = False
                I = c.intermediate_size
                L["dg"], L["du"], L["dd"] = swiglu(m, I)
        else:
            N, hd, Dq = c.n_heads, c.head_dim, c.share_q_dim
            L["wq"] = linear(a + "q_proj.weight", (Dq, H))
            L["wk"] = linear(a + "k_proj.weight", (hd, H))
            L["wv"] = linear(a + "v_proj.weight", (hd, H))
            L["inter_norm"] = plain(a + "inter_norm.weight", (Dq,))
            L["wq_b"] = linear(a + "wq.weight", (N * hd, Dq))
            L["wo"] = linear(a + "o_proj.weight", (H, N * hd))
            if c.is_moe_layer(l):
                E, I, S = c.n_experts, c.moe_intermediate_size, c.shared_inter
                L["moe"] = True
                L["router"] = plain(p + "moe.gate.weight", (E, H))
                gate = linear(p + "moe.gate_proj.weight", (E, I, H))     # stacked [E, out, in]
                up = linear(p + "moe.up_proj.weight", (E, I, H))
                down = linear(p + "moe.down_proj.weight", (E, H, I))
                L["eg"], L["eu"], L["ed"] = list(gate), list(up), list(down)
                L["sg"], L["su"], L["sd"] = swiglu(p + "share_expert.", S)
            else:
                L["moe"] = False
                I = c.intermediate_size
                L["dg"], L["du"], L["dd"] = swiglu(p + "mlp.", I)
        return L

    def _load_mtp(self, l):
        """The MTP module at layer id l (MODELS.md B7): its own norms, eh_proj, decoder layer and
        shared head; run by mtp_forward. embed_tokens / shared_head.head are the module's when
        the checkpoint has them (DeepSeek-V3 stores copies of the main model's), else the main
        model's embedding / LM head, each on its own."""
        c = self.cfg
        H, V = c.hidden_size, c.vocab_size
        p = f"model.layers.{l}."
        M = self._load_layer(l)
        M["enorm"] = self._plain(p + "enorm.weight", (H,))
        M["hnorm"] = self._plain(p + "hnorm.weight", (H,))
        M["eh_proj"] = self._plain(p + "eh_proj.weight", (H, 2 * H))
        M["head_norm"] = self._plain(p + "shared_head.norm.weight", (H,))
        e, h = p + "embed_tokens.weight", p + "shared_head.head.weight"
        M["embed"] = self._plain(e, (V, H)) if self._has(e) else self.embed
        M["head"] = self._plain(h, (V, H)) if self._has(h) else self.lm_head
        return M

    def new_sequence(self):
        return Sequence(self.cfg.n_layers)

    def new_mtp_sequence(self):
        """The MTP module's own cache for one sequence (its layer id is n_layers)."""
        return Sequence(self.cfg.n_layers + 1)

    def mtp_forward(self, seq, hidden, next_tokens, return_block=False):
        """MODELS.md B7, one MTP module: hidden [n, H] the main model's final-normed states at
        positions seq.length .. seq.length+n-1 of one sequence (forward(..., return_hidden=True)),
        next_tokens [n] the tokens at the following positions. u = eh_proj([enorm(Emb(t[i+1]));
        hnorm(h[i])]) runs through the module's decoder layer at position i (seq: a
        new_mtp_sequence, its cache appended); -> logits [n, vocab] predicting t[i+2]. With
        return_block also z [n, H], the decoder layer's output (the residual stream before
        shared_head.norm): the hidden input of the module's next step when it drafts
        recursively (mtp_draft_ref.py)."""
        if self.mtp is None:
            raise ValueError("the model was loaded without its MTP module (load_mtp=True)")
        c, M = self.cfg, self.mtp
        n = len(next_tokens)
        e = M["embed"][np.asarray(next_tokens)]
        u = np.concatenate([rms_norm(e, M["enorm"], c.rms_norm_eps), rms_norm(hidden, M["hnorm"], c.rms_norm_eps)],
                           axis=-1) @ M["eh_proj"].T
        positions = np.arange(seq.length, seq.length + n)
        z = self._layer(c.n_layers, M, u, positions, [(seq, 0, n)])
        seq.length += n
        logits = rms_norm(z, M["head_norm"], c.rms_norm_eps) @ M["head"].T
        return (logits, z) if return_block else logits

    def _record(self, layer, name, x):
        if self.trace is not None:
            self.trace.append((layer, name, np.array(x)))

    # -- forward
    def _prepare(self, batch):
        c = self.cfg
        toks, positions, segs = flatten_batch(batch, c.vocab_size, c.max_positions, "the maximum position")
        return toks, np.asarray(positions), segs

    def forward(self, batch, return_hidden=False):
        """batch: list of (Sequence, tokens). Appends the tokens to each sequence and returns a
        list of logits arrays [len(tokens), vocab] (one row per appended token); with
        return_hidden also the list of final-normed hidden states [len(tokens), hidden]."""
        c = self.cfg
        toks, positions, segs = self._prepare(batch)
        x = self.embed[np.asarray(toks)]
        for l, L in enumerate(self.layers):
            x = self._layer(l, L, x, positions, segs)
        h = rms_norm(x, self.final_norm, c.rms_norm_eps)
        self._record(None, "final_hidden", h)
        logits = h @ self.lm_head.T
        out, hid = [], []
        for seq, s, e in segs:
            seq.length += e - s
            out.append(logits[s:e])
            hid.append(h[s:e])
        return (out, hid) if return_hidden else out

    def _layer(self, l, L, x, positions, segs):
        c = self.cfg
        h = rms_norm(x, L["in_norm"], c.rms_norm_eps)
        attn = self._mla if c.family == "deepseek" else self._mfa
        x = x + attn(l, L, h, positions, segs)
        self._record(l, "after_attention", x)
        h = rms_norm(x, L["post_norm"], c.rms_norm_eps)
        x = x + (self._moe(l, L, h) if L["moe"] else mlp(h, L["dg"], L["du"], L["dd"]))
        self._record(l, "after_ffn", x)
        return x

    def _mla(self, l, L, h, positions, segs):
        """MLA (MODELS.md B3/B4). h [T, H] -> [T, H]; appends c_n and rotated k_pe to the caches."""
        c = self.cfg
        T = h.shape[0]
        N, P, R, Vd, Lkv = c.n_heads, c.qk_nope, c.qk_rope, c.v_head_dim, c.kv_lora_rank
        rp = c.rope
        if "wq" in L:
            q = h @ L["wq"].T
        else:
            q = rms_norm(h @ L["wq_a"].T, L["q_a_norm"], c.rms_norm_eps) @ L["wq_b"].T
        q = q.reshape(T, N, P + R)
        q_nope, q_pe = q[..., :P], q[..., P:]
        a = h @ L["wkv_a"].T
        c_n = rms_norm(a[:, :Lkv], L["kv_a_norm"], c.rms_norm_eps)
        rope = rope_interleaved if c.rope_interleave else rope_neox
        q_pe = rope(q_pe, positions, rp.inv_freq, rp.attn_factor)
        k_pe = rope(a[:, Lkv:], positions, rp.inv_freq, rp.attn_factor)
        self._record(l, "mla_c_n", c_n)
        self._record(l, "mla_k_pe_rot", k_pe)
        wkv_b = L["wkv_b"].reshape(N, P + Vd, Lkv)
        w_uk, w_uv = wkv_b[:, :P, :], wkv_b[:, P:, :]                    # [N, P, Lkv], [N, V, Lkv]
        scale = rp.softmax_scale
        out = np.zeros((T, N, Vd), dtype=self.dtype)
        for seq, s, e in segs:
            cache = seq.cache[l]
            past = seq.length
            cache["c_n"] = c_n[s:e] if past == 0 else np.concatenate([cache["c_n"], c_n[s:e]])
            cache["k_pe"] = k_pe[s:e] if past == 0 else np.concatenate([cache["k_pe"], k_pe[s:e]])
            C, KP = cache["c_n"], cache["k_pe"]                            # [ctx, Lkv], [ctx, R]
            naive = absorbed = None
            if self.mla_form in ("naive", "both"):
                kv = (C @ L["wkv_b"].T).reshape(-1, N, P + Vd)            # [ctx, N, P+V]
                k_nope, v = kv[..., :P], kv[..., P:]
                naive = np.empty((e - s, N, Vd), dtype=self.dtype)
                for hh in range(N):
                    sc = (q_nope[s:e, hh] @ k_nope[:, hh].T + q_pe[s:e, hh] @ KP.T) * scale
                    naive[:, hh] = causal_softmax(sc, past) @ v[:, hh]
            if self.mla_form in ("absorbed", "both"):
                absorbed = np.empty((e - s, N, Vd), dtype=self.dtype)
                for hh in range(N):
                    q_lat = q_nope[s:e, hh] @ w_uk[hh]                        # [n, Lkv]
                    sc = (q_lat @ C.T + q_pe[s:e, hh] @ KP.T) * scale
                    o_lat = causal_softmax(sc, past) @ C                     # [n, Lkv]
                    absorbed[:, hh] = o_lat @ w_uv[hh].T                     # [n, V]
            if naive is not None and absorbed is not None:
                d = float(np.max(np.abs(naive - absorbed)))
                tol = (1e-10 if self.dtype == np.float64 else 1e-4) * (1.0 + float(np.max(np.abs(naive))))
                if not d <= tol:
                    raise AssertionError(f"layer {l}: naive and absorbed MLA differ by {d:.3e} (> {tol:.1e})")
                self.stats.mla_form_max_diff = max(self.stats.mla_form_max_diff, d)
            out[s:e] = naive if naive is not None else absorbed
        return out.reshape(T, N * Vd) @ L["wo"].T

    def _mfa(self, l, L, h, positions, segs):
        """Step-3 MFA (MODELS.md A3/A5). h [T, H] -> [T, H]; appends rotated k and v to the caches."""
        c = self.cfg
        T = h.shape[0]
        N, hd = c.n_heads, c.head_dim
        cq = rms_norm(h @ L["wq"].T, L["inter_norm"], c.rms_norm_eps)
        q = (cq @ L["wq_b"].T).reshape(T, N, hd)
        k = h @ L["wk"].T
        v = h @ L["wv"].T
        inv = c.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        q = rope_neox(q, positions, inv)
        k = rope_neox(k, positions, inv)
        out = np.zeros((T, N, hd), dtype=self.dtype)
        scale = hd ** -0.5
        for seq, s, e in segs:
            cache = seq.cache[l]
            past = seq.length
            cache["k"] = k[s:e] if past == 0 else np.concatenate([cache["k"], k[s:e]])
            cache["v"] = v[s:e] if past == 0 else np.concatenate([cache["v"], v[s:e]])
            K, Vv = cache["k"], cache["v"]
            for hh in range(N):
                out[s:e, hh] = causal_softmax((q[s:e, hh] @ K.T) * scale, past) @ Vv
        return out.reshape(T, N * hd) @ L["wo"].T

    def route(self, L, h):
        c = self.cfg
        rl = h @ L["router"].T
        if c.family == "step3":
            return route_step3(rl, c.top_k, c.norm_topk_prob)
        return route_deepseek(rl, c.scoring_func, c.topk_method, c.top_k, c.n_group, c.topk_group,
                              c.norm_topk_prob, c.routed_scaling_factor, L.get("bias"))

    def _moe(self, l, L, h):
        r = self.route(L, h)
        self.stats.observe(r)
        self._record(l, "router_idx", r.idx)
        self._record(l, "router_weights", r.weights)
        out = np.zeros_like(h)
        for e in range(self.cfg.n_experts):
            rows, slot = np.nonzero(r.idx == e)
            if rows.size:
                out[rows] += r.weights[rows, slot][:, None] * mlp(h[rows], L["eg"][e], L["eu"][e], L["ed"][e])
        if "sg" in L:
            out = out + mlp(h, L["sg"], L["su"], L["sd"])      # shared experts: always on, unweighted
        return out
