"""Per-client private state in files: the compact store's tables, one file per parameter, read and written a
chunk of clients at a time (``--private-store file``).

:class:`~.store.CompactStore` keeps every client's state in memory, which at 35,598 FedVLR routers is 1.75 GB of
the process's peak, and grows with the population. :class:`FileStore` keeps the same rows in files instead:
row ``r`` of parameter ``p`` is bytes ``[r * row_bytes, (r + 1) * row_bytes)`` of ``p``'s file. A chunk's rows
are read with one positioned read per run of consecutive rows (``os.preadv``) into a fresh tensor, trained, and
written back the same way, so the process holds a chunk's states, not the population's. Reads and writes go
through the page cache, which the kernel may keep or drop; it is not the process's memory.

Everything else is the compact store's: rows in first-write order, the round bookkeeping (writes are in place;
``begin_round`` after an interrupted round that had changed stored states refuses, and the run resumes from its
checkpoint), the snapshot's layout. The files are working files, not a record: they have no name on disk once
opened (the space goes back when the process ends, however it ends), a checkpoint holds the states (written from
the files in blocks, :class:`TableRows`), and a resumed run restores them from there. The same bytes are stored
either way, so a run gives the same numbers with either store.
"""

from __future__ import annotations

import errno
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...atomic_write import make_dirs, output_error
from ...errors import RunFolderError, UserError
from .store import CompactStore
from .streamed_safetensors import StreamedTensor, bytes_of, rows_per_block, tensor_bytes


@dataclass
class _Table:
    """One parameter's file: its descriptor, the shape and dtype of a row, and how many rows the file holds."""

    path: Path
    fd: int
    shape: tuple
    dtype: torch.dtype
    row_bytes: int
    rows: int = field(default=0)


def _grow(table: _Table, rows: int) -> None:
    """Make the table's file ``rows`` rows long and reserve its disk space now, so that a disk too small for the
    population's states stops the run at its start, not rounds later (where a file system cannot reserve, the
    file is extended sparsely)."""
    old, new = table.rows * table.row_bytes, rows * table.row_bytes
    try:
        os.ftruncate(table.fd, new)
        if new > old and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(table.fd, old, new - old)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
    except OSError as exc:
        raise output_error(table.path, exc) from None


def _read_exactly(table: _Table, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``offset`` of the table's file (one read may return less: Linux stops at 2 GB)."""
    while len(view):
        got = os.preadv(table.fd, [view], offset)
        if got == 0:
            raise RunFolderError(
                str(table.path),
                "a private-state table ends before the rows it should hold",
                "resume the run from its checkpoint (--resume RUN_DIR)",
            )
        view, offset = view[got:], offset + got


def _write_fully(table: _Table, view: memoryview, offset: int) -> None:
    """Write ``view`` at ``offset`` of the table's file; a full disk is one line naming the file."""
    try:
        while len(view):  # a positioned write may write less than asked: go on from where it stopped
            n = os.pwrite(table.fd, view, offset)
            view, offset = view[n:], offset + n
    except OSError as exc:
        raise output_error(table.path, exc) from None


def memory_file_system(path, mounts: str | None = None) -> str | None:
    """The type of the file system holding ``path`` when it keeps its files in memory (``tmpfs``, ``ramfs``: a
    ``/tmp`` on many systems), where files save no memory; else None. ``mounts``: ``/proc/mounts``' text."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:  # not Linux: nothing to say
            return None
    where, best = str(Path(path).resolve()), ("", None)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best[1] if best[1] in ("tmpfs", "ramfs") else None


def consecutive_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` positions of ``rows`` whose values go up by one from ``rows[start]`` to ``rows[end - 1]``:
    each run is one contiguous byte range of a table's file."""
    if not len(rows):
        return []
    cuts = (np.flatnonzero(np.diff(rows) != 1) + 1).tolist()
    return list(zip([0] + cuts, cuts + [len(rows)]))


class FileStore(CompactStore):
    """A :class:`~.store.CompactStore` whose tables are files under ``root`` (see the module docstring)."""

    kind = "file"

    def __init__(self, root: str | os.PathLike, capacity: int = 0):
        if not hasattr(os, "preadv"):
            raise UserError(
                "--private-store file",
                "this platform has no positioned file reads (os.preadv)",
                "use --private-store memory",
            )
        super().__init__(capacity)
        self.root = Path(root)
        make_dirs(self.root)
        self._tables: dict[str, _Table] = {}
        kind = memory_file_system(self.root)
        if kind is not None:
            warnings.warn(
                f"--private-store file: {self.root.parent} is on a {kind} (memory), so the state files "
                "save no memory there; set TMPDIR to a folder on disk",
                RuntimeWarning,
                stacklevel=2,
            )

    def view_block(self, cids, names, dtype: torch.dtype | None = None):
        return None  # rows live in files: a chunk trains a copy and hands it back to save_block

    # ------------------------------------------------------------------ the tables' files
    def _reserve(self, name: str, vals: torch.Tensor, top: int) -> None:
        table = self._tables.get(name)
        shape = tuple(vals.shape[1:])
        if table is not None and table.shape != shape:
            raise ValueError(f"private state {name!r}: shape {shape} does not match the stored {table.shape}")
        if table is None:
            table = self._open_table(name, shape, vals.dtype)
            self._has[name] = np.zeros(0, dtype=bool)
        if table.rows >= top:
            return
        # the population's size where known (one reservation), else doubling as clients come
        rows = self.capacity if top <= self.capacity else max(top, 2 * table.rows)
        _grow(table, rows)
        has = np.zeros(rows, dtype=bool)
        has[: len(self._has[name])] = self._has[name]
        self._has[name], table.rows = has, rows

    def _open_table(self, name: str, shape: tuple, dtype: torch.dtype) -> _Table:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        path = self.root / f"{len(self._tables):03d}-{safe}.rows"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        # unlinked at once: the file lives while the process holds it open, so a run that is killed leaves no
        # gigabytes behind in $TMPDIR (the name stays in messages, for the folder it was in)
        os.unlink(path)
        self._tables[name] = table = _Table(path, fd, shape, dtype, bytes_of(shape, dtype))
        return table

    def _read_rows(self, name: str, rows: np.ndarray) -> torch.Tensor:
        table = self._tables[name]
        rows = np.asarray(rows, dtype=np.int64)
        out = torch.empty((len(rows),) + table.shape, dtype=table.dtype)
        buf = memoryview(out.view(-1).view(torch.uint8).numpy()) if out.numel() else None
        for a, b in consecutive_runs(rows):
            _read_exactly(table, buf[a * table.row_bytes : b * table.row_bytes], int(rows[a]) * table.row_bytes)
        return out

    def _write_rows(self, name: str, rows: np.ndarray, vals: torch.Tensor) -> None:
        table = self._tables[name]
        data = vals.detach().to(device="cpu", dtype=table.dtype).contiguous()
        buf = memoryview(data.view(-1).view(torch.uint8).numpy()) if data.numel() else None
        for a, b in consecutive_runs(np.asarray(rows, dtype=np.int64)):
            _write_fully(table, buf[a * table.row_bytes : b * table.row_bytes], int(rows[a]) * table.row_bytes)

    def _snapshot_rows(self, name: str, rows: np.ndarray, copy: bool):
        """A fresh tensor; with ``copy=False`` (a checkpoint written at once) a source that reads the rows in
        blocks while the checkpoint is written, so the states are never all in memory."""
        if copy:
            return self._read_rows(name, rows)
        return TableRows(self, name, rows)

    def _clear_tables(self) -> None:
        self.close()
        self._has = {}

    def close(self) -> None:
        """Close the tables' files, which gives their space back (they have no name on disk)."""
        for table in getattr(self, "_tables", {}).values():
            try:
                os.close(table.fd)
            except OSError:
                pass
        self._tables = {}

    def __del__(self):
        self.close()


class TableRows(StreamedTensor):
    """Rows ``rows`` of a file store's table, read ``ROW_BLOCK_BYTES`` at a time when written out."""

    def __init__(self, store: FileStore, name: str, rows: np.ndarray):
        table = store._tables[name]
        super().__init__((len(rows),) + table.shape, table.dtype)
        self.store, self.name, self.rows = store, name, np.asarray(rows, dtype=np.int64)

    def blocks(self):
        per_block = rows_per_block(self.store._tables[self.name].row_bytes)
        for a in range(0, len(self.rows), per_block):
            yield tensor_bytes(self.store._read_rows(self.name, self.rows[a : a + per_block]))
