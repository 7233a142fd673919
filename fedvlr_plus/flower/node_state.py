"""A node's private states on its own disk: the simulator's store (:class:`~fedvlr_plus.federation.state.store.
CompactStore`) written as one file after every local training and read back when a ClientApp process starts.

Flower 1.42 starts one ClientApp process per message, so the store a round trained lives only as long as that
process; the file carries it to the next message (the round's evaluation, the next round) and across a restart of
the SuperNode. It is written atomically (a kill leaves the previous round's file whole) and never enters a message.
A journal beside it records what the node did (``fit-start``, ``saved``, ``restore``, ``fit-done``) for drills.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from ..federation.state.store import CompactStore, atomic_torch_save

STATE_FORMAT = 2


def file_digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class NodeStateFile:
    """``private-<stem>.pt`` (the store's snapshot and the round it ends) and ``journal-<stem>.jsonl``."""

    def __init__(self, folder: Path, stem: str):
        self.path = Path(folder) / f"private-{stem}.pt"
        self.journal = Path(folder) / f"journal-{stem}.jsonl"
        self.digest: str | None = None  # of the file this process last wrote or read (None: none yet)
        self.round = 0

    def log(self, event: str, **fields) -> None:
        entry = {"time": time.time(), "pid": os.getpid(), "event": event, **fields}
        with open(self.journal, "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def restore_into(self, store) -> None:
        """Put the file's states into ``store`` unless this process already holds them (it wrote or read that
        very file); a missing file is a node that has not trained yet."""
        if not self.path.exists():
            return
        blob = self.path.read_bytes()
        digest = hashlib.sha256(blob).hexdigest()
        if digest == self.digest:
            return
        try:
            obj = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise RuntimeError(f"private state file {self.path} is unreadable: {exc}") from exc
        if not isinstance(obj, dict) or obj.get("format") != STATE_FORMAT:
            raise RuntimeError(f"{self.path}: not a private state file of format {STATE_FORMAT}")
        _compact(store).restore(obj["store"])
        self.digest, self.round = digest, int(obj["round"])
        self.log("restore", source="file", round=self.round, sha256=digest)

    def save(self, store, round_index: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        snapshot = _compact(store).snapshot(copy=False)
        atomic_torch_save({"format": STATE_FORMAT, "round": int(round_index), "store": snapshot}, self.path)
        self.digest, self.round = file_digest(self.path), int(round_index)
        self.log("saved", round=int(round_index), sha256=self.digest)


def _compact(store) -> CompactStore:
    if not isinstance(store, CompactStore):
        raise ValueError(
            f"private-store {store.kind!r}: a Flower node keeps its users' states in memory or files "
            "(private-store memory, file or auto) and writes them to its state folder each round"
        )
    return store


def read_states(path) -> tuple[int, dict[int, dict[str, torch.Tensor]]]:
    """``(round, {user: {name: tensor}})`` of a node's state file (the tests and audits read it this way)."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    store = CompactStore()
    store.restore(obj["store"])
    users = sorted({int(c) for part in obj["store"]["params"].values() for c in part["clients"].tolist()})
    return int(obj["round"]), {u: store.load(u) for u in users}


def process_started_at() -> float | None:
    """When this process started (seconds since the epoch; Linux ``/proc``), else None."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")
