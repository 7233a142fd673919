"""A run's model as it stood at one round, kept aside and put back later.

A run reports test figures at its selected (best-validation) round only. Evaluating test at every validation
improvement, as the round happens, costs one or two full test passes per improvement, and early in a run nearly
every evaluation improves. Keeping the model of the best round instead (the shared state, the server strategy's
state, every client's private state) and evaluating test once at the end gives the same figures for a fraction of
the evaluation time. Private states held in files are kept in a file (:class:`~..state.kept.KeptStates`), so
that the copy never holds the whole population in memory.
"""

from __future__ import annotations

from pathlib import Path

from ..state.file_store import FileStore
from ..state.kept import KeptStates


class KeptRound:
    """The model of ``run`` (a :class:`~..engine.FederatedRun`) as it is now. ``aside``: a folder for private
    states held in files."""

    def __init__(self, run, aside: Path):
        self.shared = {k: v.clone() for k, v in run.shared.items()}
        self.strategy = run.strategy.state_dict()
        if isinstance(run.store, FileStore):
            self.private = KeptStates(run.store, Path(aside) / f"kept-{id(self)}.safetensors")
        else:
            self.private = run.store.snapshot()
            if isinstance(self.private, dict) and self.private.get("format") != "compact":
                # a MemoryStore's snapshot shares its states' tensors: copy them, the run trains on
                self.private = {c: {k: v.clone() for k, v in s.items()} for c, s in self.private.items()}

    @staticmethod
    def can_keep(run) -> bool:
        """Whether ``run``'s private states can be kept aside (a DiskStore's folder is its state)."""
        return run.store.kind != "disk"

    def put_back(self, run) -> None:
        """Put this model back into ``run`` (what it held since is dropped)."""
        run.shared = self.shared
        run.strategy.load_state_dict(self.strategy)
        if isinstance(self.private, KeptStates):
            self.private.restore_into(run.store)
        else:
            run.store.restore(self.private)

    def to_state(self) -> dict | None:
        """This model as a checkpoint holds it, or None where its private states are in a file of their own."""
        if isinstance(self.private, KeptStates):
            return None
        return {"shared": self.shared, "strategy": self.strategy, "private": self.private}

    @classmethod
    def from_state(cls, state: dict) -> KeptRound:
        """The model :meth:`to_state` gave, read back from a checkpoint."""
        kept = cls.__new__(cls)
        kept.shared, kept.strategy, kept.private = state["shared"], state["strategy"], state["private"]
        return kept

    def discard(self) -> None:
        """Free what the kept model holds on disk (its file of private states, if any)."""
        if isinstance(self.private, KeptStates):
            self.private.path.unlink(missing_ok=True)
