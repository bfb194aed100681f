"""Pieces the two references (hf_moe_ref.py, mla_mfa_ref.py) share: the elementwise math,
the flattening of a batch of (sequence, new tokens), and the embedding / final norm / LM head
load. Written from the model semantics like the rest of this directory; numpy only, computed
in the dtype of the inputs."""

import numpy as np


def rms_norm(x, w, eps):
    """x [n, d] (or [..., d]); HF: x * rsqrt(mean(x^2) + eps) * w."""
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def checked_tensor(tensors, used, name, shape):
    """tensors[name] (a safetensors_io tensor), which must have `shape`; marks it in `used`."""
    if name not in tensors:
        raise ValueError(f"missing tensor {name}")
    t = tensors[name]
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"tensor {name}: shape {list(t.shape)} disagrees with config {list(shape)}")
    used.add(name)
    return t


def flatten_batch(batch, vocab_size, max_positions, limit_name):
    """batch: list of (Sequence with .length, tokens). Checks every token id against the
    vocabulary and each sequence's new length against max_positions (0 = no limit; the error
    names limit_name). -> (token ids [T], positions [T], [(sequence, start, end)] row ranges)."""
    toks, positions, segs = [], [], []
    for seq, t in batch:
        t = [int(x) for x in t]
        if not t:
            raise ValueError("empty token list")
        for x in t:
            if not 0 <= x < vocab_size:
                raise ValueError(f"token id {x} outside vocabulary [0, {vocab_size})")
        if max_positions and seq.length + len(t) > max_positions:
            raise ValueError(f"context longer than {limit_name}")
        start = len(toks)
        toks += t
        positions += list(range(seq.length, seq.length + len(t)))
        segs.append((seq, start, len(toks)))
    return toks, positions, segs


def load_embed_norm_head(get, cfg, used):
    """get(name, shape) -> array. -> (embed [V, H], final norm [H], lm_head [V, H]). With
    tie_word_embeddings the LM head is the embedding and a stored lm_head.weight is ignored
    (marked in `used`), as in HF."""
    H, V = cfg.hidden_size, cfg.vocab_size
    embed = get("model.embed_tokens.weight", (V, H))
    final_norm = get("model.norm.weight", (H,))
    if cfg.tie_word_embeddings:
        used.add("lm_head.weight")
        return embed, final_norm, embed
    return embed, final_norm, get("lm_head.weight", (V, H))
