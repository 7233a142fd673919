"""A safetensors file written piece by piece, for tensors too large to hold in memory at once.

``safetensors.torch.save_file`` needs every tensor in memory. A checkpoint of a population whose private states
live in files (:class:`.file_store.FileStore`) would then read all of them into memory at every checkpoint,
which is what keeping them in files avoids. :func:`save_streamed` writes the same file format (an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then the tensors'
bytes back to back) from :class:`StreamedTensor` sources that hand over their bytes in blocks, and from ordinary
tensors. The file is read back with safetensors itself, like every other checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import torch

#: safetensors' names of the dtypes a checkpoint holds
DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
               torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
               torch.bool: "BOOL"}


def bytes_of(shape: tuple, dtype: torch.dtype) -> int:
    """The bytes of a C-ordered tensor of ``shape`` and ``dtype``."""
    return int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()


class StreamedTensor:
    """A tensor's shape and dtype, and its bytes (C order) in blocks: subclasses implement :meth:`blocks`."""

    def __init__(self, shape: tuple, dtype: torch.dtype):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype

    @property
    def nbytes(self) -> int:   # as ``torch.Tensor.nbytes``, so the writer reads either the same way
        return bytes_of(self.shape, self.dtype)

    def blocks(self):
        """Yield the tensor's bytes in order, as bytes-like objects."""
        raise NotImplementedError


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor, without a copy when it is contiguous."""
    t = t.detach().cpu().contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _header(tensors: dict) -> bytes:
    entries, offset = {}, 0
    for name, t in tensors.items():
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} cannot be stored in a checkpoint")
        nbytes = t.nbytes
        entries[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    return header + b" " * (-len(header) % 8)   # the data starts 8-byte aligned, as safetensors writes it


def save_streamed(tensors: dict, path) -> str:
    """Write ``tensors`` ({name: torch.Tensor or StreamedTensor}) as a safetensors file at ``path``; returns the
    file's sha256, taken as it is written (a run folder lists it without reading gigabytes back)."""
    header = _header(tensors)
    digest = hashlib.sha256()

    def put(f, data) -> int:
        digest.update(data)
        return f.write(data)

    with open(path, "wb") as f:
        put(f, struct.pack("<Q", len(header)))
        put(f, header)
        for name, t in tensors.items():
            expected = t.nbytes
            written = 0
            for block in (t.blocks() if isinstance(t, StreamedTensor) else (tensor_bytes(t),)):
                written += put(f, block)
            if written != expected:   # a source that lies about its size would corrupt every later tensor
                raise ValueError(f"tensor {name!r}: its source gave {written} bytes, {expected} expected")
    return digest.hexdigest()
