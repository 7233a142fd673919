"""What the backbones' closed-form chunk steps share (:mod:`.fedncf_steps`, :mod:`.fedrap_steps`).

A step reads its examples' rows from the chunk's own tables by their flat ids and keeps its ``[C, L, k]``
intermediates in buffers the simulator reuses across steps and chunks: a fresh tensor of that size is new memory
each time, whose first writes cost a page fault every 4 KB. The simulator consumes a step's gradients before the
next step, so they may live in those buffers too.
"""

from __future__ import annotations

import torch


class ChunkSteps:
    """The base of a chunk's steps: ``scratch``, the simulator's buffers (``get(name, shape, dtype, device)``;
    None: fresh tensors), with names kept apart by ``prefix``."""

    prefix = "steps"

    def __init__(self, scratch=None):
        self.scratch = scratch

    def rows(self, shared_table, flat_table, fidx: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """The step's rows are read from the chunk's own tables by their flat ids."""
        return fidx

    def buffer(self, name: str, like: torch.Tensor, shape: tuple) -> torch.Tensor:
        """A buffer of ``shape`` in ``like``'s dtype and device, valid until the next step asks for ``name``."""
        if self.scratch is None:
            return torch.empty(shape, dtype=like.dtype, device=like.device)
        return self.scratch.get(f"{self.prefix}.{name}", shape, like.dtype, like.device)

    def gather(self, name: str, table: torch.Tensor, fidx: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Rows ``fidx`` of the flat ``table [C T, k]`` as ``[*like.shape, k]`` (``like``: the step's ``[C, L]``),
        in buffer ``name``."""
        out = self.buffer(name, like, (*like.shape, table.shape[-1]))
        torch.index_select(table, 0, fidx, out=out.view(-1, table.shape[-1]))
        return out

    def finish(self, p: dict, acc: dict | None = None) -> None:
        """Nothing is deferred: every gradient was applied or accumulated step by step."""
