"""What the backbones' closed-form chunk steps share (:mod:`.fedncf_steps`, :mod:`.fedrap_steps`).

A step reads its examples' rows from the chunk's own tables by their flat ids and keeps its ``[C, L, k]``
intermediates in buffers the simulator reuses across steps and chunks: a fresh tensor of that size is new memory
each time, whose first writes cost a page fault every 4 KB. The simulator consumes a step's gradients before the
next step, so they may live in those buffers too.
"""

from __future__ import annotations

from inspect import getattr_static

import torch


def keeps_shared_fixed(config: dict) -> bool:
    """Whether a round under ``config`` keeps the shared parameters fixed on the client: its clients upload
    gradients and do not step the shared parts locally (the FedVLR layer's default, Algorithm 1). Steps written
    for such a round may read the broadcast tables in place and defer their gradient to the end; steps written for
    the other rounds (:func:`steps_shared`) update each client's copy."""
    return config.get("upload", "params") == "grads" and not config.get("local_shared", False)


def steps_shared(config: dict) -> bool:
    """Whether a round under ``config`` steps each client's copy of the shared parameters (parameter uploads, or
    gradient uploads with local steps): the rounds the backbones' own steps cover."""
    return not keeps_shared_fixed(config)


def runs_forward_of(backbone, cls: type, names: tuple[str, ...]) -> bool:
    """Whether ``backbone`` (an instance of ``cls`` or of a subclass) keeps ``cls``'s own methods ``names``: a
    closed form written for ``cls`` holds only then (a subclass that changes its forward trains by autograd)."""
    return isinstance(backbone, cls) and all(getattr_static(type(backbone), n) is getattr_static(cls, n) for n in names)


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
