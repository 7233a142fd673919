"""Per-client private state: named tensors that never leave the client, kept between rounds.

Two stores with one protocol:

- :class:`MemoryStore` keeps every client's state in a dict (simulation);
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


def make_store(kind: str, root: str | os.PathLike | None = None):
    if kind == "memory":
        return MemoryStore()
    if kind == "disk":
        if root is None:
            raise ValueError("a disk private-state store needs a folder (pass --out RUN_DIR)")
        return DiskStore(root)
    raise ValueError(f"unknown private store {kind!r} (memory, disk)")
