#!/usr/bin/python3
"""Self-tests of the correctness oracle. Run: /usr/bin/python3 tests/reference/test_reference.py
(exits non-zero on failure)."""

import copy
import json
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_moe_ref as ref  # noqa: E402
import make_golden  # noqa: E402
import reference  # noqa: E402
import safetensors_io as st  # noqa: E402

DATA = os.path.join(HERE, "data")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def load_manifest():
    with open(os.path.join(DATA, "manifest.json")) as f:
        return json.load(f)


def load_golden(name):
    d = os.path.join(DATA, name)
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    logits = np.fromfile(os.path.join(d, g["logits_file"]), dtype="<f4").reshape(-1, g["vocab_size"])
    return d, g, logits


def case_spec(name):
    return next(c for c, _ in make_golden.all_cases() if c["name"] == name)


def case_writer(name):
    """The generator module (make_golden or make_golden_mla_mfa) that writes case `name`."""
    return next(w for c, w in make_golden.all_cases() if c["name"] == name)


def hf_cases():
    """Manifest entries of the cases hf_moe_ref implements (Qwen3-MoE, Qwen2-MoE, Mixtral)."""
    return [c for c in load_manifest()["cases"] if c["model_type"] in ("qwen3_moe", "qwen2_moe", "mixtral")]


def flat(rows):
    return np.concatenate([np.asarray(r) for r in rows])


class GoldenData(unittest.TestCase):
    def test_manifest_lists_every_case_dir(self):
        m = load_manifest()
        names = [c["name"] for c in m["cases"]]
        self.assertEqual(sorted(names), sorted(c["name"] for c, _ in make_golden.all_cases()))
        for n in names:
            self.assertTrue(os.path.isfile(os.path.join(DATA, n, "golden.json")), n)
        dirs = [d for d in os.listdir(DATA) if os.path.isdir(os.path.join(DATA, d))]
        self.assertEqual(sorted(dirs), sorted(names))

    def test_coverage(self):
        cases = hf_cases()
        self.assertEqual({1, 2, 4} - {c["gqa_ratio"] for c in cases}, set())
        self.assertEqual({1, 2, 8} - {c["top_k"] for c in cases}, set())
        for key in ("shared_expert", "tied_embeddings", "norm_topk_prob", "sharded"):
            self.assertEqual({c[key] for c in cases}, {True, False}, key)
        self.assertIn("fused", {c["expert_layout"] for c in cases})
        self.assertEqual({"qwen3_moe", "qwen2_moe", "mixtral"}, {c["model_type"] for c in cases})
        self.assertTrue(any(c["head_dim"] * c["heads"] != c["hidden_size"] for c in cases))
        self.assertTrue(any(c["dense_layers"] for c in cases))

    def test_golden_reproduces(self):
        """Recomputing from the committed checkpoint gives the committed logits and tokens,
        and the row table matches the documented order."""
        for c in load_manifest()["cases"]:
            with self.subTest(case=c["name"]):
                d, g, logits = load_golden(c["name"])
                model = reference.load_model(d)
                rows, toks = ref.greedy(model, g["prompts"], g["max_new_tokens"])
                self.assertEqual(toks, g["greedy_tokens"])
                self.assertTrue(np.array_equal(flat(rows).astype("<f4"), logits))
                table = ref.row_table(g["prompts"], g["max_new_tokens"])
                self.assertEqual([list(t) for t in table], g["rows"])
                self.assertEqual(len(table), logits.shape[0])
                # each generated token is the argmax of the row before it
                r = 0
                for i, p in enumerate(g["prompts"]):
                    n = len(p) + g["max_new_tokens"] - 1
                    chosen = np.argmax(logits[r + len(p) - 1:r + n], axis=1)
                    self.assertEqual(list(chosen), g["greedy_tokens"][i])
                    r += n
                # the gaps the generator promised
                cfg = read_json(os.path.join(d, "config.json"))
                gen = read_json(os.path.join(d, "generation_config.json"))
                used = {t for s in g["prompts"] + g["greedy_tokens"] for t in s}
                self.assertNotIn(cfg["eos_token_id"], used)
                gen_eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
                self.assertIn(cfg["eos_token_id"], gen_eos)
                self.assertFalse(used & set(gen_eos))
                self.assertGreater(g["min_top2_logit_gap"], make_golden.MIN_GAP)
                # every continuation holds max_new_tokens ids (the C++ loader takes greedy[i].size())
                self.assertEqual({len(t) for t in g["greedy_tokens"]}, {g["max_new_tokens"]})

    def test_f32_within_tolerance(self):
        """The same reference run in float32 stays within the 1e-4 logits tolerance the C++
        reference mode is held to, with identical greedy tokens."""
        for c in load_manifest()["cases"]:
            with self.subTest(case=c["name"]):
                d, g, logits = load_golden(c["name"])
                m32 = reference.load_model(d, np.float32)
                rows, toks = ref.greedy(m32, g["prompts"], g["max_new_tokens"])
                self.assertEqual(toks, g["greedy_tokens"])
                self.assertLess(float(np.max(np.abs(flat(rows).astype(np.float64) - logits))), 1e-4)


class Invariances(unittest.TestCase):
    def test_batched_equals_alone(self):
        for c in load_manifest()["cases"]:
            with self.subTest(case=c["name"]):
                d, g, _ = load_golden(c["name"])
                model = reference.load_model(d)
                rows_b, toks_b = ref.greedy(model, g["prompts"], 8, batched=True)
                rows_a, toks_a = ref.greedy(model, g["prompts"], 8, batched=False)
                self.assertEqual(toks_a, toks_b)
                self.assertLess(float(np.max(np.abs(flat(rows_a) - flat(rows_b)))), 1e-12)

    def test_prefill_equals_token_by_token(self):
        d, g, _ = load_golden("qwen3_gqa2_top2_untied")
        model = ref.Model.from_dir(d)
        p = g["prompts"][2]
        whole = model.forward([(model.new_sequence(), p)])[0]
        seq = model.new_sequence()
        steps = np.concatenate([model.forward([(seq, [t])])[0] for t in p])
        self.assertLess(float(np.max(np.abs(whole - steps))), 1e-12)

    def test_mirror_agrees(self):
        """hf_torch_mirror (padded full recompute, HF-style routing) agrees with the
        reference on every committed case, teacher-forced on the golden tokens."""
        import hf_torch_mirror as mirror
        for c in hf_cases():
            with self.subTest(case=c["name"]):
                d, g, logits = load_golden(c["name"])
                cfg = ref.Config.from_dir(d)
                tensors = st.load_dir(d)
                seqs = [p + t[:-1] for p, t in zip(g["prompts"], g["greedy_tokens"])]
                out = np.concatenate(mirror.forward_padded(cfg, tensors, seqs))
                model = ref.Model(cfg, tensors)
                rows, _ = ref.greedy(model, g["prompts"], g["max_new_tokens"])
                self.assertLess(float(np.max(np.abs(out - flat(rows)))), 1e-10)


class Layouts(unittest.TestCase):
    def _unfuse(self, tensors, cfg):
        out = dict(tensors)
        I = cfg.moe_intermediate_size
        for l in range(cfg.n_layers):
            m = f"model.layers.{l}.mlp.experts."
            if m + "gate_up_proj" not in out:
                continue
            gu = out.pop(m + "gate_up_proj").raw
            dn = out.pop(m + "down_proj").raw
            for e in range(cfg.n_experts):
                out[m + f"{e}.gate_proj.weight"] = st.Tensor("BF16", gu[e, :I])
                out[m + f"{e}.up_proj.weight"] = st.Tensor("BF16", gu[e, I:])
                out[m + f"{e}.down_proj.weight"] = st.Tensor("BF16", dn[e])
        return out

    def test_fused_case_equals_unfused(self):
        d, g, _ = load_golden("qwen3_gqa4_top8_fused")
        cfg = ref.Config.from_dir(d)
        fused = st.load_dir(d)
        self.assertIn("model.layers.0.mlp.experts.gate_up_proj", fused)
        a = ref.greedy(ref.Model(cfg, fused), g["prompts"], 6)
        b = ref.greedy(ref.Model(cfg, self._unfuse(fused, cfg)), g["prompts"], 6)
        self.assertEqual(a[1], b[1])
        self.assertTrue(np.array_equal(flat(a[0]), flat(b[0])))

    def test_per_expert_case_equals_fused(self):
        for name in ("qwen3_gqa2_top2_untied", "qwen2moe_shared"):
            with self.subTest(case=name):
                d, g, _ = load_golden(name)
                cfg = ref.Config.from_dir(d)
                per = st.load_dir(d)
                fused = make_golden.fuse_experts(per, cfg)
                self.assertNotIn("model.layers.0.mlp.experts.0.gate_proj.weight", fused)
                a = ref.greedy(ref.Model(cfg, per), g["prompts"], 6)
                b = ref.greedy(ref.Model(cfg, fused), g["prompts"], 6)
                self.assertEqual(a[1], b[1])
                self.assertTrue(np.array_equal(flat(a[0]), flat(b[0])))

    def test_swapped_gate_up_changes_output(self):
        """The fused test above would pass if gate/up were both misread the same way; check
        that the order matters at all."""
        d, g, _ = load_golden("qwen3_gqa4_top8_fused")
        cfg = ref.Config.from_dir(d)
        t = st.load_dir(d)
        swapped = dict(t)
        I = cfg.moe_intermediate_size
        for l in range(cfg.n_layers):
            k = f"model.layers.{l}.mlp.experts.gate_up_proj"
            raw = t[k].raw
            swapped[k] = st.Tensor("BF16", np.concatenate([raw[:, I:], raw[:, :I]], axis=1))
        a = ref.Model(cfg, t).forward([(ref.Sequence(cfg.n_layers), g["prompts"][0])])[0]
        b = ref.Model(cfg, swapped).forward([(ref.Sequence(cfg.n_layers), g["prompts"][0])])[0]
        self.assertGreater(float(np.max(np.abs(a - b))), 1e-3)

    def test_sharded_loads_same_tensors(self):
        name = "qwen3_dense_sharded"
        d, g, _ = load_golden(name)
        self.assertTrue(os.path.isfile(os.path.join(d, st.INDEX_NAME)))
        self.assertFalse(os.path.exists(os.path.join(d, st.SINGLE_NAME)))
        loaded = st.load_dir(d)
        regenerated = make_golden.make_tensors(case_spec(name), g["seed"])
        self.assertEqual(sorted(loaded), sorted(regenerated))
        for k in loaded:
            self.assertEqual(loaded[k].dtype, "BF16")
            self.assertTrue(np.array_equal(loaded[k].raw, regenerated[k].raw), k)
        index = read_json(os.path.join(d, st.INDEX_NAME))
        self.assertEqual(index["metadata"]["total_size"], sum(t.nbytes() for t in loaded.values()))
        files = set(index["weight_map"].values())
        self.assertEqual(files, {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
        with tempfile.TemporaryDirectory() as tmp:
            st.write_file(os.path.join(tmp, st.SINGLE_NAME), loaded)
            single = st.load_dir(tmp)
        for k in loaded:
            self.assertTrue(np.array_equal(loaded[k].raw, single[k].raw), k)

    def test_committed_weights_match_generator(self):
        for c in load_manifest()["cases"]:
            with self.subTest(case=c["name"]):
                d, g, _ = load_golden(c["name"])
                loaded = st.load_dir(d)
                regen = case_writer(c["name"]).make_tensors(case_spec(c["name"]), g["seed"])
                self.assertEqual(sorted(loaded), sorted(regen))
                self.assertTrue(all(loaded[k].dtype == regen[k].dtype for k in loaded))
                self.assertTrue(all(np.array_equal(loaded[k].raw, regen[k].raw) for k in loaded))


class Pieces(unittest.TestCase):
    def test_rope_matches_complex_rotation(self):
        """NEOX rotate-half == rotating the complex pairs (x[i], x[i+half]) by pos*inv_freq[i]."""
        rng = np.random.default_rng(0)
        hd, theta = 16, 10000.0
        x = rng.normal(size=(5, 3, hd))
        pos = np.array([0, 1, 7, 30, 99])
        cos, sin = ref.rope_cos_sin(pos, hd, theta, np.float64)
        got = ref.apply_rope(x, cos, sin)
        half = hd // 2
        z = x[..., :half] + 1j * x[..., half:]
        ang = pos[:, None] * theta ** (-np.arange(half) * 2.0 / hd)
        zr = z * np.exp(1j * ang)[:, None, :]
        want = np.concatenate([zr.real, zr.imag], axis=-1)
        self.assertLess(float(np.max(np.abs(got - want))), 1e-12)

    def test_moe_equals_dense_mixture(self):
        """Routed MoE output == sum over all experts of (masked, optionally renormalised
        softmax weight) * expert(h), computed densely."""
        for name in ("qwen3_gqa1_top1_tied", "qwen3_gqa2_top2_untied", "qwen2moe_shared", "mixtral_top2",
                     "qwen3_gqa4_top8_fused"):
            with self.subTest(case=name):
                d, g, _ = load_golden(name)
                model = ref.Model.from_dir(d)
                cfg = model.cfg
                L = next(L for L in model.layers if L["moe"])
                h = np.random.default_rng(1).normal(size=(9, cfg.hidden_size))
                got = model._moe(0, L, h)
                logits = h @ L["router"].T
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                kth = -np.sort(-logits, axis=1)[:, cfg.top_k - 1:cfg.top_k]
                w = np.where(logits >= kth, p, 0.0)
                if cfg.norm_topk_prob:
                    w /= w.sum(1, keepdims=True)
                want = np.zeros_like(h)
                for e in range(cfg.n_experts):
                    y = (h @ L["eg"][e].T) / (1 + np.exp(-(h @ L["eg"][e].T))) * (h @ L["eu"][e].T) @ L["ed"][e].T
                    want += w[:, e:e + 1] * y
                if "sg" in L:
                    s = ref.silu(h @ L["sg"].T) * (h @ L["su"].T) @ L["sd"].T
                    want += s / (1 + np.exp(-(h @ L["sgate"].T)))
                self.assertLess(float(np.max(np.abs(got - want))), 1e-12)

    def test_moe_layer_rule(self):
        cfg = ref.Config.from_dir(os.path.join(DATA, "qwen3_dense_sharded"))
        self.assertEqual([cfg.is_moe_layer(l) for l in range(4)], [False, True, False, True])
        cfg = ref.Config.from_dir(os.path.join(DATA, "qwen2moe_sparse_step"))
        self.assertEqual([cfg.is_moe_layer(l) for l in range(4)], [False, True, False, True])
        d = read_json(os.path.join(DATA, "qwen3_dense_sharded", "config.json"))
        d.update(decoder_sparse_step=2, mlp_only_layers=[3])
        self.assertEqual([ref.Config(d).is_moe_layer(l) for l in range(4)], [False, True, False, False])

    def test_bf16_round_trip(self):
        x = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0, 1.00390625, 1.01171875], dtype=np.float32)
        bits = st.f32_to_bf16_bits(x)
        back = st.bf16_bits_to_f32(bits)
        self.assertTrue(np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8))
        # ties go to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7
        self.assertEqual(float(back[5]), 1.0)
        self.assertEqual(float(back[6]), 1.015625)


class CheckLogitsTool(unittest.TestCase):
    TOOL = os.path.join(HERE, "check_logits.py")

    def _run(self, *args):
        import subprocess
        p = subprocess.run([sys.executable, self.TOOL, *args, "--json"], capture_output=True, text=True)
        return p.returncode, (json.loads(p.stdout) if p.returncode in (0, 1) else p.stderr)

    def test_golden_dump_passes_and_perturbed_fails(self):
        d, g, logits = load_golden("qwen2moe_shared")
        with tempfile.TemporaryDirectory() as tmp:
            rc, rep = self._run(d, os.path.join(d, "logits.f32"))
            self.assertEqual(rc, 0, rep)
            self.assertLess(rep["max_abs_err"], 1e-6)
            bad = logits.copy()
            bad[40, 7] += 2e-4
            path = os.path.join(tmp, "bad.f32")
            bad.tofile(path)
            rc, rep = self._run(d, path)
            self.assertEqual(rc, 1)
            self.assertEqual(rep["worst_row"]["row"], 40)
            with open(path, "ab") as f:
                f.write(b"\0" * 4)
            rc, _ = self._run(d, path)
            self.assertEqual(rc, 2)

    def test_mla_mfa_cases(self):
        """The tool runs the DeepSeek / Step-3 reference for those model types: the golden dump
        passes, a 2e-4 perturbation fails."""
        for name in ("dsv3_tiny_fp8", "step3_tiny_fp8"):
            with self.subTest(case=name):
                d, g, logits = load_golden(name)
                rc, rep = self._run(d, os.path.join(d, "logits.f32"))
                self.assertEqual(rc, 0, rep)
                self.assertEqual(rep["max_new_tokens"], 8)
                self.assertLess(rep["max_abs_err"], 1e-6)
                with tempfile.TemporaryDirectory() as tmp:
                    bad = logits.copy()
                    bad[10, 3] -= 2e-4
                    path = os.path.join(tmp, "bad.f32")
                    bad.tofile(path)
                    rc, rep = self._run(d, path)
                    self.assertEqual(rc, 1)
                    self.assertEqual(rep["worst_row"]["row"], 10)

    def test_teacher_forced_on_other_tokens(self):
        """A dump that followed different tokens (explicit prompts, --gen-ids) is compared
        against the reference fed those same tokens."""
        d, g, _ = load_golden("mixtral_top2")
        prompts = [[5, 9, 11], [3]]
        n = 6
        forced = [[1, 2, 3, 4, 5, 6], [7, 7, 7, 8, 8, 8]]
        rows, _ = ref.greedy(ref.Model.from_dir(d, np.float32), prompts, n, forced=forced)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "dump.f32")
            flat(rows).astype("<f4").tofile(path)
            args = [d, path, "5,9,11", "3", "--gen-ids", "1,2,3,4,5,6", "--gen-ids", "7,7,7,8,8,8"]
            rc, rep = self._run(*args)
            self.assertEqual(rc, 0, rep)
            self.assertEqual(rep["max_new_tokens"], n)
            self.assertLess(rep["max_abs_err"], 1e-4)
            self.assertTrue(rep["greedy_divergence"])
            args[-1] = "7,7,7,8,8,9"  # the last token is never fed: still the same rows
            self.assertEqual(self._run(*args)[0], 0)
            args[-1] = "7,7,9,8,8,8"
            self.assertEqual(self._run(*args)[0], 1)


class SafetensorsErrors(unittest.TestCase):
    def _write(self, tmp, header, data=b""):
        h = json.dumps(header).encode()
        path = os.path.join(tmp, "model.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)
        return path

    def test_rejects_bad_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = [
                ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4),   # truncated
                ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),   # shape lies
                ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),    # dtype
                ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),                           # no offsets
            ]
            for header, data in bad:
                path = self._write(tmp, header, data)
                with self.assertRaises(st.SafetensorsError):
                    st.read_file(path)
            path = os.path.join(tmp, "short.safetensors")
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", 1000) + b"{}")
            with self.assertRaises(st.SafetensorsError):
                st.read_file(path)

    def test_model_rejects_shape_mismatch_and_missing_tensor(self):
        d = os.path.join(DATA, "mixtral_top2")
        cfg = ref.Config.from_dir(d)
        t = st.load_dir(d)
        t2 = dict(t)
        del t2["model.norm.weight"]
        with self.assertRaisesRegex(ValueError, "model.norm.weight"):
            ref.Model(cfg, t2)
        bad_cfg = copy.deepcopy(cfg.raw)
        bad_cfg["intermediate_size"] = 48
        with self.assertRaisesRegex(ValueError, "shape"):
            ref.Model(ref.Config(bad_cfg), t)
        model = ref.Model(cfg, t)
        with self.assertRaisesRegex(ValueError, "outside vocabulary"):
            model.forward([(model.new_sequence(), [cfg.vocab_size])])
        with self.assertRaisesRegex(ValueError, "max_position_embeddings"):
            model.forward([(model.new_sequence(), [0] * (cfg.max_position_embeddings + 1))])


# the DeepSeek / Step-3 / FP8 self-tests run in the same unittest.main
from test_mla_mfa import Fp8Format, Loader, MlaMfaModel, MtpDrafts, RopeYarn, Routing  # noqa: E402,F401

if __name__ == "__main__":
    unittest.main(verbosity=1)
