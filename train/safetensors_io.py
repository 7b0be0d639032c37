"""Hand-written safetensors reader/writer (the format is an 8-byte little-endian header length,
a JSON header, then raw little-endian tensor data), so no package outside Debian is needed."""
from __future__ import annotations

import json
import struct

import numpy as np
import torch

_DTYPES = {
    "F32": np.float32, "F16": np.float16, "F64": np.float64,
    "I32": np.int32, "I64": np.int64, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def save(path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes tensors (torch tensors or numpy arrays), sorted by name, with string metadata.
    bfloat16 torch tensors are written as BF16 (numpy has no bfloat16: their bits as int16)."""
    arrays = {name: _to_numpy(t) for name, t in sorted(tensors.items())}
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in arrays.items():
        bf16 = isinstance(tensors[name], torch.Tensor) and tensors[name].dtype == torch.bfloat16
        if a.dtype not in _NAMES and not bf16:
            raise ValueError(f"{name}: unsupported dtype {a.dtype}")
        header[name] = {"dtype": "BF16" if bf16 else _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for a in arrays.values():
            f.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())


def header(path) -> dict:
    """The JSON header alone ({name: {dtype, shape, data_offsets}}, __metadata__ dropped),
    without reading the tensors."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        out = json.loads(f.read(n))
    out.pop("__metadata__", None)
    return out


def load(path) -> tuple[dict, dict]:
    """Returns ({name: torch tensor}, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header runs past the end of the file")
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        bf16 = info["dtype"] == "BF16"
        dt = np.dtype(np.int16 if bf16 else _DTYPES[info["dtype"]]).newbyteorder("<")
        start, end = info["data_offsets"]
        if end > len(data) or end - start != dt.itemsize * int(np.prod(info["shape"])):
            raise ValueError(f"{path}: tensor {name} has bad data offsets")
        a = np.frombuffer(data[start:end], dtype=dt).reshape(info["shape"])
        out[name] = torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=True))
        if bf16:
            out[name] = out[name].view(torch.bfloat16)
    return out, meta


def _to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        if t.dtype == torch.bfloat16:
            t = t.contiguous().view(torch.int16)
        return np.ascontiguousarray(t.numpy())
    return np.ascontiguousarray(t)
