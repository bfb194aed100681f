#!/usr/bin/python3
"""Convert an afd qwen3_moe checkpoint (HF safetensors + tokenizer.json) to one GGUF file.

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

Supported checkpoints: model_type qwen3_moe, every layer MoE (decoder_sparse_step 1, no
mlp_only_layers), norm_topk_prob true, no rope_scaling, bf16/f16/f32 tensors, expert tensors
per expert (mlp.experts.E.*_proj) or fused (mlp.experts.gate_up_proj / down_proj). llama.cpp's
qwen3moe graph renormalises the top-k weights and has no dense-layer variant, so other
settings are refused rather than converted to a different model.
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


def _stack(parts):
    return lambda: np.stack([p() for p in parts])


def plan_tensors(gguf, st, cfg, outtype):
    T = gguf.GGMLQuantizationType
    L = int(cfg["num_hidden_layers"])
    E = int(cfg["num_experts"])

    def typed(name_out, src_names, shape, kind):
        """kind: 'norm' | 'router' | 'embed' | 'linear'. src_names: one name or a list to stack."""
        names = src_names if isinstance(src_names, list) else [src_names]
        bf16 = all(st.dtype(n) == "BF16" for n in names)

        def values(raw):
            get = st.raw if raw else st.f32
            return np.stack([get(n) for n in names]) if len(names) > 1 else get(names[0])

        if kind in ("norm", "router") or outtype == "f32" or not bf16 and outtype == "bf16":
            return Out(name_out, shape, T.F32, lambda: values(False))
        if outtype == "q8_0" and kind == "linear" and shape[-1] % 32 == 0:
            return Out(name_out, shape, T.Q8_0, lambda: gguf.quants.quantize(values(False), T.Q8_0))
        if not bf16:
            return Out(name_out, shape, T.F32, lambda: values(False))
        return Out(name_out, shape, T.BF16, lambda: values(True))

    def check_shape(name, want):
        got = st.shape(name)
        if tuple(got) != tuple(want):
            raise ConvertError(f"tensor {name}: shape {list(got)}, config implies {list(want)}")

    H, V = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    nh, nkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    hd = int(cfg.get("head_dim") or H // nh)
    I = int(cfg["moe_intermediate_size"])
    outs = []
    check_shape("model.embed_tokens.weight", (V, H))
    outs.append(typed("token_embd.weight", "model.embed_tokens.weight", (V, H), "embed"))
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
            check_shape(hf, shp)
            outs.append(typed(b + gg, hf, shp, kind))
        m = p + "mlp.experts."
        if st.has(m + "gate_up_proj"):
            check_shape(m + "gate_up_proj", (E, 2 * I, H))
            check_shape(m + "down_proj", (E, H, I))
            outs.extend(fused_experts(gguf, st, m, b, E, I, H, outtype))
        else:
            for proj, gg, shp in [("gate_proj", "ffn_gate_exps", (I, H)), ("up_proj", "ffn_up_exps", (I, H)),
                                  ("down_proj", "ffn_down_exps", (H, I))]:
                names = [f"{m}{e}.{proj}.weight" for e in range(E)]
                for n in names:
                    check_shape(n, shp)
                outs.append(typed(b + gg + ".weight", names, (E,) + shp, "linear"))
    check_shape("model.norm.weight", (H,))
    outs.append(typed("output_norm.weight", "model.norm.weight", (H,), "norm"))
    if st.has("lm_head.weight"):
        check_shape("lm_head.weight", (V, H))
        outs.append(typed("output.weight", "lm_head.weight", (V, H), "embed"))
    elif not cfg.get("tie_word_embeddings", False):
        raise ConvertError("checkpoint has no lm_head.weight and tie_word_embeddings is false")
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


def nbytes_of(gguf, out):
    n = int(np.prod(out.shape, dtype=np.int64))
    T = gguf.GGMLQuantizationType
    if out.qtype == T.Q8_0:
        return n // 32 * 34
    return n * {T.F32: 4, T.BF16: 2, T.F16: 2}[out.qtype]


# ---------------------------------------------------------------- tokenizer

def add_tokenizer(gguf, w, model_dir, cfg):
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
    # afd's writer splits with the Qwen2 pattern (serve/text/pre_tokenizer.h, SplitPattern::qwen2).
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = cfg.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if eos_ids:
        w.add_eos_token_id(int(eos_ids[0]))
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(int(cfg["bos_token_id"]))
    w.add_add_bos_token(False)
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path, encoding="utf-8") as f:
            tc = json.load(f)
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


def check_config(cfg, model_dir):
    where = os.path.join(model_dir, "config.json")
    if cfg.get("model_type") != "qwen3_moe":
        raise ConvertError(f"{where}: model_type {cfg.get('model_type')!r}; only qwen3_moe is supported")
    if cfg.get("quantization_config"):
        raise ConvertError(f"{where}: quantized checkpoints are not supported; convert the bf16 checkpoint")
    if int(cfg.get("decoder_sparse_step", 1)) != 1 or cfg.get("mlp_only_layers"):
        raise ConvertError(f"{where}: dense layers (decoder_sparse_step != 1 or mlp_only_layers) have no "
                           "llama.cpp qwen3moe equivalent")
    if not cfg.get("norm_topk_prob", False):
        raise ConvertError(f"{where}: norm_topk_prob false; llama.cpp's qwen3moe always renormalises the top-k weights")
    if cfg.get("rope_scaling"):
        raise ConvertError(f"{where}: rope_scaling is not supported")


def convert(model_dir, out_path, outtype, llama_cpp):
    gguf = load_gguf_py(llama_cpp)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    check_config(cfg, model_dir)
    st = SafeTensors(model_dir)
    outs = plan_tensors(gguf, st, cfg, outtype)

    w = gguf.GGUFWriter(out_path, "qwen3moe")
    H, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    hd = int(cfg.get("head_dim") or H // nh)
    w.add_name(os.path.basename(os.path.normpath(model_dir)))
    w.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "f32": gguf.LlamaFileType.ALL_F32}[outtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
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
    add_tokenizer(gguf, w, model_dir, cfg)

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
    args = ap.parse_args()
    try:
        n, total = convert(args.model, args.out, args.outtype, args.llama_cpp)
    except (ConvertError, OSError, KeyError, ValueError) as e:
        print(f"gguf_convert: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {n} tensors, {total / 1e6:.1f} MB of tensor data ({args.outtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
