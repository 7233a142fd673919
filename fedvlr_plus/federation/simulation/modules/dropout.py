"""Dropout inside a ``vmap`` over clients and rows, with the masks each client draws when it trains alone.

Alone, a module client seeds torch's CPU generator from (seed, round, client) and every ``F.dropout`` of the
model's forward draws ``bernoulli(1 - p)`` over its whole input ``[rows, ...]`` (then scales by ``1 / (1 - p)``).
Here every client has its own ``torch.Generator`` seeded the same way; at the k-th dropout call of a step each
client draws the mask of the shape it would draw alone, in the same order, and each (client, row) lane of the
``vmap`` multiplies its input by its row of that mask. The draws run outside functorch (they are plain tensors,
not per-lane random calls, which ``vmap`` refuses).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F


class LaneDropout(contextlib.AbstractContextManager):
    """``F.dropout`` replaced while inside; ``seeds``: a function giving the torch seed of each client of the chunk;
    ``lane`` =
    (client index, row index) of the lane being traced."""

    def __init__(self, seeds, n_clients: int):
        self.seeds = seeds  # () -> one seed per client, asked at the first draw
        self.generators: list[torch.Generator] | None = None  # (most models never draw)
        self.rows = np.zeros(n_clients, dtype=np.int64)
        self.lane = None
        self.masks: list[torch.Tensor] = []
        self.calls = 0
        self._saved = None

    def step(self, rows: np.ndarray) -> LaneDropout:
        """Start a local step whose clients have ``rows`` rows: the next calls draw fresh masks."""
        self.rows, self.masks, self.calls = rows, [], 0
        return self

    def __enter__(self):
        self._saved = F.dropout
        F.dropout = self
        return self

    def __exit__(self, *exc):
        F.dropout = self._saved
        return False

    def __call__(self, input, p: float = 0.5, training: bool = True, inplace: bool = False):
        if not training or p == 0.0:
            return input
        if p == 1.0:  # torch zeroes without drawing (the generator does not move)
            return input * 0.0
        if self.lane is None or input.dim() < 1 or input.shape[0] != 1:
            raise RuntimeError("dropout outside a one-row lane: its masks cannot match the one-at-a-time client's")
        if self.calls == len(self.masks):
            self.masks.append(self._draw(float(p), tuple(input.shape[1:]), input.dtype))
        mask = self.masks[self.calls]
        self.calls += 1
        c, r = self.lane
        # index_select, not mask[c, r]: a 0-d lane index would be read as a Python int
        row = mask.index_select(0, c.reshape(1)).index_select(1, r.reshape(1))
        return input * row.reshape(input.shape)

    def _draw(self, p: float, rest: tuple, dtype) -> torch.Tensor:
        r_max = max(1, int(self.rows.max()))
        if self.generators is None:
            self.generators = [torch.Generator().manual_seed(int(s)) for s in self.seeds()]
        with torch._C._DisableFuncTorch():
            out = torch.zeros((len(self.generators), r_max) + rest, dtype=dtype)
            for c, g in enumerate(self.generators):
                n = int(self.rows[c])
                if n:
                    noise = torch.empty((n,) + rest, dtype=dtype).bernoulli_(1.0 - p, generator=g)
                    out[c, :n] = noise.div_(1.0 - p)
        return out
