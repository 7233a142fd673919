"""Per-client private state: named tensors that never leave the client, kept between rounds.

Three stores with one protocol (and :class:`~.file_store.FileStore`, the compact store with its tables in files):

- :class:`CompactStore` keeps one tensor per parameter over all clients (the engine's in-memory store: memory is
  the states' own bytes, with no per-client objects, and a chunk of clients is read and written in one call);
- :class:`MemoryStore` keeps every client's state in a dict (any shapes; the alignment modules);
- :class:`DiskStore` keeps one file per client under a folder (large populations, or a real device).

A round writes into a *pending* layer and publishes it with :meth:`commit`, so an interrupted round never leaves a
mixture of old and new client states behind: ``begin_round`` discards what an unfinished round wrote, ``load``
sees pending writes first (evaluation of the round runs before the commit), and the engine commits only after the
round's checkpoint is safely on disk. :class:`DiskStore` makes that crash-safe with a ``READY`` marker (see
:meth:`DiskStore.recover`).

Stored tensors are treated as immutable: ``load`` returns the stored tensors themselves and callers copy before
changing anything (the trainers always do).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ...atomic_write import atomic_write, atomic_write_text, make_dirs
from ...errors import RunFolderError
from .streamed_safetensors import StoredTensor, bytes_of, loaded, rows_per_block

State = dict[str, torch.Tensor]


def atomic_torch_save(obj, path: Path) -> None:
    """Write tensors (a dict of them) with torch.save to a temporary file, flush it to disk, then rename it into
    place; a failure leaves no temporary file. Read such files back with ``weights_only=True`` only."""
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


class MemoryStore:
    kind = "memory"

    def __init__(self):
        self._committed: dict[int, State] = {}
        self._pending: dict[int, State] = {}

    def load(self, cid: int) -> State | None:
        cid = int(cid)
        state = self._pending.get(cid)
        return state if state is not None else self._committed.get(cid)

    def save(self, cid: int, state: State, *, copy: bool = True) -> None:
        # copy=False: the caller hands over fresh tensors it will not touch again
        self._pending[int(cid)] = {k: v.detach().clone() for k, v in state.items()} if copy else dict(state)

    def __contains__(self, cid) -> bool:
        return int(cid) in self._pending or int(cid) in self._committed

    def __len__(self) -> int:
        return len(set(self._pending) | set(self._committed))

    def begin_round(self, round: int) -> None:
        self._pending = {}

    def prepare(self, round: int) -> None:
        pass

    def commit(self) -> None:
        self._committed.update(self._pending)
        self._pending = {}

    def snapshot(self) -> dict[int, State]:
        out = dict(self._committed)
        out.update(self._pending)
        return out

    def restore(self, snapshot: dict[int, State]) -> None:
        self._committed = {int(k): dict(v) for k, v in snapshot.items()}
        self._pending = {}


class CompactStore:
    """Every client's private state as one tensor per parameter, ``[capacity, *shape]``, one row per client.

    Rows are given out in the order clients are first written. A simulator writes its chunks in the same order
    every round, so the clients of a chunk sit in one contiguous range of rows, which :meth:`view_block` hands
    out as the tables' own rows: the chunk trains them in place, and the round neither copies the states out nor
    back (at 35,598 FedVLR routers that is 1.75 GB each way a round).

    Writes go straight into those tensors: a second copy of all states for a pending layer would double the
    memory of a large population. What a round writes is therefore published at once; ``begin_round`` can still
    discard the rows of clients that the unfinished round created, and refuses (``RuntimeError``) when it had
    already overwritten stored states, which only the run's checkpoint can bring back. A write outside a round
    (between ``commit`` and the next ``begin_round``) is simply stored. ``load`` returns copies.
    """

    kind = "memory"

    def __init__(self, capacity: int = 0, *, pin_memory: bool = False):
        # the population size where known: the tables are made that large at once instead of growing by doubling
        # (a table grown past the last client's row would be up to twice the states' bytes, plus a copy)
        self.capacity = int(capacity)
        # page-locked tables for a simulator on a GPU: its chunks' rows cross the bus at full speed both ways
        self.pin_memory = bool(pin_memory)
        self._cols: dict[str, torch.Tensor] = {}
        self._has: dict[str, np.ndarray] = {}  # per row: whether it holds a value of the parameter
        self._row = np.full(0, -1, dtype=np.int64)  # client id -> its row (-1: never written)
        self._rows = 0
        self._in_round = False  # between begin_round and commit
        self._created: set[int] = set()  # clients first written by the uncommitted round
        self._overwrote = False  # the uncommitted round changed stored states

    # ------------------------------------------------------------------ rows
    def _rows_of(self, cids: np.ndarray) -> np.ndarray:
        """The rows of ``cids`` (-1 for a client never written)."""
        out = np.full(len(cids), -1, dtype=np.int64)
        inside = cids < len(self._row)
        out[inside] = self._row[cids[inside]]
        return out

    def _assign_rows(self, cids: np.ndarray) -> np.ndarray:
        """The rows of ``cids``, new clients given the next free rows in the order listed."""
        top = int(cids.max()) + 1
        if top > len(self._row):
            grown = np.full(max(top, self.capacity, 2 * len(self._row)), -1, dtype=np.int64)
            grown[: len(self._row)] = self._row
            self._row = grown
        new = cids[self._row[cids] < 0]
        if len(new):
            self._row[new] = np.arange(self._rows, self._rows + len(new))
            self._rows += len(new)
        return self._row[cids]

    def _present(self, name: str, rows: np.ndarray) -> np.ndarray:
        has = self._has.get(name)
        mask = np.zeros(len(rows), dtype=bool)
        if has is not None:
            inside = (rows >= 0) & (rows < len(has))
            mask[inside] = has[rows[inside]]
        return mask

    # ------------------------------------------------------------------ one client
    def load(self, cid: int) -> State | None:
        row = self._rows_of(np.array([int(cid)]))
        out = {k: self._read_rows(k, row)[0] for k in self._has if self._present(k, row)[0]}
        return out or None

    def save(self, cid: int, state: State, *, copy: bool = True) -> None:
        self.save_block(np.array([int(cid)]), {k: v.detach().unsqueeze(0) for k, v in state.items()})

    # ------------------------------------------------------------------ a block of clients
    def load_block(self, cids, names) -> dict[str, tuple[torch.Tensor | None, np.ndarray]]:
        """``{name: (values [C, ...] with zeros where absent, present mask [C])}``; values are copies, None where
        no client of ``cids`` holds the parameter."""
        cids = np.asarray(cids, dtype=np.int64)
        rows = self._rows_of(cids)
        out = {}
        for name in names:
            mask = self._present(name, rows)
            if not mask.any():  # a parameter never stored, or none of these clients' (round 1's chunks)
                out[name] = (None, mask)
                continue
            vals = self._read_rows(name, np.where(mask, rows, 0))
            if not mask.all():
                vals[torch.from_numpy(~mask)] = 0
            out[name] = (vals, mask)
        return out

    def view_block(self, cids, names, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor] | None:
        """The stored rows of ``cids`` themselves (views, to be trained in place and handed back to
        :meth:`save_block`), or None unless every client holds every parameter (in ``dtype``, if given) in one
        contiguous range of rows in that order. Inside a round the views count as overwriting stored states."""
        cids = np.asarray(cids, dtype=np.int64)
        rows = self._rows_of(cids)
        if not len(cids) or rows[0] < 0 or not np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows))):
            return None
        if not all(
            name in self._cols and self._present(name, rows).all() and dtype in (None, self._cols[name].dtype)
            for name in names
        ):
            return None
        if self._in_round:
            self._overwrote = True
        a, b = int(rows[0]), int(rows[-1]) + 1
        return {name: self._cols[name][a:b] for name in names}

    def save_block(self, cids, block: dict[str, torch.Tensor]) -> None:
        """Store row ``c`` of every ``block[name]`` as client ``cids[c]``'s value of ``name`` (rows that are the
        store's own, from :meth:`view_block`, are already in place)."""
        cids = np.asarray(cids, dtype=np.int64)
        if not len(cids):
            return
        rows = self._assign_rows(cids)
        for name, vals in block.items():
            self._reserve(name, vals, int(rows.max()) + 1)
            has = self._has[name]
            if self._in_round:
                self._overwrote |= bool(has[rows].any())
                self._created.update(int(c) for c in cids[~has[rows]])
            self._write_rows(name, rows, vals)
            has[rows] = True

    # ------------------------------------------------------------------ where the rows live (here: memory)
    def _read_rows(self, name: str, rows: np.ndarray) -> torch.Tensor:
        """A fresh tensor of ``name``'s values at ``rows``."""
        return self._cols[name].index_select(0, torch.from_numpy(np.asarray(rows, dtype=np.int64)))

    def _write_rows(self, name: str, rows: np.ndarray, vals: torch.Tensor) -> None:
        col = self._cols[name]
        if not _is_rows_of(vals, col, rows):
            col.index_copy_(0, torch.from_numpy(rows), vals.detach().to(col.dtype))

    def _clear_tables(self) -> None:
        self._cols, self._has = {}, {}

    def _reserve(self, name: str, vals: torch.Tensor, top: int) -> None:
        col = self._cols.get(name)
        if col is not None and tuple(col.shape[1:]) != tuple(vals.shape[1:]):
            raise ValueError(
                f"private state {name!r}: shape {tuple(vals.shape[1:])} does not match the stored "
                f"{tuple(col.shape[1:])}"
            )
        if col is not None and len(col) >= top:
            return
        if col is None:
            cap = max(top, self.capacity)
        else:
            doubled = 2 * len(col)
            cap = max(top, min(doubled, self.capacity) if self.capacity else doubled)
        # empty, not zeroed: a row is read only once ``has`` marks it written, and zeroing a population's tables
        # would be one more pass over their whole size (1.75 GB at 35,598 FedVLR routers)
        new = _empty_table((cap,) + tuple(vals.shape[1:]), vals.dtype if col is None else col.dtype, self.pin_memory)
        has = np.zeros(cap, dtype=bool)
        if col is not None:
            new[: len(col)] = col
            has[: len(col)] = self._has[name]
        self._cols[name], self._has[name] = new, has

    # ------------------------------------------------------------------ the store protocol
    def _clients_with(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(client ids holding ``name``, in row order; their rows)."""
        cids = np.flatnonzero(self._row >= 0)
        cids = cids[np.argsort(self._row[cids], kind="stable")]
        rows = self._row[cids]
        keep = self._present(name, rows)
        return cids[keep], rows[keep]

    def __contains__(self, cid) -> bool:
        rows = self._rows_of(np.array([int(cid)]))
        return any(self._present(name, rows)[0] for name in self._has)

    def __len__(self) -> int:
        cids = np.flatnonzero(self._row >= 0)
        rows = self._row[cids]
        return int(np.logical_or.reduce([self._present(n, rows) for n in self._has]).sum()) if self._has else 0

    def begin_round(self, round: int) -> None:
        if self._overwrote:
            raise RuntimeError(
                "an interrupted round had already changed stored private states, which an "
                "in-memory store cannot undo; resume the run from its checkpoint (--resume RUN_DIR)"
            )
        rows = self._rows_of(np.fromiter(self._created, dtype=np.int64, count=len(self._created)))
        for has in self._has.values():
            has[rows[(rows >= 0) & (rows < len(has))]] = False
        self._created, self._in_round = set(), True

    def prepare(self, round: int) -> None:
        pass

    def commit(self) -> None:
        self._created, self._overwrote, self._in_round = set(), False, False

    def snapshot(self, *, copy: bool = True) -> dict:
        """Every stored state, compactly: ``{"format": "compact", "params": {name: {"clients": ids, "values":
        [len(ids), ...]}}}``, clients in row order, so that :meth:`restore` gives them the same rows back.
        ``copy=False`` (a checkpoint written at once) avoids copying where it can."""
        params = {}
        for name in self._has:
            ids, rows = self._clients_with(name)
            params[name] = {"clients": torch.from_numpy(ids), "values": self._snapshot_rows(name, rows, copy)}
        return {"format": "compact", "params": params}

    def _snapshot_rows(self, name: str, rows: np.ndarray, copy: bool) -> torch.Tensor:
        col = self._cols[name]
        if np.array_equal(rows, np.arange(len(rows))):  # every row from row 0 holds one: a slice
            return col[: len(rows)].clone() if copy else col[: len(rows)]
        return col.index_select(0, torch.from_numpy(rows))

    def restore(self, snapshot) -> None:
        """Restore what :meth:`snapshot` (or a :class:`MemoryStore`'s ``{cid: state}``) held."""
        self._clear_tables()
        self._row, self._rows = np.full(0, -1, dtype=np.int64), 0
        self._created, self._overwrote, self._in_round = set(), False, False
        if isinstance(snapshot, dict) and snapshot.get("format") == "compact":
            for name, part in snapshot["params"].items():
                cids = loaded(part["clients"]).numpy()
                for start, vals in _row_blocks(part["values"]):
                    self.save_block(cids[start : start + len(vals)], {name: vals})
        else:
            for cid, state in (snapshot or {}).items():
                self.save(int(cid), state)
        self.commit()


def _empty_table(shape: tuple, dtype: torch.dtype, pin_memory: bool) -> torch.Tensor:
    """An uninitialised table, page-locked if asked and the system grants it (a container may cap locked memory):
    pageable memory only makes a GPU's copies slower, so a refusal is no reason to stop a run."""
    if pin_memory:
        try:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        except RuntimeError:
            pass
    return torch.empty(shape, dtype=dtype)


def _row_blocks(values):
    """``(first row, rows)`` of a snapshot's values: a tensor whole; a table left in the checkpoint's file
    (:class:`StoredTensor`) a block of rows at a time, so a resumed run never holds it whole."""
    if not isinstance(values, StoredTensor):
        yield 0, values
        return
    n = values.shape[0]
    per_block = rows_per_block(bytes_of(values.shape[1:], values.dtype))
    for start in range(0, n, per_block):
        yield start, values.rows(start, min(n, start + per_block))


def _is_rows_of(vals: torch.Tensor, col: torch.Tensor, rows: np.ndarray) -> bool:
    """Whether ``vals`` is ``col``'s own contiguous range ``rows`` (a :meth:`CompactStore.view_block` view)."""
    return (
        vals.dtype == col.dtype
        and vals.is_contiguous()
        and len(rows) == len(vals)
        and len(vals) > 0
        and np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows)))
        and vals.data_ptr() == col[int(rows[0])].data_ptr()
    )


class DiskStore:
    """One ``<cid>.pt`` file per client under ``root/clients``; a round's writes go to ``root/pending``."""

    kind = "disk"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.clients_dir = self.root / "clients"
        self.pending_dir = self.root / "pending"
        make_dirs(self.clients_dir)
        make_dirs(self.pending_dir)

    def _file(self, folder: Path, cid: int) -> Path:
        return folder / f"{int(cid)}.pt"

    def load(self, cid: int) -> State | None:
        for folder in (self.pending_dir, self.clients_dir):
            f = self._file(folder, cid)
            if f.exists():
                try:  # weights_only: tensors only, a file planted here cannot run code
                    return torch.load(f, map_location="cpu", weights_only=True)
                except Exception as exc:  # a truncated or foreign file: say which one
                    raise RunFolderError(
                        str(f), f"private state file is unreadable ({exc})", "start a new run in another folder"
                    ) from None
        return None

    def save(self, cid: int, state: State, *, copy: bool = True) -> None:
        # clone so that a view into a large batched tensor does not serialise the whole storage
        atomic_torch_save(
            {k: v.detach().clone().contiguous() for k, v in state.items()}, self._file(self.pending_dir, cid)
        )

    def __contains__(self, cid) -> bool:
        return self._file(self.pending_dir, cid).exists() or self._file(self.clients_dir, cid).exists()

    def __len__(self) -> int:
        names = {p.name for p in self.clients_dir.glob("*.pt")} | {p.name for p in self.pending_dir.glob("*.pt")}
        return len(names)

    def begin_round(self, round: int) -> None:
        shutil.rmtree(self.pending_dir, ignore_errors=True)
        make_dirs(self.pending_dir)

    def prepare(self, round: int) -> None:
        """Mark the pending layer complete for ``round`` (written before the round's checkpoint)."""
        atomic_write_text(self.pending_dir / "READY", str(int(round)))

    def commit(self) -> None:
        for f in sorted(self.pending_dir.glob("*.pt")):
            os.replace(f, self.clients_dir / f.name)
        (self.pending_dir / "READY").unlink(missing_ok=True)

    def recover(self, checkpoint_round: int) -> None:
        """After a restart: finish a commit whose checkpoint was written, discard an unfinished round."""
        marker = self.pending_dir / "READY"
        if marker.exists() and int(marker.read_text().strip() or -1) == int(checkpoint_round):
            self.commit()
        else:
            self.begin_round(checkpoint_round + 1)

    def snapshot(self) -> None:
        return None  # the folder itself is the state

    def restore(self, snapshot) -> None:
        if snapshot is not None:
            raise ValueError("DiskStore keeps its state in its folder; it cannot restore an in-memory snapshot")


def load_block(store, cids, names) -> dict[str, tuple[torch.Tensor | None, np.ndarray]]:
    """``store``'s values of ``names`` for the clients ``cids``, stacked (see :meth:`CompactStore.load_block`);
    stores without a block read are read client by client."""
    if hasattr(store, "load_block"):
        return store.load_block(cids, names)
    states = [store.load(int(c)) for c in cids]
    out = {}
    for name in names:
        mask = np.array([st is not None and name in st for st in states], dtype=bool)
        if not mask.any():
            out[name] = (None, mask)
            continue
        first = states[int(np.flatnonzero(mask)[0])][name]
        vals = torch.zeros((len(states),) + tuple(first.shape), dtype=first.dtype)
        for c in np.flatnonzero(mask):
            vals[c] = states[c][name]
        out[name] = (vals, mask)
    return out


def save_block(store, cids, block: dict[str, torch.Tensor]) -> None:
    """Store row ``c`` of each ``block[name]`` as client ``cids[c]``'s state (client by client where the store
    has no block write; the rows are handed over, not copied)."""
    if hasattr(store, "save_block"):
        store.save_block(cids, block)
        return
    for c, cid in enumerate(np.asarray(cids).tolist()):
        store.save(cid, {k: v[c] for k, v in block.items()}, copy=False)


def make_store(kind: str, root: str | os.PathLike | None = None):
    if kind == "memory":
        return CompactStore()
    if kind == "disk":
        if root is None:
            raise ValueError("a disk private-state store needs a folder (pass --out RUN_DIR)")
        return DiskStore(root)
    raise ValueError(f"unknown private store {kind!r} (memory, disk)")
