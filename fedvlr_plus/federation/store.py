"""Per-client private state: named tensors that never leave the client, kept between rounds.

Three stores with one protocol:

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

from ..atomic_write import atomic_write, atomic_write_text, make_dirs
from ..errors import RunFolderError

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
    """Every client's private state as one tensor per parameter, ``[capacity, *shape]``, indexed by client id.

    Writes go straight into those tensors: a second copy of all states for a pending layer would double the
    memory of a large population. What a round writes is therefore published at once; ``begin_round`` can still
    discard the rows of clients that the unfinished round created, and refuses (``RuntimeError``) when it had
    already overwritten stored states, which only the run's checkpoint can bring back. A write outside a round
    (between ``commit`` and the next ``begin_round``) is simply stored. ``load`` returns copies.
    """

    kind = "memory"

    def __init__(self, capacity: int = 0):
        # the population size where known: the tables are made that large at once instead of growing by doubling
        # (a table grown past the last client id would be up to twice the states' bytes, plus a copy while it grows)
        self.capacity = int(capacity)
        self._cols: dict[str, torch.Tensor] = {}
        self._has: dict[str, np.ndarray] = {}
        self._in_round = False                # between begin_round and commit
        self._created: set[int] = set()       # clients first written by the uncommitted round
        self._overwrote = False               # the uncommitted round changed stored states

    # ------------------------------------------------------------------ one client
    def load(self, cid: int) -> State | None:
        cid = int(cid)
        out = {k: col[cid].clone() for k, col in self._cols.items() if cid < len(self._has[k]) and self._has[k][cid]}
        return out or None

    def save(self, cid: int, state: State, *, copy: bool = True) -> None:
        self.save_block(np.array([int(cid)]), {k: v.detach().unsqueeze(0) for k, v in state.items()})

    # ------------------------------------------------------------------ a block of clients
    def load_block(self, cids, names) -> dict[str, tuple[torch.Tensor | None, np.ndarray]]:
        """``{name: (values [C, ...] with zeros where absent, present mask [C])}``; values are copies."""
        cids = np.asarray(cids, dtype=np.int64)
        out = {}
        for name in names:
            col, has = self._cols.get(name), self._has.get(name)
            if col is None:
                out[name] = (None, np.zeros(len(cids), dtype=bool))
                continue
            inside = cids < len(has)
            mask = np.zeros(len(cids), dtype=bool)
            mask[inside] = has[cids[inside]]
            idx = torch.from_numpy(np.where(mask, cids, 0))
            vals = col.index_select(0, idx)
            if not mask.all():
                vals[torch.from_numpy(~mask)] = 0
            out[name] = (vals, mask)
        return out

    def save_block(self, cids, block: dict[str, torch.Tensor]) -> None:
        """Store row ``c`` of every ``block[name]`` as client ``cids[c]``'s value of ``name``."""
        cids = np.asarray(cids, dtype=np.int64)
        if not len(cids):
            return
        top = int(cids.max()) + 1
        for name, vals in block.items():
            self._reserve(name, vals, top)
            has = self._has[name]
            if self._in_round:
                self._overwrote |= bool(has[cids].any())
                self._created.update(int(c) for c in cids[~has[cids]])
            self._cols[name].index_copy_(0, torch.from_numpy(cids), vals.detach().to(self._cols[name].dtype))
            has[cids] = True

    def _reserve(self, name: str, vals: torch.Tensor, top: int) -> None:
        col = self._cols.get(name)
        if col is not None and tuple(col.shape[1:]) != tuple(vals.shape[1:]):
            raise ValueError(f"private state {name!r}: shape {tuple(vals.shape[1:])} does not match the stored "
                             f"{tuple(col.shape[1:])}")
        if col is not None and len(col) >= top:
            return
        if col is None:
            cap = max(top, self.capacity)
        else:
            doubled = 2 * len(col)
            cap = max(top, min(doubled, self.capacity) if self.capacity else doubled)
        new = torch.zeros((cap,) + tuple(vals.shape[1:]), dtype=vals.dtype if col is None else col.dtype)
        has = np.zeros(cap, dtype=bool)
        if col is not None:
            new[:len(col)] = col
            has[:len(col)] = self._has[name]
        self._cols[name], self._has[name] = new, has

    # ------------------------------------------------------------------ the store protocol
    def __contains__(self, cid) -> bool:
        cid = int(cid)
        return any(cid < len(h) and h[cid] for h in self._has.values())

    def __len__(self) -> int:
        if not self._has:
            return 0
        width = max(len(h) for h in self._has.values())
        return int(np.logical_or.reduce([np.pad(h, (0, width - len(h))) for h in self._has.values()]).sum())

    def begin_round(self, round: int) -> None:
        if self._overwrote:
            raise RuntimeError("an interrupted round had already changed stored private states, which an "
                               "in-memory store cannot undo; resume the run from its checkpoint (--resume RUN_DIR)")
        cids = np.fromiter(self._created, dtype=np.int64, count=len(self._created))
        for has in self._has.values():
            has[cids[cids < len(has)]] = False
        self._created, self._in_round = set(), True

    def prepare(self, round: int) -> None:
        pass

    def commit(self) -> None:
        self._created, self._overwrote, self._in_round = set(), False, False

    def snapshot(self, *, copy: bool = True) -> dict:
        """Every stored state, compactly: ``{"format": "compact", "params": {name: {"clients": ids, "values":
        [len(ids), ...]}}}``. ``copy=False`` (a checkpoint written at once) avoids copying where it can."""
        params = {}
        for name, col in self._cols.items():
            ids = np.flatnonzero(self._has[name])
            if len(ids) == len(col) or (len(ids) and ids[-1] == len(ids) - 1):   # clients 0..n-1: a slice
                vals = col[:len(ids)]
                vals = vals.clone() if copy else vals
            else:
                vals = col.index_select(0, torch.from_numpy(ids))
            params[name] = {"clients": torch.from_numpy(ids), "values": vals}
        return {"format": "compact", "params": params}

    def restore(self, snapshot) -> None:
        """Restore what :meth:`snapshot` (or a :class:`MemoryStore`'s ``{cid: state}``) held."""
        self._cols, self._has = {}, {}
        self._created, self._overwrote, self._in_round = set(), False, False
        if isinstance(snapshot, dict) and snapshot.get("format") == "compact":
            for name, part in snapshot["params"].items():
                self.save_block(part["clients"].numpy(), {name: part["values"]})
        else:
            for cid, state in (snapshot or {}).items():
                self.save(int(cid), state)
        self.commit()


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
                    raise RunFolderError(str(f), f"private state file is unreadable ({exc})",
                                         "start a new run in another folder") from None
        return None

    def save(self, cid: int, state: State, *, copy: bool = True) -> None:
        # clone so that a view into a large batched tensor does not serialise the whole storage
        atomic_torch_save({k: v.detach().clone().contiguous() for k, v in state.items()},
                          self._file(self.pending_dir, cid))

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
