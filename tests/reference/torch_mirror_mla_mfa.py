"""A second, structurally different formulation of mla_mfa_ref.py in torch float64, used only by
the self-test: it reads the raw config.json fields itself, decodes FP8 through float32 bit
patterns and dequantizes block by block, recomputes YaRN with torch, runs a right-padded
[batch, seq] full recompute (no cache) with an additive causal mask, applies DeepSeek's
interleaved rope the Hugging Face way (de-interleave q_pe and k_pe, then rotate-half), and routes
with torch.topk / scatter / masked_fill and a one-hot expert mask with index_add_.
"""

import math

import torch
import torch.nn.functional as F


# ----------------------------------------------------------------------------- fp8

def fp8_decode(codes):
    """uint8 codes (any shape, numpy or torch) -> float64 via float32 bit patterns: a normal
    e4m3 value (e >= 1) has the f32 bits s<<31 | (e - 7 + 127)<<23 | m<<20; a subnormal is
    m * 2^-9; e = 15, m = 7 is NaN."""
    c = torch.as_tensor(codes).to(torch.int32) & 0xFF
    s = (c >> 7) & 1
    e = (c >> 3) & 0xF
    m = c & 0x7
    bits = (s << 31) | ((e + 120) << 23) | (m << 20)
    normal = bits.view(torch.float32).to(torch.float64)
    sub = m.to(torch.float64) * 2.0 ** -9 * (1 - 2 * s).to(torch.float64)
    out = torch.where(e == 0, sub, normal)
    return torch.where((e == 15) & (m == 7), torch.full_like(out, float("nan")), out)


def fp8_dequant(codes, scale_inv, block=(128, 128)):
    """Block by block: out[..., block] = decode(codes[..., block]) * scale_inv[..., bo, bi]."""
    w = fp8_decode(codes)
    s = torch.as_tensor(scale_inv).to(torch.float64)
    out = torch.empty_like(w)
    O, I = w.shape[-2:]
    for bo in range((O + block[0] - 1) // block[0]):
        for bi in range((I + block[1] - 1) // block[1]):
            r = slice(bo * block[0], min((bo + 1) * block[0], O))
            c = slice(bi * block[1], min((bi + 1) * block[1], I))
            out[..., r, c] = w[..., r, c] * s[..., bo, bi, None, None]
    return out


def fp8_block_amax(w, block=(128, 128)):
    """Block by block max |w| -> [..., bo, bi]."""
    w = torch.as_tensor(w).to(torch.float64)
    O, I = w.shape[-2:]
    nb = ((O + block[0] - 1) // block[0], (I + block[1] - 1) // block[1])
    out = torch.empty(w.shape[:-2] + nb, dtype=torch.float64)
    for bo in range(nb[0]):
        for bi in range(nb[1]):
            blk = w[..., bo * block[0]:(bo + 1) * block[0], bi * block[1]:(bi + 1) * block[1]]
            out[..., bo, bi] = blk.abs().amax(dim=(-2, -1))
    return out


# ----------------------------------------------------------------------------- routing

def route_deepseek(logits, scoring, method, top_k, n_group, topk_group, norm, scale, bias=None):
    """-> (idx [T, k] sorted ascending, weights [T, k] in the same order)."""
    logits = torch.as_tensor(logits).to(torch.float64)
    T, E = logits.shape
    scores = logits.sigmoid() if scoring == "sigmoid" else logits.softmax(dim=-1)
    choice = scores + torch.as_tensor(bias).to(torch.float64)[None] if method == "noaux_tc" else scores
    if method == "greedy":
        idx = torch.topk(choice, top_k, dim=-1).indices
    else:
        grouped = choice.view(T, n_group, E // n_group)
        if method == "noaux_tc":
            gscore = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            gscore = grouped.amax(dim=-1)
        gidx = torch.topk(gscore, topk_group, dim=-1).indices
        gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1.0)
        emask = gmask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)
        idx = torch.topk(choice.masked_fill(emask == 0, float("-inf")), top_k, dim=-1).indices
    w = scores.gather(1, idx)
    if norm:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    w = w * scale
    order = idx.argsort(dim=-1)
    return idx.gather(1, order), w.gather(1, order)


def route_step3(logits, top_k, norm):
    p = torch.as_tensor(logits).to(torch.float64).softmax(dim=-1)
    w, idx = torch.topk(p, top_k, dim=-1)
    if norm:
        w = w / w.sum(dim=-1, keepdim=True)
    order = idx.argsort(dim=-1)
    return idx.gather(1, order), w.gather(1, order)


# ----------------------------------------------------------------------------- model pieces

def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def mlp(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def deinterleave(x):
    """[..., d] with pairs (2i, 2i+1) -> [..., d] ordered (0, 2, 4, ..., 1, 3, 5, ...)."""
    *lead, d = x.shape
    return x.view(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)


def yarn(t, rope_dim, head_dim):
    """-> (inv_freq [rope_dim/2], cos/sin factor, softmax scale) from the raw config fields."""
    base = float(t.get("rope_theta") or 10000.0)
    half = torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim
    rs = t.get("rope_scaling")
    if not rs or rs.get("rope_type", rs.get("type")) == "default":
        return base ** -half, 1.0, head_dim ** -0.5
    factor = float(rs["factor"])
    L0 = float(rs["original_max_position_embeddings"])

    def corr(rot):
        return rope_dim * math.log(L0 / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(float(rs.get("beta_fast", 32)))), 0)
    high = min(math.ceil(corr(float(rs.get("beta_slow", 1)))), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrap = 1 - ramp
    pos_freqs = base ** half
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap

    def get_mscale(m):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    ms, msad = float(rs.get("mscale", 1) or 0), float(rs.get("mscale_all_dim", 0) or 0)
    scale = head_dim ** -0.5
    if msad:
        scale *= get_mscale(msad) ** 2
    return inv, get_mscale(ms) / get_mscale(msad), scale


# ----------------------------------------------------------------------------- forward

class _Weights:
    def __init__(self, tensors, block):
        self.t = tensors
        self.block = block

    def __call__(self, name):
        t = self.t[name]
        if t.dtype == "F8_E4M3":
            return fp8_dequant(t.raw, self.t[name + "_scale_inv"].raw, self.block)
        return torch.from_numpy(t.to_f64())


def forward_padded(config, tensors, sequences):
    """config: config.json dict; tensors: {name: st.Tensor}; sequences: token lists (any lengths,
    right-padded here). -> list of logits [len, vocab] (numpy) per sequence."""
    t = config["text_config"] if config["model_type"] == "step3_vl" else config
    qc = config.get("quantization_config") or t.get("quantization_config")
    W = _Weights(tensors, tuple(qc["weight_block_size"]) if qc else (128, 128))
    B, S = len(sequences), max(len(s) for s in sequences)
    ids = torch.zeros(B, S, dtype=torch.long)
    for b, s in enumerate(sequences):
        ids[b, :len(s)] = torch.tensor(s)
    pos = torch.arange(S, dtype=torch.float64)
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)   # right padding: causal suffices
    eps = float(t.get("rms_norm_eps") or (1e-5 if "share_q_dim" in t else 1e-6))
    x = W("model.embed_tokens.weight")[ids]
    step3 = "share_q_dim" in t
    for l in range(t["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, W(p + "input_layernorm.weight"), eps)
        x = x + (_mfa if step3 else _mla)(t, W, p + "self_attn.", h, pos, mask, eps)
        h = rms_norm(x, W(p + "post_attention_layernorm.weight"), eps)
        x = x + (_s3_ffn if step3 else _ds_ffn)(t, W, l, p, h)
    x = rms_norm(x, W("model.norm.weight"), eps)
    logits = F.linear(x, W("lm_head.weight"))
    return [logits[b, :len(s)].numpy() for b, s in enumerate(sequences)]


def mtp_padded(config, tensors, hidden, next_tokens):
    """DeepSeek's MTP module (layer id num_hidden_layers) recomputed over one whole input sequence,
    no cache: row s is the module at position s on (hidden[s], next_tokens[s]). embed_tokens /
    shared_head.head are the layer's when stored, else model.embed_tokens / lm_head. -> (logits
    [S, vocab], the decoder layer's output [S, H] before shared_head.norm), numpy."""
    t = config
    qc = t.get("quantization_config")
    W = _Weights(tensors, tuple(qc["weight_block_size"]) if qc else (128, 128))
    eps = float(t.get("rms_norm_eps") or 1e-6)
    l = t["num_hidden_layers"]
    p = f"model.layers.{l}."

    def own_or(name, main):
        return W(p + name) if p + name in tensors else W(main)

    S = len(next_tokens)
    e = own_or("embed_tokens.weight", "model.embed_tokens.weight")[torch.tensor(next_tokens, dtype=torch.long)]
    h = torch.as_tensor(hidden, dtype=torch.float64)
    u = F.linear(torch.cat((rms_norm(e, W(p + "enorm.weight"), eps), rms_norm(h, W(p + "hnorm.weight"), eps)), -1),
                 W(p + "eh_proj.weight"))[None]                                # [1, S, H]
    pos = torch.arange(S, dtype=torch.float64)
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    x = u + _mla(t, W, p + "self_attn.", rms_norm(u, W(p + "input_layernorm.weight"), eps), pos, mask, eps)
    x = x + _ds_ffn(t, W, l, p, rms_norm(x, W(p + "post_attention_layernorm.weight"), eps))
    logits = F.linear(rms_norm(x, W(p + "shared_head.norm.weight"), eps), own_or("shared_head.head.weight",
                                                                                  "lm_head.weight"))
    return logits[0].numpy(), x[0].numpy()


def _mla(t, W, a, h, pos, mask, eps):
    B, S, _ = h.shape
    N, P, R, Vd, Lkv = (t["num_attention_heads"], t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"],
                        t["kv_lora_rank"])
    if t.get("q_lora_rank") is None:
        q = F.linear(h, W(a + "q_proj.weight"))
    else:
        q = F.linear(rms_norm(F.linear(h, W(a + "q_a_proj.weight")), W(a + "q_a_layernorm.weight"), eps),
                     W(a + "q_b_proj.weight"))
    q = q.view(B, S, N, P + R).transpose(1, 2)                                 # [B, N, S, P+R]
    q_nope, q_pe = q.split([P, R], dim=-1)
    ckv = F.linear(h, W(a + "kv_a_proj_with_mqa.weight"))
    c, k_pe = ckv.split([Lkv, R], dim=-1)
    kv = F.linear(rms_norm(c, W(a + "kv_a_layernorm.weight"), eps), W(a + "kv_b_proj.weight"))
    kv = kv.view(B, S, N, P + Vd).transpose(1, 2)
    k_nope, v = kv.split([P, Vd], dim=-1)
    inv, factor, scale = yarn(t, R, P + R)
    freqs = pos[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * factor, emb.sin() * factor
    k_pe = k_pe.view(B, 1, S, R)
    if t.get("rope_interleave", True):
        q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
    q_pe = q_pe * cos + rotate_half(q_pe) * sin
    k_pe = k_pe * cos + rotate_half(k_pe) * sin
    qs = torch.cat((q_nope, q_pe), dim=-1)
    ks = torch.cat((k_nope, k_pe.expand(B, N, S, R)), dim=-1)
    att = torch.softmax(qs @ ks.transpose(-1, -2) * scale + mask, dim=-1)
    o = (att @ v).transpose(1, 2).reshape(B, S, N * Vd)
    return F.linear(o, W(a + "o_proj.weight"))


def _mfa(t, W, a, h, pos, mask, eps):
    B, S, _ = h.shape
    N, hd = t["num_attention_heads"], t["head_dim"]
    q = F.linear(rms_norm(F.linear(h, W(a + "q_proj.weight")), W(a + "inter_norm.weight"), eps), W(a + "wq.weight"))
    q = q.view(B, S, N, hd).transpose(1, 2)
    k = F.linear(h, W(a + "k_proj.weight")).view(B, 1, S, hd)
    v = F.linear(h, W(a + "v_proj.weight")).view(B, 1, S, hd)
    inv = float(t.get("rope_theta") or 500000.0) ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = pos[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    q = q * emb.cos() + rotate_half(q) * emb.sin()
    k = k * emb.cos() + rotate_half(k) * emb.sin()
    k, v = k.expand(B, N, S, hd), v.expand(B, N, S, hd)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
    return F.linear((att @ v).transpose(1, 2).reshape(B, S, N * hd), W(a + "o_proj.weight"))


def _experts(h, idx, w, n_experts, expert):
    flat = h.reshape(-1, h.shape[-1])
    out = torch.zeros_like(flat)
    onehot = F.one_hot(idx, n_experts).permute(2, 1, 0)                       # [E, k, T]
    for e in range(n_experts):
        slot, tok = torch.where(onehot[e])
        if tok.numel():
            out.index_add_(0, tok, expert(e, flat[tok]) * w[tok, slot, None])
    return out.view_as(h)


def _ds_ffn(t, W, l, p, h):
    m = p + "mlp."
    ne = t.get("n_routed_experts")
    freq = t.get("moe_layer_freq", 1)
    if not (ne and l >= t.get("first_k_dense_replace", 0) and l % freq == 0):
        return mlp(h, W(m + "gate_proj.weight"), W(m + "up_proj.weight"), W(m + "down_proj.weight"))
    v2 = t["model_type"] == "deepseek_v2"
    scoring = t.get("scoring_func") or ("softmax" if v2 else "sigmoid")
    method = t.get("topk_method") or ("greedy" if v2 else "noaux_tc")
    norm = t.get("norm_topk_prob", not v2)
    scale = t.get("routed_scaling_factor", 1.0 if v2 else 2.5)
    flat = h.reshape(-1, h.shape[-1])
    logits = F.linear(flat, W(m + "gate.weight"))
    bias = W(m + "gate.e_score_correction_bias") if method == "noaux_tc" else None
    idx, w = route_deepseek(logits, scoring, method, t["num_experts_per_tok"], t.get("n_group") or 1,
                            t.get("topk_group") or 1, norm, scale, bias)
    out = _experts(h, idx, w, ne, lambda e, x: mlp(x, W(m + f"experts.{e}.gate_proj.weight"),
                                                   W(m + f"experts.{e}.up_proj.weight"),
                                                   W(m + f"experts.{e}.down_proj.weight")))
    if t.get("n_shared_experts"):
        out = out + mlp(h, W(m + "shared_experts.gate_proj.weight"), W(m + "shared_experts.up_proj.weight"),
                        W(m + "shared_experts.down_proj.weight"))
    return out


def _s3_ffn(t, W, l, p, h):
    enum = t.get("moe_layers_enum")
    moe_layers = [int(i) for i in enum.strip().split(",")] if enum is not None else range(1, t["num_hidden_layers"])
    if l not in moe_layers:
        return mlp(h, W(p + "mlp.gate_proj.weight"), W(p + "mlp.up_proj.weight"), W(p + "mlp.down_proj.weight"))
    flat = h.reshape(-1, h.shape[-1])
    idx, w = route_step3(F.linear(flat, W(p + "moe.gate.weight")), t["moe_top_k"], t.get("norm_expert_weight", False))
    g, u, d = W(p + "moe.gate_proj.weight"), W(p + "moe.up_proj.weight"), W(p + "moe.down_proj.weight")
    out = _experts(h, idx, w, t["moe_num_experts"], lambda e, x: mlp(x, g[e], u[e], d[e]))
    return out + mlp(h, W(p + "share_expert.gate_proj.weight"), W(p + "share_expert.up_proj.weight"),
                     W(p + "share_expert.down_proj.weight"))
