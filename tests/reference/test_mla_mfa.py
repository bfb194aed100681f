#!/usr/bin/python3
"""Self-tests of the DeepSeek (MLA) / Step-3 (MFA) reference, the FP8 block format and their
golden cases. Run by test_reference.py (ctest reference_selftest), or alone:
    /usr/bin/python3 tests/reference/test_mla_mfa.py"""

import copy
import json
import os
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fp8_e4m3  # noqa: E402
import hf_moe_ref  # noqa: E402
import make_golden_mla_mfa as mm  # noqa: E402
import mla_mfa_ref as ref  # noqa: E402
import safetensors_io as st  # noqa: E402

DATA = os.path.join(HERE, "data")
NEW_CASES = [c["name"] for c in mm.CASES]
DS_CASES = [c["name"] for c in mm.CASES if c["family"] == "deepseek"]
S3_CASES = [c["name"] for c in mm.CASES if c["family"] == "step3"]


def _golden(name):
    d = os.path.join(DATA, name)
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    logits = np.fromfile(os.path.join(d, g["logits_file"]), dtype="<f4").reshape(-1, g["vocab_size"])
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return d, g, logits, cfg


def _flat(rows):
    return np.concatenate([np.asarray(r) for r in rows])


def _spec(name):
    return next(c for c in mm.CASES if c["name"] == name)


def _torch():
    import torch
    torch.set_num_threads(1)
    import torch_mirror_mla_mfa as tm
    return torch, tm


# ----------------------------------------------------------------------------- FP8

class Fp8Format(unittest.TestCase):
    def test_decode_all_codes_matches_bit_construction(self):
        """numpy's formula decode == torch's float32-bit-pattern decode for all 256 codes."""
        torch, tm = _torch()
        codes = np.arange(256, dtype=np.uint8)
        a = fp8_e4m3.decode(codes)
        b = tm.fp8_decode(codes).numpy()
        self.assertTrue(np.array_equal(np.isnan(a), np.isnan(b)))
        self.assertTrue(np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)]))
        self.assertEqual(set(np.nonzero(np.isnan(a))[0]), {0x7F, 0xFF})
        self.assertEqual(float(np.nanmax(a)), 448.0)
        self.assertEqual(a[0x7E], 448.0)
        self.assertEqual(a[0x01], 2.0 ** -9)
        self.assertEqual(a[0x08], 2.0 ** -6)
        self.assertEqual(a[0x38], 1.0)

    def test_encode_is_round_to_nearest_even_and_saturates(self):
        """encode == brute force nearest finite code, ties to the even code, magnitudes beyond
        448 clamped to 448: random values, every exact midpoint, and out-of-range values."""
        grid = fp8_e4m3.decode(np.arange(127, dtype=np.uint8))             # 0 .. 448, ascending
        rng = np.random.default_rng(5)
        mids = (grid[1:] + grid[:-1]) / 2
        x = np.concatenate([rng.uniform(-460, 460, 20000), rng.normal(0, 0.02, 20000), mids, -mids,
                            grid, -grid, [448.5, 463.9, 464.0, 470.0, 1e9, -1e9]])
        got = fp8_e4m3.encode(x)
        a = np.abs(x)
        d = np.abs(a[:, None] - grid[None, :])
        best = d == d.min(axis=1, keepdims=True)
        want = np.array([next((k for k in np.nonzero(row)[0] if k % 2 == 0), np.nonzero(row)[0][0])
                         for row in best])
        want = (want | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)
        self.assertTrue(np.array_equal(got, want), int(np.sum(got != want)))
        with self.assertRaises(ValueError):
            fp8_e4m3.encode([np.inf])

    def test_block_quantize_partial_edges(self):
        """Scales are amax/448 of each (possibly partial) block computed block by block in torch;
        each nonzero block's largest element encodes to +-448 exactly; the dequantized weight is
        within half an e4m3 step of the input; numpy and torch dequantization agree exactly."""
        torch, tm = _torch()
        rng = np.random.default_rng(9)
        for shape in [(160, 144), (64, 256), (256, 192), (3, 16, 144), (2, 144, 16), (128, 128), (1, 1)]:
            with self.subTest(shape=shape):
                w = rng.normal(0, 0.1, size=shape)
                w[..., :1, :1] *= 30.0                  # blocks with very different ranges
                codes, s = fp8_e4m3.quantize(w)
                self.assertEqual(s.dtype, np.float32)
                self.assertEqual(s.shape, fp8_e4m3.scale_shape(shape))
                amax = tm.fp8_block_amax(w).numpy()
                self.assertTrue(np.array_equal(s, (amax / 448.0).astype(np.float32)))
                deq = fp8_e4m3.dequantize(codes, s)
                self.assertTrue(np.array_equal(deq, tm.fp8_dequant(codes, s).numpy()))
                dq_amax = tm.fp8_block_amax(fp8_e4m3.decode(codes)).numpy()
                self.assertTrue(np.all(dq_amax == 448.0))
                step = fp8_e4m3.expand_scales(s, shape) * 2.0 ** -9   # subnormal spacing x scale
                rel = np.abs(deq - w) / np.maximum(np.abs(w) * 2.0 ** -4, step / 2)
                self.assertLessEqual(float(rel.max()), 1.0 + 1e-6)

    def test_zero_block_and_shape_errors(self):
        w = np.zeros((130, 5))
        w[129, 0] = 1.0
        codes, s = fp8_e4m3.quantize(w)
        self.assertEqual(s.tolist(), [[1.0], [np.float32(1.0 / 448.0)]])
        self.assertLess(float(np.max(np.abs(fp8_e4m3.dequantize(codes, s) - w))), 1e-7)   # f32 scale rounding
        self.assertEqual(int(codes[129, 0]), 0x7E)
        self.assertFalse(np.any(codes[:128]))
        with self.assertRaisesRegex(ValueError, "weight_scale_inv shape"):
            fp8_e4m3.dequantize(codes, s.T)

    def test_safetensors_f8_round_trip(self):
        """F8_E4M3 tensors are written and re-read bit-exactly, and a committed FP8 checkpoint
        rewritten from its loaded tensors is byte-identical to the file."""
        codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.safetensors")
            st.write_file(path, {"w": st.Tensor("F8_E4M3", codes), "w_scale_inv": st.Tensor("F32", np.ones((1, 1)))})
            back = st.read_file(path)
            self.assertEqual(back["w"].dtype, "F8_E4M3")
            self.assertTrue(np.array_equal(back["w"].raw, codes))
            for name in NEW_CASES:
                src = os.path.join(DATA, name, st.SINGLE_NAME)
                out = os.path.join(tmp, name + ".safetensors")
                st.write_file(out, st.read_file(src))
                with open(src, "rb") as a, open(out, "rb") as b:
                    self.assertEqual(a.read(), b.read(), name)

    def test_committed_fp8_tensors(self):
        """In every FP8 case: which tensors are FP8 (all Linear weights except router and MTP
        eh_proj), each with an F32 scale of shape ceil(out/128) x ceil(in/128) whose blocks reach
        +-448; the partial edge blocks the cases promise exist."""
        for name in NEW_CASES:
            d, g, _, cfg = _golden(name)
            t = st.load_dir(d)
            fp8 = {k for k, v in t.items() if v.dtype == "F8_E4M3"}
            if not _spec(name)["fp8"]:
                self.assertEqual(fp8, set(), name)
                self.assertFalse(any(k.endswith("_scale_inv") for k in t), name)
                continue
            with self.subTest(case=name):
                self.assertEqual({k for k in t if k.endswith("_scale_inv")}, {k + "_scale_inv" for k in fp8})
                for k in fp8:
                    s = t[k + "_scale_inv"]
                    self.assertEqual(s.dtype, "F32")
                    self.assertEqual(s.shape, fp8_e4m3.scale_shape(t[k].shape))
                    self.assertTrue(np.all(fp8_e4m3.block_amax(t[k].to_f64()) == 448.0), k)
                plain = {k for k in t if not k.endswith("_scale_inv") and not k.startswith("vision_model.")} - fp8
                for k in plain:
                    self.assertTrue(k.endswith(("norm.weight", "embed_tokens.weight", "lm_head.weight",
                                                "gate.weight", "e_score_correction_bias", "eh_proj.weight",
                                                "shared_head.head.weight")), k)
                self.assertTrue(any(t[k].shape[-2] % 128 for k in fp8))
                self.assertTrue(any(t[k].shape[-1] % 128 for k in fp8))
                self.assertTrue(any(t[k].shape[-2] > 128 and t[k].shape[-2] % 128 for k in fp8))
        t = st.load_dir(os.path.join(DATA, "step3_tiny_fp8"))
        self.assertEqual(t["model.layers.1.moe.gate_proj.weight_scale_inv"].shape, (8, 1, 2))
        self.assertEqual(t["model.layers.1.moe.down_proj.weight_scale_inv"].shape, (8, 2, 1))
        t = st.load_dir(os.path.join(DATA, "dsv3_tiny_fp8"))
        self.assertEqual(t["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape, (2, 2))


# ----------------------------------------------------------------------------- RoPE / YaRN

class RopeYarn(unittest.TestCase):
    def test_derived_values(self):
        """MODELS.md B6/B8/D2: YaRN low/high, softmax scale and cos/sin factor."""
        self.assertEqual(ref.yarn_low_high(32, 10000.0, 4096, 32, 1), (5, 12))     # dsv3-tiny
        self.assertEqual(ref.yarn_low_high(64, 10000.0, 4096, 32, 1), (10, 23))    # DeepSeek-V3
        self.assertEqual(ref.yarn_low_high(64, 50000.0, 4096, 1, 1), (19, 20))     # Kimi-K2 tiny mirror
        self.assertEqual(ref.yarn_low_high(32, 50000.0, 4096, 1, 1), (9, 10))      # k2_style case
        m = ref.yarn_get_mscale(40, 1.0)
        self.assertAlmostEqual(m, 1.36889, places=5)
        self.assertAlmostEqual(96 ** -0.5 * m * m, 0.191249, places=6)
        self.assertAlmostEqual(192 ** -0.5 * m * m, 0.135234, places=6)
        self.assertAlmostEqual(192 ** -0.5 * ref.yarn_get_mscale(40, 0.707) ** 2, 0.11472, places=5)
        self.assertEqual(ref.yarn_get_mscale(1.0, 5.0), 1.0)
        for name, low_high, scale, factor in [("dsv3_tiny_fp8", (5, 12), 0.191249, 1.0),
                                              ("dsv2_style_bf16", (5, 12), 0.191249, 0.92104),
                                              ("k2_style_fp8", (9, 10), 96 ** -0.5 * ref.yarn_get_mscale(32, 1) ** 2,
                                               1.0)]:
            with self.subTest(case=name):
                cfg = ref.Config.from_dir(os.path.join(DATA, name))
                self.assertEqual((cfg.rope.low, cfg.rope.high), low_high)
                self.assertAlmostEqual(cfg.rope.softmax_scale, scale, places=6)
                self.assertAlmostEqual(cfg.rope.attn_factor, factor, places=5)

    def test_inv_freq_ramp(self):
        """Pairs up to low keep base^(-2i/d), pairs from high on are divided by factor, between
        the blend is strictly monotone; torch's independent computation agrees; low == high uses
        high + 0.001 (a step)."""
        torch, tm = _torch()
        inv = ref.yarn_inv_freq(32, 10000.0, 40.0, 4096, 32, 1)
        f = 10000.0 ** (-np.arange(0, 32, 2) / 32)
        self.assertTrue(np.allclose(inv[:6], f[:6], rtol=0, atol=0))
        self.assertTrue(np.allclose(inv[12:], f[12:] / 40.0, rtol=1e-15))
        r = inv / f
        self.assertTrue(np.all(np.diff(r[5:13]) < 0))
        t = {"rope_theta": 10000.0, "rope_scaling": dict(mm.YARN_V3)}
        inv_t, fac, sc = tm.yarn(t, 32, 96)
        self.assertLess(float(np.max(np.abs(inv_t.numpy() - inv) / inv)), 1e-14)
        self.assertAlmostEqual(sc, 0.191249, places=6)
        self.assertEqual(ref.yarn_ramp(8, 3, 3).tolist(), [0, 0, 0, 0, 1, 1, 1, 1])
        self.assertEqual(ref.yarn_ramp(6, 1, 5).tolist(), [0, 0, 0.25, 0.5, 0.75, 1])

    def test_interleaved_and_neox_rotations(self):
        """Interleaved rope == complex rotation of adjacent pairs; NeoX == rotation of (i, i+d/2);
        de-interleaving q and k before a NeoX rotation (Hugging Face's rope_interleave) gives
        the same dot products; the cos/sin factor scales each rotated vector."""
        rng = np.random.default_rng(2)
        d = 32
        pos = np.array([0, 1, 5, 40, 300])
        inv = ref.yarn_inv_freq(d, 10000.0, 40.0, 4096, 32, 1)
        q, k = rng.normal(size=(5, 3, d)), rng.normal(size=(5, 3, d))
        got = ref.rope_interleaved(q, pos, inv, 0.9)
        z = (q[..., 0::2] + 1j * q[..., 1::2]) * np.exp(1j * pos[:, None] * inv)[:, None, :] * 0.9
        want = np.empty_like(q)
        want[..., 0::2], want[..., 1::2] = z.real, z.imag
        self.assertLess(float(np.max(np.abs(got - want))), 1e-13)
        got = ref.rope_neox(q, pos, inv)
        z = (q[..., :d // 2] + 1j * q[..., d // 2:]) * np.exp(1j * pos[:, None] * inv)[:, None, :]
        self.assertLess(float(np.max(np.abs(got - np.concatenate([z.real, z.imag], -1)))), 1e-13)
        perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
        a = np.einsum("thd,shd->ths", ref.rope_interleaved(q, pos, inv), ref.rope_interleaved(k, pos, inv))
        b = np.einsum("thd,shd->ths", ref.rope_neox(q[..., perm], pos, inv), ref.rope_neox(k[..., perm], pos, inv))
        self.assertLess(float(np.max(np.abs(a - b))), 1e-12)
        # rotations are relative: shifting every position leaves q.k unchanged
        c = np.einsum("thd,shd->ths", ref.rope_interleaved(q, pos + 17, inv), ref.rope_interleaved(k, pos + 17, inv))
        self.assertLess(float(np.max(np.abs(np.diagonal(a, axis1=0, axis2=2) - np.diagonal(c, axis1=0, axis2=2)))),
                        1e-12)


# ----------------------------------------------------------------------------- routing

def _route_cases():
    rng = np.random.default_rng(11)
    out = []
    for scoring, method, E, ng, kg, k, norm, scale in [
            ("sigmoid", "noaux_tc", 16, 4, 2, 4, True, 2.5), ("sigmoid", "noaux_tc", 12, 1, 1, 4, True, 2.827),
            ("sigmoid", "noaux_tc", 256, 8, 4, 8, True, 2.5),
            ("softmax", "group_limited_greedy", 8, 4, 2, 3, False, 2.0),
            ("softmax", "group_limited_greedy", 160, 8, 3, 6, False, 16.0),
            ("softmax", "greedy", 64, 1, 1, 6, False, 1.0),
            ("softmax", "greedy", 16, 1, 1, 4, True, 1.0), ("sigmoid", "noaux_tc", 16, 4, 4, 16, True, 1.0)]:
        logits = rng.normal(0, 2.0, size=(300, E))
        bias = rng.normal(0, 0.05, size=E) if method == "noaux_tc" else None
        out.append((scoring, method, E, ng, kg, k, norm, scale, logits, bias))
    return out


class Routing(unittest.TestCase):
    def test_torch_router_agrees(self):
        """numpy argsort routing == torch.topk / scatter / masked_fill routing: same expert sets,
        same weights; Step-3 softmax top-k with and without renormalisation likewise."""
        torch, tm = _torch()
        for scoring, method, E, ng, kg, k, norm, scale, logits, bias in _route_cases():
            with self.subTest(method=method, E=E, k=k):
                r = ref.route_deepseek(logits, scoring, method, k, ng, kg, norm, scale, bias)
                order = np.argsort(r.idx, axis=1)
                idx_t, w_t = tm.route_deepseek(logits, scoring, method, k, ng, kg, norm, scale, bias)
                self.assertTrue(np.array_equal(np.take_along_axis(r.idx, order, 1), idx_t.numpy()))
                self.assertLess(float(np.max(np.abs(np.take_along_axis(r.weights, order, 1) - w_t.numpy()))), 1e-14)
        rng = np.random.default_rng(3)
        logits = rng.normal(0, 2.0, size=(300, 8))
        for norm in (False, True):
            r = ref.route_step3(logits, 3, norm)
            order = np.argsort(r.idx, axis=1)
            idx_t, w_t = tm.route_step3(logits, 3, norm)
            self.assertTrue(np.array_equal(np.take_along_axis(r.idx, order, 1), idx_t.numpy()))
            self.assertLess(float(np.max(np.abs(np.take_along_axis(r.weights, order, 1) - w_t.numpy()))), 1e-14)
            s = r.weights.sum(1)
            self.assertTrue(np.allclose(s, 1.0) if norm else np.all(s < 1.0))

    def test_router_semantics(self):
        """Written out per token: the bias only chooses (weights are the unbiased scores), the
        chosen experts all lie in the topk_group best groups by top-2 sum (noaux_tc) or max
        (group_limited_greedy), and nothing outside them outranks a chosen one."""
        for scoring, method, E, ng, kg, k, norm, scale, logits, bias in _route_cases():
            r = ref.route_deepseek(logits, scoring, method, k, ng, kg, norm, scale, bias)
            e = np.exp(logits)
            s = 1 / (1 + 1 / e) if scoring == "sigmoid" else e / e.sum(1, keepdims=True)
            choice = s + bias if bias is not None else s
            for t in range(0, logits.shape[0], 7):
                idx = r.idx[t]
                w = s[t, idx] / (s[t, idx].sum() if norm else 1.0) * scale
                self.assertLess(float(np.max(np.abs(np.sort(w) - np.sort(r.weights[t])))), 1e-14)
                if method == "greedy":
                    kept = np.arange(E)
                else:
                    g = choice[t].reshape(ng, E // ng)
                    gs = np.sort(g, 1)[:, -2:].sum(1) if method == "noaux_tc" else g.max(1)
                    groups = np.argsort(-gs, kind="stable")[:kg]
                    kept = np.concatenate([np.arange(gi * (E // ng), (gi + 1) * (E // ng)) for gi in groups])
                self.assertTrue(set(idx) <= set(kept))
                rest = np.setdiff1d(kept, idx)
                if rest.size:
                    self.assertGreater(choice[t, idx].min(), choice[t, rest].max())

    def test_group_mask_is_minus_infinity(self):
        """A kept group whose biased scores are negative still wins over the dropped groups.
        8 experts in 4 groups of 2, keep 2, top-3. Choice values (sigmoid + bias): {0,1}, {2,3}
        about -0.65 (group sums -1.3), {4,5} about 1.15 (kept), {6,7} about -0.2 (sum -0.4, kept).
        The third pick must be 6, although its choice is negative; Hugging Face's 0.0 fill would
        pick a dropped expert (0.0 > -0.2) instead."""
        logits = np.array([[-1.0, -1.1, -1.2, -1.3, 3.0, 2.9, -8.0, -9.0]])
        bias = np.array([-0.9, -0.9, -0.9, -0.9, 0.2, 0.2, -0.2, -0.2])
        r = ref.route_deepseek(logits, "sigmoid", "noaux_tc", 3, 4, 2, True, 1.0, bias)
        self.assertEqual(sorted(r.idx[0].tolist()), [4, 5, 6])
        s = 1 / (1 + np.exp(-logits[0]))
        want = s[[4, 5, 6]] / s[[4, 5, 6]].sum()
        self.assertLess(float(np.max(np.abs(np.sort(r.weights[0]) - np.sort(want)))), 1e-15)
        torch, tm = _torch()
        idx, _ = tm.route_deepseek(logits, "sigmoid", "noaux_tc", 3, 4, 2, True, 1.0, bias)
        self.assertEqual(idx[0].tolist(), [4, 5, 6])
        choice = s + bias
        zero_fill = np.where(np.repeat([False, False, True, True], 2), choice, 0.0)
        self.assertNotIn(6, np.argsort(-zero_fill, kind="stable")[:3].tolist())

    def test_diagnostics(self):
        """bias_changed and mask_excluded recomputed by brute force."""
        rng = np.random.default_rng(4)
        logits = rng.normal(0, 2, size=(400, 16))
        bias = rng.normal(0, 0.1, size=16)
        r = ref.route_deepseek(logits, "sigmoid", "noaux_tc", 4, 4, 2, True, 2.5, bias)
        r0 = ref.route_deepseek(logits, "sigmoid", "noaux_tc", 4, 4, 2, True, 2.5, np.zeros(16))
        changed = [set(a) != set(b) for a, b in zip(r.idx.tolist(), r0.idx.tolist())]
        self.assertEqual(r.bias_changed.tolist(), changed)
        self.assertGreater(sum(changed), 0)
        choice = 1 / (1 + np.exp(-logits)) + bias
        plain = np.argsort(-choice, axis=1)[:, :4]
        excl = [bool(set(p.tolist()) - set(i.tolist())) for p, i in zip(plain, r.idx)]
        self.assertEqual(r.mask_excluded.tolist(), excl)

    def test_layer_rules(self):
        """DeepSeek: MoE iff n_routed_experts and l >= first_k_dense_replace and l % moe_layer_freq
        == 0. Step-3: moe_layers_enum as a string (spaces allowed) or a list; absent: all but 0."""
        _, _, _, cfg = _golden("dsv3_tiny_fp8")
        d = copy.deepcopy(cfg)
        d.update(num_hidden_layers=7, first_k_dense_replace=2, moe_layer_freq=2)
        self.assertEqual([ref.Config(d).is_moe_layer(l) for l in range(7)],
                         [False, False, True, False, True, False, True])
        d.update(n_routed_experts=None)
        self.assertEqual([ref.Config(d).is_moe_layer(l) for l in range(7)], [False] * 7)
        self.assertEqual([ref.Config.from_dir(os.path.join(DATA, "dsv2_style_bf16")).is_moe_layer(l) for l in range(2)],
                         [True, False])
        _, _, _, cfg = _golden("step3_normw_fp8")
        self.assertEqual(cfg["moe_layers_enum"], "0, 2")
        self.assertEqual([ref.Config(cfg).is_moe_layer(l) for l in range(3)], [True, False, True])
        _, _, _, vl = _golden("step3_tiny_fp8")
        self.assertEqual([ref.Config(vl).is_moe_layer(l) for l in range(4)], [False, True, True, False])
        t = copy.deepcopy(cfg)
        del t["moe_layers_enum"]
        self.assertEqual([ref.Config(t).is_moe_layer(l) for l in range(3)], [False, True, True])
        t["moe_layers_enum"] = [2]
        self.assertEqual([ref.Config(t).is_moe_layer(l) for l in range(3)], [False, False, True])
        for bad in ("1,x", "1,5", ""):
            t["moe_layers_enum"] = bad
            with self.assertRaisesRegex(ValueError, "moe_layers_enum"):
                ref.Config(t)


# ----------------------------------------------------------------------------- model

class MlaMfaModel(unittest.TestCase):
    def test_mla_forms_agree(self):
        """Naive (expanded through kv_b) and absorbed (W_UK folded into q, W_UV after) MLA give
        the same logits on every DeepSeek case: 1e-10 in float64, rtol 1e-5 in float32."""
        for name in DS_CASES:
            with self.subTest(case=name):
                d, g, _, _ = _golden(name)
                cfg, t = ref.Config.from_dir(d), st.load_dir(d)
                outs = {}
                for form in ("naive", "absorbed"):
                    for dt in (np.float64, np.float32):
                        m = ref.Model(cfg, t, dt, mla_form=form)
                        rows, _ = hf_moe_ref.greedy(m, g["prompts"], g["max_new_tokens"], forced=g["greedy_tokens"])
                        outs[form, dt] = _flat(rows).astype(np.float64)
                self.assertLess(float(np.max(np.abs(outs["naive", np.float64] - outs["absorbed", np.float64]))), 1e-10)
                scale = float(np.max(np.abs(outs["naive", np.float64])))
                self.assertLess(float(np.max(np.abs(outs["naive", np.float32] - outs["absorbed", np.float32]))),
                                1e-5 * scale)
                self.assertIsNotNone(g["mla_naive_vs_absorbed_max_abs"])
                self.assertLess(g["mla_naive_vs_absorbed_max_abs"], 1e-10)

    def test_mla_cache_contents(self):
        """Per token and layer the cache holds kv_lora_rank + qk_rope_head_dim values: the
        normalised (not rotated) latent and the rotated (not normalised) k_pe."""
        d, g, _, _ = _golden("dsv3_tiny_fp8")
        m = ref.Model.from_dir(d)
        cfg = m.cfg
        m.trace = []
        seq = m.new_sequence()
        p = g["prompts"][1]
        m.forward([(seq, p)])
        for l in range(cfg.n_layers):
            c = seq.cache[l]
            self.assertEqual(sorted(c), ["c_n", "k_pe"])
            self.assertEqual(c["c_n"].shape, (len(p), cfg.kv_lora_rank))
            self.assertEqual(c["k_pe"].shape, (len(p), cfg.qk_rope))
            L = m.layers[l]
            rms = np.sqrt(np.mean((c["c_n"] / L["kv_a_norm"]) ** 2, axis=1))
            self.assertTrue(np.allclose(rms, 1.0, atol=1e-4))
            h_in = next(a for ll, n, a in m.trace if n == "after_ffn" and ll == l - 1) if l else m.embed[p]
            raw = ref.rms_norm(h_in, L["in_norm"], cfg.rms_norm_eps) @ L["wkv_a"].T
            k_pe = ref.rope_interleaved(raw[:, cfg.kv_lora_rank:], np.arange(len(p)), cfg.rope.inv_freq)
            self.assertLess(float(np.max(np.abs(k_pe - c["k_pe"]))), 1e-12)
            self.assertGreater(float(np.max(np.abs(k_pe[1:] - raw[1:, cfg.kv_lora_rank:]))), 1e-3)

    def test_dump_stages(self):
        """dump_stages.py writes every stage; its logits are the golden prompt rows; the residual
        stream after the last layer, normed, is final_hidden."""
        import subprocess
        for name in ("dsv3_tiny_fp8", "step3_tiny_fp8"):
            with self.subTest(case=name):
                d, g, logits, cfg = _golden(name)
                p = g["prompts"][0]
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "s.safetensors")
                    r = subprocess.run([sys.executable, os.path.join(HERE, "dump_stages.py"), d,
                                        ",".join(map(str, p)), out], capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    t = st.read_file(out)
                c = ref.Config(cfg)
                L = c.n_layers
                want = {f"layer{l}.{s}" for l in range(L) for s in ("after_attention", "after_ffn")}
                want |= {f"layer{l}.router_{s}" for l in range(L) if c.is_moe_layer(l) for s in ("idx", "weights")}
                if c.family == "deepseek":
                    want |= {f"layer{l}.mla_{s}" for l in range(L) for s in ("c_n", "k_pe_rot")}
                self.assertEqual(set(t), want | {"final_hidden", "logits"})
                self.assertTrue(np.array_equal(t["logits"].raw, logits[:len(p)]))
                self.assertEqual(t[f"layer{L - 1}.after_ffn"].shape, (len(p), c.hidden_size))
                m = ref.Model(c, st.load_dir(d))
                fh = ref.rms_norm(t[f"layer{L - 1}.after_ffn"].to_f64(), m.final_norm, c.rms_norm_eps)
                self.assertLess(float(np.max(np.abs(fh - t["final_hidden"].to_f64()))), 1e-5)

    def test_torch_mirror_agrees(self):
        """torch_mirror_mla_mfa (padded full recompute, HF-style de-interleaved rope, torch.topk
        routing, bit-pattern FP8 decode, block-loop dequantization) agrees with the reference on
        every case, teacher-forced on the golden tokens."""
        _torch()
        import torch_mirror_mla_mfa as tm
        for name in NEW_CASES:
            with self.subTest(case=name):
                d, g, logits, cfg = _golden(name)
                t = st.load_dir(d)
                seqs = [p + k[:-1] for p, k in zip(g["prompts"], g["greedy_tokens"])]
                out = np.concatenate(tm.forward_padded(cfg, t, seqs))
                self.assertLess(float(np.max(np.abs(out - logits))), 1e-5)
                rows, _ = hf_moe_ref.greedy(ref.Model(ref.Config(cfg), t), g["prompts"], g["max_new_tokens"])
                self.assertLess(float(np.max(np.abs(out - _flat(rows)))), 1e-10)

    def test_rope_interleave_false(self):
        """rope_interleave false (NeoX pairs on the rope dims) changes the logits, and the
        reference and the torch mirror agree on it."""
        _torch()
        import torch_mirror_mla_mfa as tm
        d, g, logits, cfg = _golden("dsv3_tiny_bf16")
        cfg = dict(cfg, rope_interleave=False)
        t = st.load_dir(d)
        p = g["prompts"][0]
        m = ref.Model(ref.Config(cfg), t)
        a = m.forward([(m.new_sequence(), p)])[0]
        b = tm.forward_padded(cfg, t, [p])[0]
        self.assertLess(float(np.max(np.abs(a - b))), 1e-10)
        self.assertGreater(float(np.max(np.abs(a[1:] - logits[1:len(p)]))), 1e-3)

    def test_prefill_equals_token_by_token(self):
        for name in ("dsv3_tiny_fp8", "step3_tiny_fp8"):
            with self.subTest(case=name):
                d, g, _, _ = _golden(name)
                m = ref.Model.from_dir(d)
                p = next(x for x in g["prompts"] if len(x) > 30)
                whole = m.forward([(m.new_sequence(), p)])[0]
                seq = m.new_sequence()
                steps = np.concatenate([m.forward([(seq, [t])])[0] for t in p])
                self.assertLess(float(np.max(np.abs(whole - steps))), 1e-12)

    def test_moe_block_written_out(self):
        """MoE output == sum over the chosen experts of weight x expert(h) + shared experts
        (unweighted), dense over all experts, for one MoE layer of each DeepSeek/Step-3 case."""
        for name in NEW_CASES:
            with self.subTest(case=name):
                m = ref.Model.from_dir(os.path.join(DATA, name))
                L = next(L for L in m.layers if L["moe"])
                h = np.random.default_rng(1).normal(size=(9, m.cfg.hidden_size))
                got = m._moe(0, L, h)
                r = m.route(L, h)
                want = ref.mlp(h, L["sg"], L["su"], L["sd"])
                for e in range(m.cfg.n_experts):
                    w = np.where(r.idx == e, r.weights, 0.0).sum(1)[:, None]
                    want = want + w * ref.mlp(h, L["eg"][e], L["eu"][e], L["ed"][e])
                self.assertLess(float(np.max(np.abs(got - want))), 1e-12)

    def test_stacked_step3_experts(self):
        """Step-3's stacked [E, out, in] expert tensor row e is expert e: swapping two experts'
        slices (and their scales) while swapping their router rows gives the same logits."""
        d, g, _, cfg = _golden("step3_tiny_fp8")
        t = st.load_dir(d)
        t2 = dict(t)
        for k in [k for k in t if ".moe." in k and "gate.weight" not in k]:
            raw = t[k].raw.copy()
            raw[[2, 5]] = raw[[5, 2]]
            t2[k] = st.Tensor(t[k].dtype, raw)
        for k in [k for k in t if k.endswith("moe.gate.weight")]:
            raw = t[k].raw.copy()
            raw[[2, 5]] = raw[[5, 2]]
            t2[k] = st.Tensor(t[k].dtype, raw)
        c = ref.Config(cfg)
        a = ref.Model(c, t).forward([(ref.Sequence(4), g["prompts"][0])])[0]
        b = ref.Model(c, t2).forward([(ref.Sequence(4), g["prompts"][0])])[0]
        self.assertLess(float(np.max(np.abs(a - b))), 1e-12)
        t3 = dict(t2)
        k = "model.layers.1.moe.gate_proj.weight_scale_inv"
        t3[k] = t[k]                                                    # scales not swapped: differs
        b = ref.Model(c, t3).forward([(ref.Sequence(4), g["prompts"][0])])[0]
        self.assertGreater(float(np.max(np.abs(a - b))), 1e-6)

    def test_golden_seed_rule(self):
        """What the generator promised: router gaps, the bias and the group mask each change a
        selection, and the f32 run stays within the 1e-4 tolerance."""
        for name in NEW_CASES:
            with self.subTest(case=name):
                c = _spec(name)
                _, g, _, _ = _golden(name)
                self.assertGreater(g["min_router_select_gap"], mm.MIN_ROUTER_GAP)
                if g["min_router_group_gap"] is not None:
                    self.assertGreater(g["min_router_group_gap"], mm.MIN_ROUTER_GAP)
                if c["family"] == "deepseek" and c["topk_method"] == "noaux_tc":
                    self.assertGreater(g["router_decisions_changed_by_bias"], 0)
                if c["family"] == "deepseek" and c["topk_method"] != "greedy" and c["topk_group"] < c["n_group"]:
                    self.assertGreater(g["router_decisions_changed_by_group_mask"], 0)
                self.assertLess(g["f32_reference_max_abs_dev"], 1e-4)
                self.assertTrue(g["f32_reference_tokens_match"])
                self.assertEqual([len(p) for p in g["prompts"]], list(c["prompt_lens"]))
        self.assertEqual({len(p) for p in _golden("dsv3_tiny_fp8")[1]["prompts"]}, {1, 5, 37})


# ----------------------------------------------------------------------------- loader

class Loader(unittest.TestCase):
    def _logits(self, cfg, t, prompt):
        m = ref.Model(ref.Config(cfg), t)
        return m.forward([(m.new_sequence(), prompt)])[0]

    def test_ignored_tensors(self):
        """The main model ignores the MTP layer (layer num_hidden_layers) and, under step3_vl, the
        vision tower: removing or changing them changes nothing. Where the config does not
        explain them they are rejected as unused."""
        d, g, _, cfg = _golden("dsv3_tiny_fp8")
        t = st.load_dir(d)
        mtp = [k for k in t if k.startswith(f"model.layers.{cfg['num_hidden_layers']}.")]
        self.assertIn(f"model.layers.{cfg['num_hidden_layers']}.eh_proj.weight", mtp)
        self.assertTrue(any(".mlp.experts." in k for k in mtp))
        a = self._logits(cfg, t, g["prompts"][0])
        b = self._logits(cfg, {k: v for k, v in t.items() if k not in mtp}, g["prompts"][0])
        self.assertTrue(np.array_equal(a, b))
        c0 = dict(cfg, num_nextn_predict_layers=0)
        with self.assertRaisesRegex(ValueError, "does not use"):
            ref.Model(ref.Config(c0), t)
        d, g, _, cfg = _golden("step3_tiny_fp8")
        t = st.load_dir(d)
        vis = [k for k in t if k.startswith("vision_model.")]
        self.assertEqual(len(vis), 1)
        a = self._logits(cfg, t, g["prompts"][0])
        t2 = dict(t)
        t2[vis[0]] = st.Tensor.from_float(np.full(t[vis[0]].shape, 7.0), "BF16")
        self.assertTrue(np.array_equal(a, self._logits(cfg, t2, g["prompts"][0])))
        self.assertTrue(np.array_equal(a, self._logits(cfg, {k: v for k, v in t.items() if k not in vis},
                                                       g["prompts"][0])))
        bare = dict(cfg["text_config"], quantization_config=cfg["quantization_config"])
        with self.assertRaisesRegex(ValueError, "does not use"):
            ref.Model(ref.Config(bare), t)
        self.assertTrue(np.array_equal(a, self._logits(bare, {k: v for k, v in t.items() if k not in vis},
                                                       g["prompts"][0])))

    def test_mtp_layout(self):
        """dsv3_tiny_fp8 holds one MTP module at layer id num_hidden_layers in the DeepSeek-V3
        layout: a MoE decoder layer (FP8), enorm / hnorm / shared_head.norm, a bf16 eh_proj
        [H, 2H], and embed_tokens / shared_head.head equal to the main model's."""
        d, _, _, cfg = _golden("dsv3_tiny_fp8")
        m = ref.Model.from_dir(d, load_mtp=True)
        M = m.mtp
        self.assertTrue(M["moe"])
        self.assertEqual(M["eh_proj"].shape, (cfg["hidden_size"], 2 * cfg["hidden_size"]))
        self.assertTrue(np.array_equal(M["embed"], m.embed))
        self.assertTrue(np.array_equal(M["head"], m.lm_head))
        t = st.load_dir(d)
        l = cfg["num_hidden_layers"]
        self.assertEqual(t[f"model.layers.{l}.eh_proj.weight"].dtype, "BF16")
        self.assertEqual(t[f"model.layers.{l}.self_attn.q_b_proj.weight"].dtype, "F8_E4M3")
        with self.assertRaisesRegex(ValueError, "num_nextn_predict_layers"):
            ref.Model.from_dir(os.path.join(DATA, "dsv3_tiny_bf16"), load_mtp=True)

    def test_errors_name_the_problem(self):
        d, g, _, cfg = _golden("dsv3_tiny_fp8")
        t = st.load_dir(d)
        k = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
        for mutate, pattern in [
                (lambda c, t: c.pop("quantization_config"), "no fp8 quantization_config"),
                (lambda c, t: t.pop(k + "_scale_inv"), k + "_scale_inv is missing"),
                (lambda c, t: t.__setitem__(k + "_scale_inv", st.Tensor("F32", np.ones((1, 2)))),
                 r"weight_scale_inv: shape \[1, 2\], expected \[2, 2\]"),
                (lambda c, t: t.__setitem__(k + "_scale_inv", st.Tensor("BF16", np.ones((2, 2), np.uint16))),
                 "expected F32"),
                (lambda c, t: c.update(scoring_func="relu"), "scoring_func"),
                (lambda c, t: c.update(topk_method="random"), "topk_method"),
                (lambda c, t: c.update(rope_scaling=dict(c["rope_scaling"], type="longrope")), "rope_scaling type"),
                (lambda c, t: c["rope_scaling"].pop("factor"), "rope_scaling.factor"),
                (lambda c, t: c.pop("kv_lora_rank"), "kv_lora_rank"),
                (lambda c, t: c.update(kv_lora_rank=96), "shape"),
                (lambda c, t: c.update(n_group=3), "n_group"),
                (lambda c, t: c.update(topk_group=5), "topk_group"),
                (lambda c, t: c["quantization_config"].update(quant_method="awq"), "quant_method"),
                (lambda c, t: c["quantization_config"].update(weight_block_size=[128]), "weight_block_size"),
                (lambda c, t: t.pop("model.layers.1.mlp.gate.e_score_correction_bias"), "e_score_correction_bias"),
                (lambda c, t: t.__setitem__("model.layers.1.mlp.gate.weight",
                                            st.Tensor("F8_E4M3", np.zeros((16, 144), np.uint8))), "keeps bf16"),
                (lambda c, t: t.__setitem__("model.norm.weight_scale_inv", st.Tensor("F32", np.ones((1, 1)))),
                 "scale for a weight stored as BF16|does not use")]:
            c2, t2 = copy.deepcopy(cfg), dict(t)
            mutate(c2, t2)
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(ValueError, pattern):
                    ref.Model(ref.Config(c2), t2)
        _, _, _, vl = _golden("step3_tiny_fp8")
        for mutate, pattern in [(lambda c: c.pop("text_config"), "text_config"),
                                (lambda c: c["text_config"].update(num_attention_groups=2), "num_attention_groups"),
                                (lambda c: c["text_config"].update(rope_scaling={"type": "yarn", "factor": 2}),
                                 "rope_scaling"),
                                (lambda c: c["text_config"].pop("share_q_dim"), "text_config.share_q_dim"),
                                (lambda c: c.update(model_type="step4"), "model_type")]:
            c2 = copy.deepcopy(vl)
            mutate(c2)
            with self.subTest(pattern=pattern):
                with self.assertRaisesRegex(ValueError, pattern):
                    ref.Config(c2)
        m = ref.Model(ref.Config(cfg), t)
        with self.assertRaisesRegex(ValueError, "outside vocabulary"):
            m.forward([(m.new_sequence(), [cfg["vocab_size"]])])


# ----------------------------------------------------------------------------- MTP drafting

MTP_DATA = os.path.join(HERE, "mtp")


def _mtp_case(name):
    d = os.path.join(MTP_DATA, name)
    with open(os.path.join(d, "mtp_drafts.json")) as f:
        g = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return d, g, cfg, st.load_dir(d)


class MtpDrafts(unittest.TestCase):
    """Recursive MTP drafting (mtp_draft_ref.py) and its golden (make_golden_mtp.py, mtp/)."""

    def test_golden_drafts_reproduce(self):
        import make_golden_mtp as gm
        for c in gm.CASES:
            with self.subTest(case=c["name"]):
                _, g, cfg, t = _mtp_case(c["name"])
                m = ref.Model(ref.Config(cfg), t, load_mtp=True)
                rows, margins = gm.draft_all(m, g["sequences"])
                self.assertEqual(rows, g["positions"])
                self.assertLess(float(np.max(np.abs(np.asarray(margins) - np.asarray(g["margins"])))), 1e-6)
                self.assertEqual(len(rows), sum(len(s) - 1 for s in g["sequences"]))
                self.assertGreater(min(min(x) for x in g["margins"]), gm.MIN_GAP)
                self.assertGreater(g["positions_changed_if_normed_fed"], 0)

    def test_a_full_recompute_in_torch_drafts_the_same(self):
        """torch_mirror_mla_mfa.mtp_padded recomputes the module over the true rows 0..i and the
        speculative rows (b, d) so far, without a cache: it drafts the golden's ids with logits
        within 1e-10 of the reference's (every position of every sequence)."""
        _torch()
        import torch_mirror_mla_mfa as tm
        for name in ("dsv3_mtp_own_head", "dsv3_mtp_shared_head"):
            with self.subTest(case=name):
                _, g, cfg, t = _mtp_case(name)
                m = ref.Model(ref.Config(cfg), t, load_mtp=True)
                n = 0
                for s, toks in enumerate(g["sequences"]):
                    _, hid = m.forward([(m.new_sequence(), toks)], return_hidden=True)
                    want = [r[2:] for r in g["positions"] if r[0] == s]
                    seq = m.new_mtp_sequence()
                    for i in range(len(toks) - 1):
                        hs, ts = list(hid[0][:i + 1]), list(toks[1:i + 2])
                        for j in range(g["k"]):
                            logits, z = tm.mtp_padded(cfg, t, np.asarray(hs), ts)
                            d = int(np.argmax(logits[-1]))
                            self.assertEqual(d, want[i][j], (s, i, j))
                            n += 1
                            if j == 0:   # the cached reference at position i on the true inputs
                                r = m.mtp_forward(seq, hid[0][i:i + 1], [toks[i + 1]])
                                self.assertLess(float(np.max(np.abs(r[0] - logits[-1]))), 1e-10)
                            hs.append(z[-1])
                            ts.append(d)
                self.assertEqual(n, len(g["positions"]) * g["k"])

    def test_truncate_then_recompute_equals_never_appended(self):
        _, g, cfg, t = _mtp_case("dsv3_mtp_shared_head")
        m = ref.Model(ref.Config(cfg), t, load_mtp=True)
        toks = g["sequences"][1]
        _, hid = m.forward([(m.new_sequence(), toks)], return_hidden=True)
        h = hid[0]
        a, b = m.new_mtp_sequence(), m.new_mtp_sequence()
        m.mtp_forward(a, h[:6], toks[1:7])
        m.mtp_forward(b, h[:6], toks[1:7])
        _, z = m.mtp_forward(a, h[6:7], toks[7:8], return_block=True)
        m.mtp_forward(a, z, [5])
        m.mtp_forward(a, z, [9])
        self.assertEqual(a.length, 9)
        a.truncate(7)
        a.truncate(8)     # no-op: beyond the length
        self.assertEqual(a.length, 7)
        m.mtp_forward(b, h[6:7], toks[7:8])
        self.assertEqual(b.length, 7)
        la = m.mtp_forward(a, h[7:10], toks[8:11])
        lb = m.mtp_forward(b, h[7:10], toks[8:11])
        self.assertTrue(np.array_equal(la, lb))

    def test_absent_embed_and_head_are_the_main_models(self):
        _, _, cfg, t = _mtp_case("dsv3_mtp_shared_head")
        m = ref.Model(ref.Config(cfg), t, load_mtp=True)
        self.assertIs(m.mtp["embed"], m.embed)
        self.assertIs(m.mtp["head"], m.lm_head)
        _, _, cfg, t = _mtp_case("dsv3_mtp_own_head")
        l = cfg["num_hidden_layers"]
        m = ref.Model(ref.Config(cfg), t, load_mtp=True)
        self.assertFalse(np.array_equal(m.mtp["embed"], m.embed))
        self.assertFalse(np.array_equal(m.mtp["head"], m.lm_head))
        t2 = {k: v for k, v in t.items() if k != f"model.layers.{l}.shared_head.head.weight"}
        m2 = ref.Model(ref.Config(cfg), t2, load_mtp=True)
        self.assertTrue(np.array_equal(m2.mtp["embed"], m.mtp["embed"]))
        self.assertIs(m2.mtp["head"], m2.lm_head)


if __name__ == "__main__":
    unittest.main(verbosity=1)
