"""Reading and publishing the files of a ViewStore folder.

A store file is read once: the bytes that go by feed a sha256 (checked against the manifest) while they are
parsed. A finished store is written to a temporary sibling folder and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np

from .errors import ViewStoreError


class HashingReader:
    """Reads of one open file that also feed a sha256, so the one read of a store file both parses and
    checks it. Chunks are hashed right after they are read, while they are still in the CPU cache."""

    CHUNK = 1 << 22

    def __init__(self, fh):
        self.fh, self.sha = fh, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.sha.update(data)
        return data

    def fill(self, array: np.ndarray) -> None:
        """Read exactly ``array.nbytes`` bytes into a C-contiguous ``array``."""
        view = memoryview(array.reshape(-1).view(np.uint8))
        pos = 0
        while pos < len(view):
            n = self.fh.readinto(view[pos : pos + self.CHUNK])
            if not n:
                raise ValueError(f"file ends after {pos} of {len(view)} data bytes")
            self.sha.update(view[pos : pos + n])
            pos += n


def parse_npy(reader: HashingReader) -> np.ndarray:
    """A ``.npy`` array read through ``reader`` (header by numpy's own parser, data straight into place)."""
    fmt = np.lib.format
    version = fmt.read_magic(reader)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy format version {version} is not one this store writes")
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, fortran, dtype = read_header(reader)
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed")
    # A Fortran-ordered file holds the bytes of the transpose in C order.
    array = np.empty(shape[::-1] if fortran else shape, dtype)
    reader.fill(array)
    return array.T if fortran else array


def publish(tmp: Path, final: Path, overwrite: bool) -> None:
    """Move the finished folder ``tmp`` to ``final``; replace an existing *store* only with ``overwrite``."""
    if final.exists():
        if not overwrite:
            raise ViewStoreError(f"{final} already exists (pass overwrite=True / --overwrite to replace it)")
        if any(final.iterdir()) and not (final / "manifest.json").exists():
            raise ViewStoreError(f"{final} exists and is not a ViewStore; refusing to replace it")
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
