"""A safetensors file written piece by piece, for tensors too large to hold in memory at once.

``safetensors.torch.save_file`` needs every tensor in memory. A checkpoint of a population whose private states
live in files (:class:`.file_store.FileStore`) would then read all of them into memory at every checkpoint,
which is what keeping them in files avoids. :func:`save_streamed` writes the same file format (an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then the tensors'
bytes back to back) from :class:`StreamedTensor` sources that hand over their bytes in blocks, and from ordinary
tensors. The file is read back with safetensors itself, like every other checkpoint, or, to resume such a run
without the states in memory, with :func:`load_streamed`: its large tensors stay on disk as :class:`StoredTensor`
and are read a block of rows at a time (positioned reads, not a memory map, whose pages would count as the
process's memory while it is open).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import torch

#: safetensors' names of the dtypes a checkpoint holds
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
#: a header longer than this is not one this package wrote (safetensors' own limit is 100 MB)
MAX_HEADER_BYTES = 100_000_000
#: the most bytes of a state table read at once while it is written to or restored from a file (a population's
#: table is never held whole: it is streamed this many bytes of rows at a time)
ROW_BLOCK_BYTES = 1 << 26


def bytes_of(shape: tuple, dtype: torch.dtype) -> int:
    """The bytes of a C-ordered tensor of ``shape`` and ``dtype``."""
    return int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()


def rows_per_block(row_bytes: int) -> int:
    """How many rows of ``row_bytes`` bytes make one block of at most :data:`ROW_BLOCK_BYTES` (at least one)."""
    return max(1, ROW_BLOCK_BYTES // max(int(row_bytes), 1))


class StreamedTensor:
    """A tensor's shape and dtype, and its bytes (C order) in blocks: subclasses implement :meth:`blocks`."""

    def __init__(self, shape: tuple, dtype: torch.dtype):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype

    @property
    def nbytes(self) -> int:  # as ``torch.Tensor.nbytes``, so the writer reads either the same way
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
        entries[name] = {
            "dtype": DTYPE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    return header + b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as safetensors writes it


def save_streamed(tensors: dict, path, with_digest: bool = True) -> str | None:
    """Write ``tensors`` ({name: torch.Tensor or StreamedTensor}) as a safetensors file at ``path``; returns the
    file's sha256, taken as it is written (a run folder lists it without reading gigabytes back), or None without
    ``with_digest``. A file already at ``path`` is written over in place and cut to the new length: rewriting
    pages the kernel already holds costs far less than filling new ones (a kept copy is rewritten often)."""
    header = _header(tensors)
    digest = hashlib.sha256() if with_digest else None

    def put(f, data) -> int:
        if digest is not None:
            digest.update(data)
        return f.write(data)

    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666), "wb") as f:
        put(f, struct.pack("<Q", len(header)))
        put(f, header)
        for name, t in tensors.items():
            expected = t.nbytes
            written = 0
            for block in t.blocks() if isinstance(t, StreamedTensor) else (tensor_bytes(t),):
                written += put(f, block)
            if written != expected:  # a source that lies about its size would corrupt every later tensor
                raise ValueError(f"tensor {name!r}: its source gave {written} bytes, {expected} expected")
        f.truncate()
    return digest.hexdigest() if digest is not None else None


class StoredTensor:
    """A tensor left in a safetensors file: its shape and dtype, read whole or a range of rows (along the first
    dimension) at a time."""

    def __init__(self, path, shape: tuple, dtype: torch.dtype, offset: int):
        self.path, self.shape, self.dtype, self.offset = path, tuple(shape), dtype, int(offset)

    @property
    def nbytes(self) -> int:
        return bytes_of(self.shape, self.dtype)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` as a fresh tensor."""
        out = torch.empty((stop - start,) + self.shape[1:], dtype=self.dtype)
        return self._fill(out, start * bytes_of(self.shape[1:], self.dtype))

    def load(self) -> torch.Tensor:
        return self._fill(torch.empty(self.shape, dtype=self.dtype), 0)

    def _fill(self, out: torch.Tensor, skip: int) -> torch.Tensor:
        view = tensor_bytes(out)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.offset + skip)
            while len(view):  # a raw read may return less than asked (Linux stops at 2 GB)
                got = f.readinto(view)
                if not got:
                    raise ValueError(f"{self.path}: the file ends inside a tensor")
                view = view[got:]
        return out


def read_header(path) -> tuple[dict, int]:
    """A safetensors file's tensor entries (``__metadata__`` left out) and where its data starts; ``ValueError``
    when the header is not a safetensors header or names bytes outside the file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"header length {n} does not fit the file")
        entries = json.loads(f.read(n))
    if not isinstance(entries, dict):
        raise ValueError("the header is not a JSON object")
    entries.pop("__metadata__", None)
    start = 8 + n
    for name, e in entries.items():
        a, b = e["data_offsets"]
        if (
            e["dtype"] not in DTYPES
            or not 0 <= a <= b <= size - start
            or b - a != bytes_of(tuple(e["shape"]), DTYPES[e["dtype"]])
        ):
            raise ValueError(f"tensor {name!r}: its entry does not fit the file")
    return entries, start


def load_streamed(path, on_disk_from: int) -> dict:
    """The tensors of a safetensors file: those of at least ``on_disk_from`` bytes as :class:`StoredTensor`
    (nothing read yet), the others read into memory."""
    entries, start = read_header(path)
    out = {}
    for name, e in entries.items():
        stored = StoredTensor(path, tuple(e["shape"]), DTYPES[e["dtype"]], start + e["data_offsets"][0])
        out[name] = stored if stored.nbytes >= on_disk_from else stored.load()
    return out


def loaded(obj):
    """``obj`` with every :class:`StoredTensor` in it (in dicts, lists and tuples) read into memory."""
    if isinstance(obj, StoredTensor):
        return obj.load()
    if isinstance(obj, dict):
        return {k: loaded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(loaded(v) for v in obj)
    return obj
