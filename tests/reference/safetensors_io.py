"""Minimal safetensors reader/writer (numpy only) for afd's correctness oracle.

Format: 8-byte little-endian u64 header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__"},
then the data; offsets are relative to the first byte after the header.

BF16 has no numpy dtype: BF16 tensors are carried as uint16 bit patterns and
converted with bf16_bits_to_f32 / f32_to_bf16_bits (round to nearest even). F8_E4M3 tensors
are carried as uint8 codes and decoded by fp8_e4m3.decode (block scales are separate tensors).
"""

import json
import os
import struct

import numpy as np

import fp8_e4m3

# safetensors dtype name -> (numpy dtype used to hold the raw data, bytes per element)
_DTYPES = {
    "BF16": (np.dtype("<u2"), 2),
    "F8_E4M3": (np.dtype("u1"), 1),
    "F16": (np.dtype("<f2"), 2),
    "F32": (np.dtype("<f4"), 4),
    "F64": (np.dtype("<f8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I64": (np.dtype("<i8"), 8),
}


class SafetensorsError(ValueError):
    pass


def f32_to_bf16_bits(a):
    """float array -> uint16 BF16 bit patterns, round to nearest even (finite inputs)."""
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = a.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(bits):
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Tensor:
    """A tensor as stored: dtype name ("BF16", "F8_E4M3", "F32", ...), shape, raw numpy array
    (uint16 bits for BF16, uint8 codes for F8_E4M3)."""

    def __init__(self, dtype, raw):
        if dtype not in _DTYPES:
            raise SafetensorsError(f"unsupported dtype {dtype}")
        self.dtype = dtype
        self.raw = np.ascontiguousarray(raw.astype(_DTYPES[dtype][0], copy=False))

    @property
    def shape(self):
        return tuple(self.raw.shape)

    def to_f64(self):
        if self.dtype == "BF16":
            return bf16_bits_to_f32(self.raw).astype(np.float64)
        if self.dtype == "F8_E4M3":
            return fp8_e4m3.decode(self.raw)
        return self.raw.astype(np.float64)

    @staticmethod
    def from_float(a, dtype="BF16"):
        a = np.asarray(a)
        if dtype == "BF16":
            return Tensor("BF16", f32_to_bf16_bits(a))
        return Tensor(dtype, a.astype(_DTYPES[dtype][0]))

    def nbytes(self):
        return self.raw.nbytes


def write_file(path, tensors, metadata=None):
    """Writes {name: Tensor} to `path`. Data is laid out in sorted-name order; the header
    is padded with spaces to a multiple of 8 bytes (as the reference implementation does)."""
    header = {}
    offset = 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        n = t.nbytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata is None:
        metadata = {"format": "pt"}
    header = {"__metadata__": metadata, **header}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in names:
            f.write(tensors[name].raw.tobytes(order="C"))


def read_file(path):
    """Reads a .safetensors file -> {name: Tensor}. Raises SafetensorsError naming the
    file and tensor on any inconsistency."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise SafetensorsError(f"{path}: header length {n} exceeds file size {len(blob)}")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(f"{path}: tensor {name}: malformed header entry") from e
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        np_dtype, size = _DTYPES[dtype]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if any(s < 0 for s in shape) or not (0 <= begin <= end <= len(data)) or end - begin != count * size:
            raise SafetensorsError(
                f"{path}: tensor {name}: offsets [{begin},{end}] disagree with dtype {dtype} shape {shape} "
                f"or data size {len(data)}")
        raw = np.frombuffer(data[begin:end], dtype=np_dtype).reshape(shape).copy()
        out[name] = Tensor(dtype, raw)
    return out


INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def write_sharded(model_dir, tensors, shards):
    """Writes `tensors` into len(shards) files model-0000i-of-0000n.safetensors plus the
    index. `shards` is a list of lists of tensor names (a partition of tensors)."""
    n = len(shards)
    weight_map = {}
    seen = set()
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_file(os.path.join(model_dir, fname), {k: tensors[k] for k in names})
        for k in names:
            weight_map[k] = fname
            seen.add(k)
    if seen != set(tensors):
        raise ValueError("shards do not partition the tensors")
    total = sum(t.nbytes() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(model_dir, INDEX_NAME), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def load_dir(model_dir):
    """Loads every tensor of a model directory: model.safetensors.index.json (sharded)
    when present, else model.safetensors. -> {name: Tensor}."""
    index_path = os.path.join(model_dir, INDEX_NAME)
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            raise SafetensorsError(f"{index_path}: missing weight_map")
        out = {}
        for fname in sorted(set(weight_map.values())):
            part = read_file(os.path.join(model_dir, fname))
            for k, t in part.items():
                if weight_map.get(k) != fname:
                    raise SafetensorsError(f"{fname}: tensor {k} not mapped to this file in {INDEX_NAME}")
                out[k] = t
        missing = set(weight_map) - set(out)
        if missing:
            raise SafetensorsError(f"{index_path}: tensors missing from their shards: {sorted(missing)[:5]}")
        return out
    return read_file(os.path.join(model_dir, SINGLE_NAME))
