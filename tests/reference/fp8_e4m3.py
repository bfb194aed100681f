"""float8 e4m3fn and the 128x128 block weight format of DeepSeek-V3 / Step-3 FP8 checkpoints
(numpy only), written from the format definition (MODELS.md section C).

e4m3fn bits s|eeee|mmm, exponent bias 7: e = 0 is subnormal, (-1)^s * 2^-6 * m/8; otherwise
(-1)^s * 2^(e-7) * (1 + m/8). e = 15, m = 7 is NaN; there is no infinity; max finite 448.

Block format: a weight W [..., out, in] is stored as codes Wq (e4m3, same shape) plus
weight_scale_inv [..., ceil(out/B0), ceil(in/B1)] float32, and
W[r, c] = e4m3(Wq[r, c]) * weight_scale_inv[r // B0, c // B1]. Leading dimensions (Step-3's
stacked experts [E, out, in]) carry their own scales [E, bo, bi]. Edge blocks are partial: a
block that runs past the last row or column covers only the elements that exist.
"""

import numpy as np

MAX_FINITE = 448.0
NAN_CODES = (0x7F, 0xFF)
BLOCK = (128, 128)


def decode(codes):
    """uint8 codes -> float64 values (NaN for 0x7F / 0xFF)."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 0x7).astype(np.float64)
    mag = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1.0 + m / 8.0, e - 7))
    out = s * mag
    return np.where((e == 15) & ((c & 0x7) == 7), np.nan, out)


def encode(x):
    """float values -> uint8 e4m3fn codes: round to nearest, ties to even mantissa, magnitudes
    that round above 448 saturate to 448. Inputs must be finite."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("fp8 encode: non-finite input")
    sign = np.signbit(x)
    a = np.abs(x)
    # Grid spacing at |x|: 2^(e-3) with e = floor(log2 |x|) clamped below at -6 (subnormals share
    # the spacing 2^-9 of the lowest binade). np.rint rounds half to even, and an even multiple
    # of the spacing has an even mantissa, so this is round-to-nearest-even.
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, -6.0)
    # log2 can be off by one ulp near powers of two: fix e so that 2^e <= a < 2^(e+1)
    e = np.where((a >= np.ldexp(1.0, (e + 1).astype(np.int64))) & (a > 0), e + 1, e)
    e = np.where((a < np.ldexp(1.0, e.astype(np.int64))) & (e > -6), e - 1, e)
    step = np.ldexp(1.0, (e - 3).astype(np.int64))
    q = np.rint(a / step) * step
    q = np.minimum(q, MAX_FINITE)
    # value -> code. q is 0, a subnormal k * 2^-9 (k = 1..7) or a normal (1 + m/8) 2^E.
    sub = q < 2.0 ** -6
    k = np.rint(q / 2.0 ** -9)
    with np.errstate(divide="ignore"):
        E = np.floor(np.log2(np.where(sub, 1.0, q)))
    mant = np.rint((np.where(sub, 1.0, q) / np.ldexp(1.0, E.astype(np.int64)) - 1.0) * 8.0)
    code_norm = ((E + 7).astype(np.int64) << 3) | mant.astype(np.int64)
    code = np.where(sub, k.astype(np.int64), code_norm)
    code = code | np.where(sign, 0x80, 0)
    return code.astype(np.uint8)


def scale_shape(shape, block=BLOCK):
    """[..., out, in] -> [..., ceil(out/B0), ceil(in/B1)]."""
    *lead, o, i = shape
    return (*lead, -(-o // block[0]), -(-i // block[1]))


def expand_scales(scale_inv, shape, block=BLOCK):
    """scale_inv [..., bo, bi] -> per-element multipliers [..., out, in] (edge blocks cropped)."""
    s = np.asarray(scale_inv, dtype=np.float64)
    s = np.repeat(np.repeat(s, block[0], axis=-2), block[1], axis=-1)
    return s[..., :shape[-2], :shape[-1]]


def dequantize(codes, scale_inv, block=BLOCK):
    """codes [..., out, in] uint8 + scale_inv [..., bo, bi] float32 -> float64 weights."""
    codes = np.asarray(codes)
    want = scale_shape(codes.shape, block)
    if tuple(np.shape(scale_inv)) != want:
        raise ValueError(f"weight_scale_inv shape {list(np.shape(scale_inv))}, expected {list(want)} "
                         f"for a weight of shape {list(codes.shape)} with blocks {list(block)}")
    return decode(codes) * expand_scales(scale_inv, codes.shape, block)


def block_amax(w, block=BLOCK):
    """max |w| per block: [..., out, in] -> [..., bo, bi]. Zero padding to whole blocks does
    not change the max of magnitudes."""
    w = np.abs(np.asarray(w, dtype=np.float64))
    *lead, o, i = w.shape
    bo, bi = scale_shape(w.shape, block)[-2:]
    pad = np.zeros((*lead, bo * block[0], bi * block[1]))
    pad[..., :o, :i] = w
    pad = pad.reshape(*lead, bo, block[0], bi, block[1])
    return pad.max(axis=(-3, -1))


def quantize(w, block=BLOCK):
    """float weights [..., out, in] -> (codes uint8, scale_inv float32 [..., bo, bi]).
    Per block: s = amax / 448 rounded to float32 (an all-zero block gets s = 1), codes =
    e4m3(w / s) rounded to nearest even and saturated at 448; s is stored as weight_scale_inv."""
    w = np.asarray(w, dtype=np.float64)
    amax = block_amax(w, block)
    s = np.where(amax > 0, amax / MAX_FINITE, 1.0).astype(np.float32)
    codes = encode(w / expand_scales(s, w.shape, block))
    return codes, s
