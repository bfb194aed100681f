"""A second, structurally different formulation of the same forward pass, in torch float64,
mirroring the Hugging Face modules' code paths: a right-padded [batch, seq] full-sequence
recompute (no KV cache) with an additive causal+padding mask, repeat_kv, torch.topk
routing and a one-hot expert mask with index_add_. test_reference.py checks that it and
hf_moe_ref.py (flattened batch, per-sequence KV cache, argsort routing) agree, so a bug in
either one's bookkeeping shows up.
"""

import torch
import torch.nn.functional as F


def _t(tensors, name):
    return torch.from_numpy(tensors[name].to_f64())


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    # [B, n_kv, S, D] -> [B, n_kv * n_rep, S, D]; head j*n_rep + r is a copy of kv head j
    b, n_kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, n_kv, n_rep, s, d).reshape(b, n_kv * n_rep, s, d)


def mlp(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def forward_padded(cfg, tensors, sequences):
    """cfg: hf_moe_ref.Config; tensors: {name: Tensor}; sequences: list of token lists.
    Returns a list of logits arrays [len(seq), vocab] (numpy float64)."""
    B = len(sequences)
    S = max(len(s) for s in sequences)
    ids = torch.zeros((B, S), dtype=torch.long)
    valid = torch.zeros((B, S), dtype=torch.bool)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = torch.tensor(s)
        valid[i, :len(s)] = True
    H, hd, nh, nkv = cfg.hidden_size, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    x = F.embedding(ids, _t(tensors, "model.embed_tokens.weight"))            # [B, S, H]
    pos = torch.arange(S, dtype=torch.float64)
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]                  # [1, 1, S, hd]
    causal = torch.tril(torch.ones((S, S), dtype=torch.bool))
    allowed = causal[None, None] & valid[:, None, None, :]                    # [B, 1, S, S]
    mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    for l in range(cfg.n_layers):
        p = f"model.layers.{l}."
        residual = x
        h = rms_norm(x, _t(tensors, p + "input_layernorm.weight"), cfg.rms_norm_eps)
        a = p + "self_attn."

        def proj(name):
            w = _t(tensors, a + name + ".weight")
            b = _t(tensors, a + name + ".bias") if (a + name + ".bias") in tensors else None
            return F.linear(h, w, b)

        q = proj("q_proj").view(B, S, nh, hd)
        k = proj("k_proj").view(B, S, nkv, hd)
        v = proj("v_proj").view(B, S, nkv, hd)
        if cfg.qk_norm:
            q = rms_norm(q, _t(tensors, a + "q_norm.weight"), cfg.rms_norm_eps)
            k = rms_norm(k, _t(tensors, a + "k_norm.weight"), cfg.rms_norm_eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)      # [B, heads, S, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
        scores = torch.matmul(q, k.transpose(2, 3)) * (hd ** -0.5) + mask
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs)  # fully masked padding rows
        attn = torch.matmul(probs, v).transpose(1, 2).reshape(B, S, nh * hd)
        o_w = _t(tensors, a + "o_proj.weight")
        o_b = _t(tensors, a + "o_proj.bias") if (a + "o_proj.bias") in tensors else None
        x = residual + F.linear(attn, o_w, o_b)
        residual = x
        h = rms_norm(x, _t(tensors, p + "post_attention_layernorm.weight"), cfg.rms_norm_eps)
        if cfg.is_moe_layer(l):
            x = residual + sparse_moe(cfg, tensors, l, h.view(B * S, H)).view(B, S, H)
        else:
            m = p + "mlp."
            x = residual + mlp(h, _t(tensors, m + "gate_proj.weight"), _t(tensors, m + "up_proj.weight"),
                               _t(tensors, m + "down_proj.weight"))
    x = rms_norm(x, _t(tensors, "model.norm.weight"), cfg.rms_norm_eps)
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    logits = F.linear(x, _t(tensors, head))
    return [logits[i, :len(s)].numpy() for i, s in enumerate(sequences)]


def _expert_weights(cfg, tensors, l, e):
    I = cfg.moe_intermediate_size
    if cfg.model_type == "mixtral":
        m = f"model.layers.{l}.block_sparse_moe.experts.{e}."
        return _t(tensors, m + "w1.weight"), _t(tensors, m + "w3.weight"), _t(tensors, m + "w2.weight")
    m = f"model.layers.{l}.mlp.experts."
    if m + "gate_up_proj" in tensors:
        gate, up = _t(tensors, m + "gate_up_proj")[e].chunk(2, dim=0)
        return gate, up, _t(tensors, m + "down_proj")[e]
    m += f"{e}."
    return _t(tensors, m + "gate_proj.weight"), _t(tensors, m + "up_proj.weight"), _t(tensors, m + "down_proj.weight")


def sparse_moe(cfg, tensors, l, h):
    """h [T, H] -> [T, H], as the HF SparseMoeBlock forward."""
    pre = f"model.layers.{l}." + ("block_sparse_moe." if cfg.model_type == "mixtral" else "mlp.")
    router_logits = F.linear(h, _t(tensors, pre + "gate.weight"))
    routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float64)
    routing_weights, selected = torch.topk(routing_weights, cfg.top_k, dim=-1)
    if cfg.norm_topk_prob:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    final = torch.zeros_like(h)
    expert_mask = F.one_hot(selected, num_classes=cfg.n_experts).permute(2, 1, 0)  # [E, k, T]
    for e in range(cfg.n_experts):
        idx, top_x = torch.where(expert_mask[e])
        if top_x.numel() == 0:
            continue
        wg, wu, wd = _expert_weights(cfg, tensors, l, e)
        cur = mlp(h[top_x], wg, wu, wd) * routing_weights[top_x, idx, None]
        final.index_add_(0, top_x, cur)
    if cfg.shared_expert_intermediate_size > 0:
        s = pre + "shared_expert."
        shared = mlp(h, _t(tensors, s + "gate_proj.weight"), _t(tensors, s + "up_proj.weight"),
                     _t(tensors, s + "down_proj.weight"))
        shared = torch.sigmoid(F.linear(h, _t(tensors, pre + "shared_expert_gate.weight"))) * shared
        final = final + shared
    return final
