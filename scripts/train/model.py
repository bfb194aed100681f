"""The trained models' forward pass in PyTorch (float32, autograd), for training only.

Same semantics as the float64 oracle (tests/reference/mla_mfa_ref.py) and afd: DeepSeek-V3
(MLA with a low-rank query, interleaved RoPE on the shared rope key, sigmoid scores with a
correction bias used for selection only, groups scored by their two largest choices,
renormalised weights x routed_scaling_factor, unweighted shared experts, dense first layers)
and Step-3 (MFA: one K/V head, low-rank query wq(rmsnorm(q_proj x)), rotate-half RoPE; softmax
top-k routing; unweighted shared expert). Parameters are keyed by their Hugging Face names
(per-expert names for Step-3's stacked experts), so `state()` is what `afd make-model
--weights` takes.

MTP (DeepSeek-V3 only, one module at layer id n_layers): u = eh_proj([enorm(Emb(t[i+1]));
hnorm(h[i])]) with h the main model's final-normed hidden state, one decoder layer over u at
positions i, logits = lm_head(rmsnorm(z, shared_head.norm)) predict t[i+2]. The module's
embed_tokens and shared_head.head are the main model's (written as copies).
"""

import math

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu(x, g, u, d):
    return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)


class Params:
    """A flat dict of named parameters with the checkpoint's initialisation."""

    def __init__(self, gen):
        self.p = {}
        self.gen = gen

    def mat(self, name, rows, cols, std=None):
        std = std if std is not None else cols ** -0.5
        t = torch.randn(rows, cols, generator=self.gen) * std
        self.p[name] = torch.nn.Parameter(t)

    def norm(self, name, n):
        self.p[name] = torch.nn.Parameter(torch.ones(n))

    def zeros(self, name, n):
        self.p[name] = torch.zeros(n)  # a buffer (not trained by the optimizer)


def rope_interleaved(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2)


def rope_neox(x, cos, sin):
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]
    return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)


class Model:
    def __init__(self, cfg, seed):
        """cfg: the config.json dict (deepseek_v3, or step3_vl with text_config)."""
        self.raw = cfg
        self.step3 = cfg["model_type"] == "step3_vl"
        c = cfg["text_config"] if self.step3 else cfg
        self.c = c
        self.H, self.V, self.L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
        self.N = c["num_attention_heads"]
        self.eps = c["rms_norm_eps"]
        self.n_mtp = 0 if self.step3 else c.get("num_nextn_predict_layers", 0)
        g = torch.Generator().manual_seed(seed)
        P = Params(g)
        H, V = self.H, self.V
        P.mat("model.embed_tokens.weight", V, H, std=1.0)
        for l in range(self.L + self.n_mtp):
            self._layer_params(P, l)
        P.norm("model.norm.weight", H)
        P.mat("lm_head.weight", V, H)
        for m in range(self.n_mtp):
            p = f"model.layers.{self.L + m}."
            P.norm(p + "enorm.weight", H)
            P.norm(p + "hnorm.weight", H)
            P.mat(p + "eh_proj.weight", H, 2 * H)
            P.norm(p + "shared_head.norm.weight", H)
        self.P = P.p
        self.watch = {}  # {layer: [heads]}: forward() keeps their attention in seen[layer] [B, heads, T, T]
        self.seen = {}
        if self.step3:
            hd = c["head_dim"]
            self.inv_freq = c["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            self.scale = hd ** -0.5
        else:
            R = c["qk_rope_head_dim"]
            assert c.get("rope_scaling") is None
            self.inv_freq = c["rope_theta"] ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
            self.scale = (c["qk_nope_head_dim"] + R) ** -0.5

    def is_moe(self, l):
        c = self.c
        if self.step3:
            return l in {int(x) for x in c["moe_layers_enum"].split(",")}
        return l >= c["first_k_dense_replace"]

    def _layer_params(self, P, l):
        c, H = self.c, self.H
        p = f"model.layers.{l}."
        a = p + "self_attn."
        P.norm(p + "input_layernorm.weight", H)
        P.norm(p + "post_attention_layernorm.weight", H)
        N = self.N
        if self.step3:
            hd, Dq = c["head_dim"], c["share_q_dim"]
            P.mat(a + "q_proj.weight", Dq, H)
            P.norm(a + "inter_norm.weight", Dq)
            P.mat(a + "wq.weight", N * hd, Dq)
            P.mat(a + "k_proj.weight", hd, H)
            P.mat(a + "v_proj.weight", hd, H)
            P.mat(a + "o_proj.weight", H, N * hd, std=(N * hd) ** -0.5 / math.sqrt(2 * self.L))
        else:
            Pn, R, Vd, Lkv, Lq = (c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"],
                                  c["kv_lora_rank"], c["q_lora_rank"])
            P.mat(a + "q_a_proj.weight", Lq, H)
            P.norm(a + "q_a_layernorm.weight", Lq)
            P.mat(a + "q_b_proj.weight", N * (Pn + R), Lq)
            P.mat(a + "kv_a_proj_with_mqa.weight", Lkv + R, H)
            P.norm(a + "kv_a_layernorm.weight", Lkv)
            P.mat(a + "kv_b_proj.weight", N * (Pn + Vd), Lkv)
            P.mat(a + "o_proj.weight", H, N * Vd, std=(N * Vd) ** -0.5 / math.sqrt(2 * self.L))
        out_std = lambda inter: inter ** -0.5 / math.sqrt(2 * self.L)
        if not self.is_moe(l):
            m = p + "mlp."
            I = c["intermediate_size"]
            P.mat(m + "gate_proj.weight", I, H)
            P.mat(m + "up_proj.weight", I, H)
            P.mat(m + "down_proj.weight", H, I, std=out_std(I))
            return
        if self.step3:
            m, E, I, S = p + "moe.", c["moe_num_experts"], c["moe_intermediate_size"], c["share_expert_dim"]
            sp = p + "share_expert."
        else:
            m, E, I = p + "mlp.", c["n_routed_experts"], c["moe_intermediate_size"]
            S = c["n_shared_experts"] * I
            sp = m + "shared_experts."
        P.mat(m + "gate.weight", E, H, std=0.02)
        if not self.step3:
            P.zeros(m + "gate.e_score_correction_bias", E)
        for e in range(E):
            ep = m + f"experts.{e}."
            P.mat(ep + "gate_proj.weight", I, H)
            P.mat(ep + "up_proj.weight", I, H)
            P.mat(ep + "down_proj.weight", H, I, std=out_std(I))
        P.mat(sp + "gate_proj.weight", S, H)
        P.mat(sp + "up_proj.weight", S, H)
        P.mat(sp + "down_proj.weight", H, S, std=out_std(S))

    def parameters(self):
        return [v for v in self.P.values() if isinstance(v, torch.nn.Parameter)]

    def state(self):
        """{HF name: float32 tensor}, including the MTP module's copies of the embedding and head."""
        out = {k: v.detach().clone().float() for k, v in self.P.items()}
        for m in range(self.n_mtp):
            p = f"model.layers.{self.L + m}."
            out[p + "embed_tokens.weight"] = out["model.embed_tokens.weight"].clone()
            out[p + "shared_head.head.weight"] = out["lm_head.weight"].clone()
        return out

    # ---- forward
    def _rope(self, T):
        ang = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        return torch.cos(ang).float(), torch.sin(ang).float()

    def _attention(self, l, h, cs):
        B, T, H = h.shape
        P, c, N = self.P, self.c, self.N
        a = f"model.layers.{l}.self_attn."
        cos, sin = cs
        if self.step3:
            hd = c["head_dim"]
            cq = rms_norm(F.linear(h, P[a + "q_proj.weight"]), P[a + "inter_norm.weight"], self.eps)
            q = F.linear(cq, P[a + "wq.weight"]).view(B, T, N, hd)
            k = F.linear(h, P[a + "k_proj.weight"]).view(B, T, 1, hd)
            v = F.linear(h, P[a + "v_proj.weight"]).view(B, T, 1, hd)
            q = rope_neox(q, cos[None, :, None], sin[None, :, None])
            k = rope_neox(k, cos[None, :, None], sin[None, :, None])
            k, v = k.expand(B, T, N, hd), v.expand(B, T, N, hd)
            Vd = hd
        else:
            Pn, R, Vd, Lkv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
            cq = rms_norm(F.linear(h, P[a + "q_a_proj.weight"]), P[a + "q_a_layernorm.weight"], self.eps)
            q = F.linear(cq, P[a + "q_b_proj.weight"]).view(B, T, N, Pn + R)
            kva = F.linear(h, P[a + "kv_a_proj_with_mqa.weight"])
            c_n = rms_norm(kva[..., :Lkv], P[a + "kv_a_layernorm.weight"], self.eps)
            k_pe = rope_interleaved(kva[..., Lkv:], cos[None], sin[None])           # [B, T, R]
            q_pe = rope_interleaved(q[..., Pn:], cos[None, :, None], sin[None, :, None])
            kv = F.linear(c_n, P[a + "kv_b_proj.weight"]).view(B, T, N, Pn + Vd)
            k = torch.cat([kv[..., :Pn], k_pe[:, :, None, :].expand(B, T, N, R)], dim=-1)
            q = torch.cat([q[..., :Pn], q_pe], dim=-1)
            v = kv[..., Pn:]
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        s = (qh @ kh.transpose(-1, -2)) * self.scale
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        probs = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)            # [B, N, T, T]
        if l in self.watch:
            self.seen[l] = probs[:, self.watch[l]]
        o = probs @ vh                                                               # [B, N, T, Vd]
        return F.linear(o.transpose(1, 2).reshape(B, T, N * Vd), P[a + "o_proj.weight"])

    def _moe(self, l, x, stats):
        P, c = self.P, self.c
        p = f"model.layers.{l}."
        B, T, H = x.shape
        x2 = x.reshape(-1, H)
        if self.step3:
            m, E, k = p + "moe.", c["moe_num_experts"], c["moe_top_k"]
            probs = torch.softmax(F.linear(x2, P[m + "gate.weight"]), dim=-1)
            w, idx = probs.topk(k, dim=-1)
            if c.get("norm_expert_weight", False):
                w = w / w.sum(-1, keepdim=True)
            sp = p + "share_expert."
            scores = probs
        else:
            m, E, k = p + "mlp.", c["n_routed_experts"], c["num_experts_per_tok"]
            G, TG = c["n_group"], c["topk_group"]
            scores = torch.sigmoid(F.linear(x2, P[m + "gate.weight"]))
            choice = scores.detach() + P[m + "gate.e_score_correction_bias"][None]
            gs = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(TG, dim=-1).indices, True)
            keep = keep[:, :, None].expand(-1, G, E // G).reshape(-1, E)
            idx = choice.masked_fill(~keep, float("-inf")).topk(k, dim=-1).indices
            w = scores.gather(1, idx)
            if c.get("norm_topk_prob", True):
                w = w / w.sum(-1, keepdim=True)
            w = w * c["routed_scaling_factor"]
            sp = m + "shared_experts."
        out = torch.zeros_like(x2)
        for e in range(E):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            ep = m + f"experts.{e}."
            y = swiglu(x2[rows], P[ep + "gate_proj.weight"], P[ep + "up_proj.weight"], P[ep + "down_proj.weight"])
            out.index_add_(0, rows, y * w[rows, slot][:, None])
        out = out + swiglu(x2, P[sp + "gate_proj.weight"], P[sp + "up_proj.weight"], P[sp + "down_proj.weight"])
        if stats is not None:
            load = torch.bincount(idx.flatten(), minlength=E).float()
            # sequence-wise balance loss (DeepSeek-V3's complementary loss): E/(k T) sum_e f_e P_e
            sn = scores / scores.sum(-1, keepdim=True)
            f = load / (k * x2.shape[0]) * E
            stats.append((l, load, (f * sn.mean(0)).sum()))
        return out.view(B, T, H)

    def _block(self, l, x, cs, stats):
        P = self.P
        p = f"model.layers.{l}."
        x = x + self._attention(l, rms_norm(x, P[p + "input_layernorm.weight"], self.eps), cs)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], self.eps)
        if self.is_moe(l):
            return x + self._moe(l, h, stats)
        m = p + "mlp."
        return x + swiglu(h, P[m + "gate_proj.weight"], P[m + "up_proj.weight"], P[m + "down_proj.weight"])

    def forward(self, tokens, stats=None):
        """tokens [B, T] -> (logits [B, T, V], final-normed hidden [B, T, H])."""
        P = self.P
        cs = self._rope(tokens.shape[1])
        x = P["model.embed_tokens.weight"][tokens]
        for l in range(self.L):
            x = self._block(l, x, cs, stats)
        h = rms_norm(x, P["model.norm.weight"], self.eps)
        return F.linear(h, P["lm_head.weight"]), h

    def mtp_forward(self, h, next_tokens, stats=None):
        """h [B, T, H] final-normed hidden at positions 0..T-1, next_tokens [B, T] = t[i+1] ->
        MTP logits [B, T, V] predicting t[i+2]."""
        P = self.P
        l = self.L
        p = f"model.layers.{l}."
        e = P["model.embed_tokens.weight"][next_tokens]
        u = F.linear(torch.cat([rms_norm(e, P[p + "enorm.weight"], self.eps),
                                rms_norm(h, P[p + "hnorm.weight"], self.eps)], dim=-1), P[p + "eh_proj.weight"])
        z = self._block(l, u, self._rope(h.shape[1]), stats)
        return F.linear(rms_norm(z, P[p + "shared_head.norm.weight"], self.eps), P["lm_head.weight"])
