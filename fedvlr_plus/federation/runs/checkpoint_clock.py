"""When ``--checkpoint-every auto`` (the default) writes a run's checkpoint.

A checkpoint is cheap for a small model and dear for a large population with the FedVLR layer: it holds every
client's private state (61 MB a round on a 1,858-user set, flushed and hashed; a fifth of such a run's time when
written every round). ``auto`` writes one after the first round, which measures what a checkpoint costs, then as
soon as the time since the last one is at least ``1 / AUTO_SHARE - 1`` times that cost, so that writing stays
near ``AUTO_SHARE`` of the run's time. Where a checkpoint is small beside a round, that is every round. A crash
loses at most about twenty checkpoints' worth of time, and a resumed run repeats the rounds after the last
checkpoint with the same numbers, so the results never depend on when checkpoints were written.
"""

from __future__ import annotations

import time

#: the share of a run's time that --checkpoint-every auto lets checkpoints take
AUTO_SHARE = 0.05


class CheckpointClock:
    """The time of the last checkpoint and what it cost to write."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.cost: float | None = None  # seconds the last checkpoint took (None: none written by this process)
        self.last_end: float | None = None

    def due(self) -> bool:
        """Whether enough time has passed since the last checkpoint (always true before the first)."""
        if self.cost is None or self.last_end is None:
            return True
        return self.clock() - self.last_end >= self.cost * (1.0 / AUTO_SHARE - 1.0)

    def timed(self, write) -> None:
        """Call ``write()`` and remember its cost."""
        start = self.clock()
        write()
        self.last_end = self.clock()
        self.cost = self.last_end - start
